"""The standalone Celery app, :func:`install`, which wires the router into a host's app, and
:class:`BrokerPublisher`, the publisher of a ``Router`` given none.

Run a worker with ``agent-router worker`` or ``celery -A agent_router.celery_app worker``.
A host with its own Celery app calls :func:`install` instead: the reliability options the
router needs (late acks, reject on worker lost, ignore result, JSON) are options of its own
tasks, so nothing app-wide changes; ``install`` only adds what the host's app lacks (a route for
``agent_router.*``, the sweeper's beat entry, the tasks, the worker's sweeper step).
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from agent_router.constants import SWEEP, SWEEP_SCHEDULE_ENTRY, TASK_PREFIX
from agent_router.domain import OutboxEntry
from agent_router.errors import RouterDisabledError
from agent_router.logfields import get_logger
from agent_router.settings import Settings
from agent_router.worker import hosting
from agent_router.worker.publisher import CeleryPublisher

logger = get_logger(__name__)

#: How often an idle in-process (``memory://``) consumer looks for work. Kombu's default of one
#: second would add up to a second to every turn start in the embedded mode.
MEMORY_POLLING_SECONDS = 0.02


def celery_config(settings: Settings) -> dict[str, Any]:
    """The configuration of the router's own app (:func:`create_app`), one reason per line.

    The options a turn's reliability rests on (late acks, reject on worker lost, ignore result,
    JSON) are set on the tasks themselves (see :mod:`agent_router.worker.tasks`) and the publish
    retry policy on each publish: none of these are needed here, and a host never applies this
    to its own app (it calls :func:`install`)."""
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
        # A worker reserves one message per free slot: a long turn never sits on queued turns
        # that another worker could start now.
        "worker_prefetch_multiplier": 1,
        # Task events (received/started/succeeded, and sent by the publisher) so that Flower and
        # `celery events` see every turn.
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "broker_transport_options": transport_options,
        # Our tasks go to our queue.
        "task_routes": routes(settings),
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


def routes(settings: Settings) -> dict[str, dict[str, str]]:
    """The route of the router's tasks: ``agent_router.*`` to ``Settings.queue``."""
    return {f"{TASK_PREFIX}*": {"queue": settings.queue}}


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
    # So that a bare `celery -A agent_router.celery_app worker` consumes our queue (declared as
    # Celery declares a queue it creates on demand). Our queue is not made the default queue:
    # a host's task that this app publishes by name (a runner without `@queue`) goes where the
    # host's app would send it unrouted, Celery's default queue, never to the router's workers.
    queue = settings.queue
    app.conf.task_queues = (Queue(queue, Exchange(queue), routing_key=queue),)
    return app


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


class BrokerPublisher:
    """A :class:`CeleryPublisher` on the router's own app for ``settings``, built on the first
    publish (a Router that never publishes never loads Celery); what ``Router(settings)``
    publishes with when given no publisher."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._publisher: CeleryPublisher | None = None

    @property
    def celery(self) -> CeleryPublisher:
        with self._lock:
            if self._publisher is None:
                self._publisher = CeleryPublisher(create_app(self.settings))
            return self._publisher

    @property
    def app(self) -> Celery:
        return self.celery.app

    def publish(self, entry: OutboxEntry) -> None:
        self.celery.publish(entry)

    def routed_runner(self, runner: str) -> str:
        return self.celery.routed_runner(runner)

    def job_outcome(self, task_id: str) -> tuple[bool, str] | None:
        return self.celery.job_outcome(task_id)

    def queue_depth(self, queue: str) -> int | None:
        return self.celery.queue_depth(queue)

    def close(self) -> None:
        with self._lock:
            publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.app.close()


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
