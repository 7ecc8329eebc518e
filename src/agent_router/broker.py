"""Celery on the sending side: the router's app configuration (:func:`create_app`), the outbox
publisher that sends turn tasks by name, labelled for monitors (:class:`CeleryPublisher`), and
:class:`BrokerPublisher`, what a ``Router`` given no publisher sends with.

Any process that commits turn enqueues publishes (a script, a web app, the CLI), so this sits
beside the router, below the agents and the worker; :mod:`agent_router.worker` runs the tasks.
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any

from celery import Celery
from celery.result import AsyncResult
from kombu import Exchange, Queue
from kombu.exceptions import ChannelError

from agent_router.constants import RUN_AGENT_TURN, SWEEP, SWEEP_SCHEDULE_ENTRY, TASK_PREFIX
from agent_router.domain import OutboxEntry, OutboxKind
from agent_router.logfields import get_logger
from agent_router.settings import Settings

logger = get_logger(__name__)


#: Celery's own default queue: where an app that names no other sends a task it has no route for.
CELERY_DEFAULT_QUEUE = "celery"

#: Seconds to reach the broker for a queue's depth (a sweeper pass waits for it).
QUEUE_DEPTH_TIMEOUT = 2.0

#: Retries of one publish (see :meth:`CeleryPublisher.publish`).
PUBLISH_RETRY_POLICY = {
    "max_retries": 1,
    "interval_start": 0.1,
    "interval_step": 0.2,
    "interval_max": 0.2,
}


def turn_label(entry: OutboxEntry) -> str:
    """A turn task as monitors show it: ``UI Operator_1 (team 3) epoch 2 [new]``. Names come
    from the outbox payload (no database read); rows written before it carried them show ids."""
    payload = entry.payload
    who = payload.get("agent") or f"agent {entry.agent_id}"
    team = f" (team {payload['team_id']})" if payload.get("team_id") is not None else ""
    trigger = f" [{payload['trigger']}]" if payload.get("trigger") else ""
    return f"{who}{team} epoch {entry.epoch}{trigger}"


def send_turn(app: Celery, runner: str | None, agent_id: int, epoch: int, **options: Any) -> None:
    """Publish the fenced turn ``(agent_id, epoch)`` to the task that runs the agent's turns, by
    name: ``runner`` (``name`` or ``name@queue``, a host's task) or the built-in loop's. No
    task code is imported: any process can start a host's turn."""
    task, _, queue = (runner or RUN_AGENT_TURN).partition("@")
    if queue:
        options["queue"] = queue
    app.send_task(
        task,
        args=(agent_id, epoch),
        # send_task by name cannot see the task's ignore_result; without this the Redis result
        # backend subscribes to a result channel per send (and stalls sends while Redis is
        # down), for a task whose outcome lives in the database.
        ignore_result=True,
        # A publish to a broker that is down fails fast instead of stalling `send()`: the row
        # is in the outbox (committed), and the sweeper publishes it once the broker is back.
        # Per publish, so the host app's own policy stays as it is.
        retry_policy=PUBLISH_RETRY_POLICY,
        kwargsrepr="{}",
        **options,
    )


def send_user_message(app: Celery, user_task: str, message: dict[str, Any]) -> None:
    """Publish a message to the user to the host's task (``name`` or ``name@queue``), by name,
    as ``message=`` its JSON form. At least once: the sweeper publishes a row again until one
    publish is marked, so the host drops a repeat by ``message["id"]``."""
    task, _, queue = user_task.partition("@")
    options: dict[str, Any] = {"queue": queue} if queue else {}
    app.send_task(
        task,
        kwargs={"message": message},
        ignore_result=True,
        retry_policy=PUBLISH_RETRY_POLICY,
        argsrepr=f"{message.get('kind')} {message.get('id')} (team {message.get('team_id')})",
        **options,
    )


class CeleryPublisher:
    """The outbox :class:`~agent_router.outbox.Publisher` for Celery.

    ``send_task`` by name rather than ``run_agent_turn.apply_async``: the same message, but a
    process that only sends (a web app) need not import the worker's task code, and the app is
    explicit instead of Celery's thread-local current app."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def publish(self, entry: OutboxEntry) -> None:
        if entry.kind is OutboxKind.ENQUEUE_TURN:
            # A countdown batches completions: notices of background jobs that finish within
            # the window coalesce into the one turn this task starts.
            countdown = entry.payload.get("countdown")
            send_turn(
                self.app,
                entry.payload.get("task"),
                entry.agent_id,
                entry.epoch,
                countdown=float(countdown) if countdown else None,
                # What Flower and `celery events` show for the task instead of "(12, 3)".
                argsrepr=turn_label(entry),
            )
            logger.debug(
                "turn enqueued",
                extra={"action": "publish", "agent_id": entry.agent_id, "epoch": entry.epoch},
            )
        elif entry.kind is OutboxKind.DELIVER_USER:
            send_user_message(self.app, str(entry.payload["task"]), entry.payload["message"])
        elif entry.kind is OutboxKind.WAKE_WAITER:
            # The Router hands wake signals to its waker and never here; should a host publish
            # one through us anyway, the blocked asker's timeout re-reads the database.
            logger.info(
                "wake signal ignored: the router's waker carries it",
                extra={"action": "publish", "agent_id": entry.agent_id, "kind": entry.kind.value},
            )

    def routed_runner(self, runner: str) -> str:
        """``runner`` with the queue this app sends it to (``name@queue``) when the app decides
        one: a route of its ``task_routes``, or a default queue other than Celery's own
        (``celery``); as given otherwise, and when it names its queue. The router records the
        result with the agent it creates, so that a process publishing through another app (the
        router's own, in the CLI or its worker) sends the turn where this app would."""
        if "@" in runner:
            return runner
        route = self.app.amqp.router.lookup_route(runner, (), {}, {}, None)
        if route:
            queue = route if isinstance(route, str) else route.get("queue")
            name = getattr(queue, "name", queue)
        else:
            default = self.app.conf.task_default_queue
            name = default if default != CELERY_DEFAULT_QUEUE else None
        return f"{runner}@{name}" if isinstance(name, str) and name else runner

    def queue_depth(self, queue: str) -> int | None:
        """Messages waiting in ``queue`` (a passive declare: Redis sums the ``LLEN`` of the
        queue's priority lists, RabbitMQ answers its message count), those reserved by a
        worker not included; a queue the broker has not got is empty. ``None`` when the broker
        cannot be reached: the sweeper then judges by order alone."""
        try:
            with self.app.connection_for_read(connect_timeout=QUEUE_DEPTH_TIMEOUT) as conn:
                conn.ensure_connection(max_retries=1)
                channel: Any = conn.channel()
                try:
                    declared = channel.queue_declare(queue=queue, passive=True)
                finally:
                    with contextlib.suppress(Exception):  # a channel the 404 already closed
                        channel.close()
        except ChannelError:
            return 0  # not declared yet: nothing is queued in it
        except Exception as exc:  # the broker is away: the pass judges by order alone
            logger.warning(
                "queue depth unknown: %s", exc, extra={"action": "queue_depth", "queue": queue}
            )
            return None
        return int(declared.message_count)

    def job_outcome(self, task_id: str) -> tuple[bool, str] | None:
        """A background job's outcome from the result backend (see ``sweeper.poll_jobs``):
        ``None`` while it runs, and always when the app has no result backend."""
        if not self.app.conf.result_backend:
            return None
        result: AsyncResult[Any] = AsyncResult(task_id, app=self.app)
        state = result.state
        if state == "SUCCESS":
            return True, job_result_text(result.result)
        if state == "FAILURE":
            return False, job_result_text(result.result)
        return None


def job_result_text(value: Any) -> str:
    """A job's return value (or exception) as the text of its notice."""
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return repr(value)


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
