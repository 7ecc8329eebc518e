"""The only package that talks to the database."""

from agent_router.store.models import utcnow
from agent_router.store.store import Effects, SendRequest, Store, make_engine

__all__ = ["Effects", "SendRequest", "Store", "make_engine", "utcnow"]
