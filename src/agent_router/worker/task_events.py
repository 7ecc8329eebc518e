"""Routing and agent-state changes as Celery task events, so that Flower (and ``celery
events``) show a turn's progress next to its task.

A turn task enters :func:`reporting` around its work; while it runs, :class:`TaskEventHooks` sends
a ``task-started`` event for each message routed and each state change of the agent. The type is
Celery's own: monitors keep showing the running turn as ``STARTED`` (a custom type would become a
state of its own that no "started" filter finds), and Celery's event state merges the fields into
the task it keeps. Events carry names, ids and outcomes, never message content or transcripts.
Outside a turn task (a web process sending a message) there is no task to attach an event to, and
nothing is sent.

Field names avoid those Celery's event state keeps for a task (``state``, ``name``, ``args``,
``result``...), since event fields are merged into the task Flower shows; but ``started``:
Celery's state sets a task's start time to the timestamp of each ``task-started`` event, so
every progress event carries the turn task's start in that field, and Flower's STARTED time
stays the start, not the latest progress.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from agent_router.hooks import RouterHooks, route_fields
from agent_router.logfields import get_logger

if TYPE_CHECKING:
    from celery import Task

    from agent_router.domain import Delivery, EndOfTurn, WaitOutcome
    from agent_router.errors import AgentRouterError
    from agent_router.turn import Turn

logger = get_logger(__name__)

#: The event type of progress reports: the running task stays ``STARTED`` in monitors.
PROGRESS_EVENT = "task-started"

#: The running turn task and when it started (``time.time()``, as event timestamps are).
_current: contextvars.ContextVar[tuple[Task[Any, Any], float] | None] = contextvars.ContextVar(
    "agent_router_current_task", default=None
)


@contextlib.contextmanager
def reporting(task: Task[Any, Any]) -> Iterator[None]:
    """Attach the progress events of this thread's routing to ``task`` while the block runs."""
    token = _current.set((task, time.time()))
    try:
        yield
    finally:
        _current.reset(token)


def send_progress(**fields: Any) -> bool:
    """Send one progress event (``task-started``) for the running turn task; ``False`` outside
    one. A lost event costs nothing but a line in Flower, so it is sent without retries."""
    current = _current.get()
    if current is None or not current[0].request.id:
        return False
    task, started = current
    try:
        task.send_event(PROGRESS_EVENT, retry=False, started=started, **fields)
    except Exception:
        logger.warning("progress event not sent", exc_info=True, extra={"action": "task_event"})
        return False
    return True


class TaskEventHooks(RouterHooks):
    """Router hooks that report to the running turn task's Celery events."""

    def after_route(self, team_id: int, sender: str, delivery: Delivery) -> None:
        send_progress(
            action="route", **route_fields(team_id, sender, delivery), target_epoch=delivery.epoch
        )

    def after_reject(self, team_id: int | None, sender: str, error: AgentRouterError) -> None:
        send_progress(
            action="route", team_id=team_id, sender=sender, outcome="rejected", error=str(error)
        )

    def after_claim(self, turn: Turn) -> None:
        send_progress(
            action="turn_claimed",
            team_id=turn.team_id,
            agent=turn.display_name,
            agent_state="running",
            epoch=turn.epoch,
            trigger=turn.trigger.value,
            turn_id=turn.id,
        )

    def after_wait(self, turn: Turn, outcome: WaitOutcome, seconds: float) -> None:
        send_progress(
            action="wait",
            team_id=turn.team_id,
            agent=turn.display_name,
            agent_state="running" if outcome.value == "resolved" else "waiting",
            wait_outcome=outcome.value,
            wait_seconds=round(seconds, 3),
            turn_id=turn.id,
        )

    def after_end_turn(self, turn: Turn, end: EndOfTurn, seconds: float, *, failed: bool) -> None:
        send_progress(
            action="turn_ended",
            team_id=turn.team_id,
            agent=turn.display_name,
            agent_state=end.state.value,
            follow_up=end.follow_up,
            failed=failed,
            turn_seconds=round(seconds, 3),
            turn_id=turn.id,
        )
