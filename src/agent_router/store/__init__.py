"""The only package that talks to the database."""

from agent_router.store.engine import make_engine
from agent_router.store.models import utcnow
from agent_router.store.store import Store
from agent_router.store.values import Ask, NewAgent, SendRequest

__all__ = ["Ask", "NewAgent", "SendRequest", "Store", "make_engine", "utcnow"]
