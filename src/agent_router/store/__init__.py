"""The only package that talks to the database."""

from agent_router.settings import Settings
from agent_router.store.engine import make_engine
from agent_router.store.models import utcnow
from agent_router.store.postgres import PostgresStore
from agent_router.store.reads import Reads
from agent_router.store.sqlite import SqliteStore
from agent_router.store.store import Store
from agent_router.store.values import (
    AfterCall,
    Ask,
    BeforeCall,
    CallUsage,
    FirstCall,
    NewAgent,
    Result,
    SendRequest,
    Since,
)


def open_store(settings: Settings) -> Store:
    """The store for ``settings.database_url``: the PostgreSQL functions' or SQLite's."""
    return SqliteStore(settings) if settings.is_sqlite else PostgresStore(settings)


__all__ = [
    "AfterCall",
    "Ask",
    "BeforeCall",
    "CallUsage",
    "FirstCall",
    "NewAgent",
    "PostgresStore",
    "Reads",
    "Result",
    "SendRequest",
    "Since",
    "SqliteStore",
    "Store",
    "make_engine",
    "open_store",
    "utcnow",
]
