"""The database engine, set up for the store's locking (SQLite: ``BEGIN IMMEDIATE``)."""

from __future__ import annotations

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
    return sa.create_engine(
        settings.database_url,
        pool_size=settings.pool_size,
        max_overflow=settings.pool_size,
        pool_pre_ping=True,
    )
