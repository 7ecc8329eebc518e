"""The outbox publisher for Celery: turn tasks sent by name, labelled for monitors."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from celery import Celery
from celery.result import AsyncResult
from kombu.exceptions import ChannelError

from agent_router.constants import RUN_AGENT_TURN
from agent_router.domain import OutboxEntry, OutboxKind
from agent_router.logfields import get_logger

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
