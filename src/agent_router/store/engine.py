"""The database engine, set up for the store's locking (SQLite: ``BEGIN IMMEDIATE``)."""

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
        settings.database_url, pool_size=settings.pool_size, max_overflow=settings.pool_size
    )
    event.listen(engine, "checkout", _closed_by_server_check)
    return engine


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
