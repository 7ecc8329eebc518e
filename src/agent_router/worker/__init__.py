"""Celery glue: the router's tasks, its standalone app, and :func:`install` for a host's app."""

from agent_router.broker import create_app
from agent_router.worker.celery_app import install

__all__ = ["create_app", "install"]
