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
from typing import Any

from celery import Celery

from agent_router.broker import beat_schedule, create_app, routes
from agent_router.errors import RouterDisabledError
from agent_router.logfields import get_logger
from agent_router.settings import Settings
from agent_router.worker import hosting

logger = get_logger(__name__)


def install(app: Celery, settings: Settings | None = None) -> Celery:
    """Wire the router into a host's Celery ``app`` without changing anything of the host's.

    It merges, never replaces: the route ``agent_router.* -> Settings.queue`` goes in front of
    the host's ``task_routes`` (its own routes still decide every other task), the sweeper's beat
    entry is added to the host's schedule unless one of that name is there, the router's tasks
    are registered, and each worker of the app runs the sweeper on a timer. App-wide defaults
    (acks, results, serializers, prefetch, transport options) are left as the host set them.

    Given no ``settings``, it reads ``AGENT_ROUTER_*`` variables (:func:`hosting.host_settings`):
    when one is invalid, or ``AGENT_ROUTER_DATABASE_URL`` is not set, the router is off in this
    process, logged once as one WARNING line naming the variable and what it accepts, and nothing
    of the host's app changes but the registered tasks, which then raise
    :class:`~agent_router.errors.RouterDisabledError`. The host's app, web process and other
    tasks start and run as before. Idempotent; returns ``app``."""
    # Importing the tasks registers them (shared tasks) with every app, this one included.
    importlib.import_module("agent_router.tasks")
    from agent_router.worker import bootstep

    bootstep.install(app)
    if settings is None:
        try:
            settings = hosting.host_settings()
        except RouterDisabledError as exc:
            if hosting.disabled_reason(app) != str(exc):
                logger.warning("%s", exc, extra={"action": "install"})
            app.conf[hosting.DISABLED_KEY] = str(exc)
            return app
    if hosting.disabled_reason(app) is not None:
        app.conf[hosting.DISABLED_KEY] = None
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
