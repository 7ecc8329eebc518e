"""The database engine, set up for the store's locking (SQLite: ``BEGIN IMMEDIATE``) and, on
PostgreSQL, for what the server connections between it and the database allow (prepared
statements: the ``database_prepare`` setting)."""

from __future__ import annotations

import select
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine

from agent_router.settings import Settings


def make_engine(settings: Settings) -> Engine:
    if settings.is_sqlite:
        engine = sa.create_engine(
            settings.database_url,
            connect_args={
                "check_same_thread": False,
                "timeout": settings.sqlite_busy_timeout_seconds,
            },
        )
        busy_ms = int(settings.sqlite_busy_timeout_seconds * 1000)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Take transaction control away from pysqlite so that BEGIN IMMEDIATE below is ours.
            dbapi_conn.isolation_level = None
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: sa.Connection) -> None:
            # The write lock up front: two routers can never both read "idle" and both enqueue.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    # No pre-ping: it costs a round trip on every checkout. A connection the server closed
    # (restart, idle timeout, pg_terminate_backend) has its socket readable while idle: that is
    # checked at checkout without a round trip, and the pool replaces the connection. One that
    # dies later, inside a transaction, makes the store run that transaction again
    # (store.faults.retrying).
    engine = sa.create_engine(
        settings.database_url,
        pool_size=settings.pool_size,
        max_overflow=settings.pool_size,
        connect_args=prepare_args(settings),
    )
    event.listen(engine, "checkout", _closed_by_server_check)
    if settings.database_prepare == "auto":
        event.listen(engine, "connect", _prepare_when_direct)
    return engine


#: psycopg's own default: a statement run this many times on a connection is prepared.
PREPARE_THRESHOLD = 5


def prepare_args(settings: Settings) -> dict[str, Any]:
    """psycopg's ``connect()`` arguments for ``settings.database_prepare``. A prepared statement
    lives in one server session; behind a pooler that hands each transaction another server
    connection, the next transaction finds it missing, or another client's statement under the
    same name (``DuplicatePreparedStatement: prepared statement "_pg3_0" already exists``).
    ``auto`` starts with preparing off too, so that nothing is prepared before
    :func:`_prepare_when_direct` decided."""
    if settings.database_prepare == "on":
        return {"prepare_threshold": PREPARE_THRESHOLD}
    return {"prepare_threshold": None}  # psycopg: None never prepares


def _prepare_when_direct(dbapi_conn: Any, _record: Any) -> None:
    if reaches_server_directly(dbapi_conn):
        dbapi_conn.prepare_threshold = PREPARE_THRESHOLD


def reaches_server_directly(dbapi_conn: Any) -> bool:
    """Whether a psycopg connection talks to PostgreSQL itself rather than to a pooler: the
    server process that runs its statements is the one whose id the connection was given at its
    start (the cancel key's process id). A pooler gives each client a key of its own, since a
    cancel request must reach whichever server connection runs that client's statement then
    (PgBouncer in every pooling mode: a random id), so a pooled connection never passes. A plain
    TCP proxy passes, rightly: its client keeps one server session. One round trip, on a new
    connection only; never prepared itself."""
    try:
        server_pid = dbapi_conn.execute("SELECT pg_backend_pid()", prepare=False).fetchone()[0]
    finally:
        dbapi_conn.rollback()
    return bool(server_pid == dbapi_conn.info.backend_pid)


def _closed_by_server_check(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
    if closed_by_server(dbapi_conn):
        raise sa.exc.DisconnectionError("the server closed this pooled connection")


def closed_by_server(dbapi_conn: Any) -> bool:
    """Whether an idle connection is gone: closed or broken on our side, or its socket has
    something to read while no query runs (the server's goodbye, or its end of file)."""
    if getattr(dbapi_conn, "closed", False) or getattr(dbapi_conn, "broken", False):
        return True
    try:
        fd = dbapi_conn.fileno()
    except Exception:  # the driver has no open socket any more
        return True
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


def kill_connections(engine: Engine, application_name: str) -> int:
    """PostgreSQL: terminate the server processes of this database's connections named
    ``application_name`` (the chaos run kills workers' connections this way)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :db AND application_name = :app"
            ),
            {"db": engine.url.database, "app": application_name},
        ).all()
        conn.commit()
    return len(rows)
