""":func:`install`, which wires the router into a host's Celery app, and the standalone app of
``celery -A agent_router.celery_app worker``. The app's configuration (:func:`create_app`) and
the publisher of a ``Router`` given none live in :mod:`agent_router.broker`.

Run a worker with ``agent-router worker`` or ``celery -A agent_router.celery_app worker``.
A host with its own Celery app calls :func:`install` instead: the reliability options the
router needs (late acks, reject on worker lost, ignore result, JSON) are options of its own
tasks, so nothing app-wide changes; ``install`` only adds what the host's app lacks (a route for
``agent_router.*``, the sweeper's beat entry, the tasks, the worker's sweeper step).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from celery import Celery

from agent_router.broker import beat_schedule, create_app, routes
from agent_router.settings import Settings

logger = logging.getLogger(__name__)


def install(app: Celery, settings: Settings | None = None) -> Celery:
    """Wire the router into a host's Celery ``app`` without changing anything of the host's.

    It merges, never replaces: the route ``agent_router.* -> Settings.queue`` goes in front of
    the host's ``task_routes`` (its own routes still decide every other task), the sweeper's beat
    entry is added to the host's schedule unless one of that name is there, the router's tasks
    are registered, and each worker of the app runs the sweeper on a timer. App-wide defaults
    (acks, results, serializers, prefetch, transport options) are left as the host set them.
    Idempotent; returns ``app``."""
    settings = settings or Settings()
    # Importing the tasks registers them (shared tasks) with every app, this one included.
    importlib.import_module("agent_router.tasks")
    from agent_router.worker import bootstep

    ours = routes(settings)
    current = app.conf.task_routes
    if current is None or current == {}:
        app.conf.update(task_routes=ours)
    elif isinstance(current, dict):
        if ours.keys() - current.keys():
            app.conf.update(task_routes={**ours, **current})
    else:
        existing = tuple(current) if isinstance(current, (list, tuple)) else (current,)
        if ours not in existing:
            app.conf.update(task_routes=(ours, *existing))
    schedule = dict(app.conf.beat_schedule or {})
    for name, entry in beat_schedule(settings).items():
        schedule.setdefault(name, entry)
    app.conf.beat_schedule = schedule
    bootstep.install(app)
    return app


def __getattr__(name: str) -> Any:
    """``app``: the app of ``celery -A agent_router.celery_app worker``, configured from
    AGENT_ROUTER_* variables. Built on first access (PEP 562) rather than at import, so that
    importing this module (the CLI does) never fails on a bad variable: the command that needs
    the settings reports it as one line."""
    if name == "app":
        from agent_router.worker import bootstep

        built = create_app()
        bootstep.install(built)  # as `agent-router worker` does
        return globals().setdefault("app", built)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
