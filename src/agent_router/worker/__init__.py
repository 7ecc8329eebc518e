"""Celery glue: the router's tasks, its standalone app, and :func:`install` for a host's app."""

from agent_router.worker.celery_app import create_app, install

__all__ = ["create_app", "install"]
