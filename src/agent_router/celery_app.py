"""``celery -A agent_router.celery_app worker``: the library's standalone Celery app.

Hosts and deployments name this module; the app lives in :mod:`agent_router.worker.celery_app`
and is built on first access, so importing this module never fails on a bad variable."""

from typing import Any

from agent_router.broker import create_app

__all__ = ["create_app"]  # and `app`, built on first access


def __getattr__(name: str) -> Any:
    if name == "app":
        from agent_router.worker import celery_app

        return celery_app.app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
