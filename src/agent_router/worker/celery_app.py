"""The standalone Celery app and its reliability configuration.

Run a worker with ``agent-router worker`` or ``celery -A agent_router.celery_app worker``.
A host with its own Celery app instead adds ``include=["agent_router.tasks"]`` (the tasks are
``shared_task``\\ s) and applies :func:`celery_config` (or its own equivalent) to its app.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

from agent_router.constants import SWEEP, SWEEP_SCHEDULE_ENTRY
from agent_router.settings import Settings

logger = logging.getLogger(__name__)

#: How often an idle in-process (``memory://``) consumer looks for work. Kombu's default of one
#: second would add up to a second to every turn start in the embedded mode.
MEMORY_POLLING_SECONDS = 0.02


def celery_config(settings: Settings) -> dict[str, Any]:
    """The configuration the router's guarantees rely on, one reason per line."""
    transport_options: dict[str, Any] = {
        # Redis (and SQS) redeliver an unacknowledged message after this long. With late acks a
        # turn is acknowledged only when it ends, so this must outlast the longest turn plus its
        # lease, or a healthy long turn would be delivered a second time (harmless, since turns
        # are fenced, but noisy).
        "visibility_timeout": int(settings.max_turn_seconds + settings.lease_seconds) + 60,
    }
    if settings.broker_url.startswith("memory://"):
        transport_options["polling_interval"] = MEMORY_POLLING_SECONDS
    return {
        # JSON only: task arguments are ids, and no message can ever unpickle code in a worker.
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "event_serializer": "json",
        # The outcome of a turn is in the database (turns, ledger); results would be dead weight.
        "task_ignore_result": True,
        # Acknowledge a turn task after it ran, not when it was received: a worker that dies
        # mid-turn leaves the message on the broker to be redelivered.
        "task_acks_late": True,
        # ... including when the worker process is killed (OOM, SIGKILL), not only on a crash.
        "task_reject_on_worker_lost": True,
        # A worker reserves one message per free slot: a long turn never sits on queued turns
        # that another worker could start now.
        "worker_prefetch_multiplier": 1,
        # Task events (received/started/succeeded, and sent by the publisher) so that Flower and
        # `celery events` see every turn.
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "broker_transport_options": transport_options,
        # Our tasks go to our queue, whatever the host's default queue is.
        "task_routes": {"agent_router.*": {"queue": settings.queue}},
        # A publish to a broker that is down fails fast instead of stalling `send()`: the turn
        # task is in the outbox (committed), and the sweeper publishes it once the broker is back.
        "task_publish_retry_policy": {
            "max_retries": 1,
            "interval_start": 0.1,
            "interval_step": 0.2,
            "interval_max": 0.2,
        },
        "broker_connection_timeout": 2.0,
        # A worker that starts before the broker keeps retrying instead of exiting.
        "broker_connection_retry_on_startup": True,
        # On a lost broker connection keep running turns: their messages are redelivered, and
        # the redelivered copy is refused by the turn fence while the original finishes.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # Background jobs (Router.track_background) store their result so that the sweeper's
        # poller can report a job whose link callback was lost. Our own tasks still ignore
        # results (above); only a job started with ignore_result=False writes one. With a Redis
        # broker the same Redis holds them; with memory:// there is no backend, and a lost
        # callback is then reported only if the job's task reports itself.
        **_result_backend(settings),
        # The sweeper, for `celery beat` (see beat_schedule).
        "beat_schedule": beat_schedule(settings),
    }


#: How long a background job's result stays in the result backend for the poller to read.
RESULT_EXPIRES_SECONDS = 24 * 3600


def _result_backend(settings: Settings) -> dict[str, Any]:
    if settings.broker_url.startswith(("redis://", "rediss://")):
        return {"result_backend": settings.broker_url, "result_expires": RESULT_EXPIRES_SECONDS}
    return {}


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """The standalone beat schedule: one sweeper pass every ``Settings.sweep_seconds``.

    A pass that could not start before the next one is due is dropped (``expires``) rather than
    piling up behind a stopped worker; every pass is idempotent, so two at once are harmless."""
    return {
        SWEEP_SCHEDULE_ENTRY: {
            "task": SWEEP,
            "schedule": settings.sweep_seconds,
            "options": {"expires": max(settings.sweep_seconds, 1.0), "queue": settings.queue},
        }
    }


def create_app(settings: Settings | None = None, *, main: str = "agent_router") -> Celery:
    """A Celery app for ``settings`` with :func:`celery_config` applied and our tasks included.

    It is not made the process's current app: our code never relies on ``current_app``."""
    settings = settings or Settings()
    broker = settings.broker_url
    if broker == "memory://":
        broker = "memory://localhost/"  # the same broker; kombu warns about a missing host
    app = Celery(
        main,
        broker=broker,
        include=["agent_router.tasks"],
        set_as_current=False,
    )
    app.conf.update(celery_config(settings))
    # So that a bare `celery -A agent_router.celery_app worker` consumes our queue.
    app.conf.task_default_queue = settings.queue
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
