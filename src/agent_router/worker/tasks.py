"""Celery tasks. Thin: decode ids, call the domain, turn transient errors into retries.

Declared with ``shared_task`` so a host's own Celery app can include them
(:func:`agent_router.worker.install`). Their reliability options are their own, never app-wide
defaults of the app that runs them:

- ``acks_late``: a turn task is acknowledged after it ran, so a worker that dies mid-turn leaves
  the message on the broker to be redelivered;
- ``reject_on_worker_lost``: the same when the worker process is killed (OOM, SIGKILL);
- ``ignore_result``: a turn's outcome is in the database (turns, ledger);
- ``serializer="json"``: arguments are ids, and no message of ours needs pickle.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from celery import Task, shared_task

from agent_router import errors
from agent_router.agents.loop import claim, run_turn
from agent_router.broker import CeleryPublisher, job_result_text, send_turn
from agent_router.constants import BACKGROUND_DONE, RUN_AGENT_TURN, SWEEP
from agent_router.logfields import get_logger
from agent_router.sweeper import sweep as sweep_once
from agent_router.worker import hosting, runtime, task_events

logger = get_logger(__name__)

#: The options every task of the router carries (see the module's docstring).
RELIABLE: dict[str, Any] = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    "ignore_result": True,
    "serializer": "json",
}

#: Retries of a claim that hit a database error; the outbox sweeper re-publishes after that.
CLAIM_RETRIES = 8


@shared_task(bind=True, name=RUN_AGENT_TURN, max_retries=CLAIM_RETRIES, **RELIABLE)
def run_agent_turn(self: Task[Any, Any], agent_id: int, epoch: int) -> str:
    """Claim the fenced turn ``(agent_id, epoch)`` and run the agent loop to its end.

    A duplicate or stale delivery claims nothing (the store ledgers ``claim_refused``) and
    returns. Once claimed, the loop always runs the end-of-turn hook, also when it raises."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (agent_id, epoch)):
        # A malformed message will never become valid: drop it rather than retry forever.
        logger.error(
            "malformed turn task", extra={"action": "claim", "agent_id": agent_id, "epoch": epoch}
        )
        return "malformed"
    hosting.require_enabled(self.app)
    rt = runtime.current(self.app)
    # Routing and state changes of this turn become task events (Flower shows its progress).
    with task_events.reporting(self):
        return _claim_and_run(self, rt, agent_id, epoch)


def _claim_and_run(task: Task[Any, Any], rt: runtime.Runtime, agent_id: int, epoch: int) -> str:
    try:
        if rt.runner is run_turn:
            turn = claim(rt.router, agent_id, epoch)  # its first model call's transition too
        else:
            turn = rt.router.claim(agent_id, epoch, builtin=True)
    except errors.HostOwnedTurnError as owned:
        # A host owns this agent's turns: the built-in loop never runs one. Forwarded with the
        # same fence, so the host's task claims (or refuses) it as any delivery.
        send_turn(task.app, owned.runner, agent_id, epoch)
        logger.info(
            "turn forwarded to the host's task",
            extra={"action": "forward", "agent_id": agent_id, "epoch": epoch, "task": owned.runner},
        )
        return "forwarded"
    except errors.StoreError as exc:
        logger.warning(
            "claim failed on a database error; retrying",
            extra={"action": "claim_retry", "agent_id": agent_id, "epoch": epoch},
        )
        raise task.retry(exc=exc, countdown=min(2**task.request.retries, 30)) from exc
    except errors.UnknownAgentError:
        logger.warning(
            "turn task for an unknown agent",
            extra={"action": "claim", "agent_id": agent_id, "epoch": epoch},
        )
        return "unknown_agent"
    if turn is None:
        logger.info(
            "turn not claimed: duplicate or stale delivery",
            extra={"action": "claim_refused", "agent_id": agent_id, "epoch": epoch},
        )
        return "refused"
    return rt.runner(rt.router, turn, models=rt.models, tools=rt.tools).value


@shared_task(bind=True, name=SWEEP, **RELIABLE)
def sweep(self: Task[Any, Any]) -> dict[str, int]:
    """One sweeper pass (beat runs it every ``Settings.sweep_seconds``). A database error fails
    this pass only; the next tick tries again, and every step is idempotent."""
    hosting.require_enabled(self.app)
    report = sweep_once(runtime.current(self.app).router)
    return dataclasses.asdict(report)


@shared_task(bind=True, name=BACKGROUND_DONE, max_retries=CLAIM_RETRIES, **RELIABLE)
def background_done(
    self: Task[Any, Any], outcome: Any, *, job_id: int, failed: bool = False
) -> str:
    """Link callback of a background job: route its completion to its agent as a notice.

    As ``link`` it gets the job's return value; as ``link_error`` (``failed=True``) Celery
    passes the job's task id, and the error is read from the result backend. Idempotent: the
    poller may report the same job; the second report changes nothing."""
    hosting.require_enabled(self.app)
    rt = runtime.current(self.app)
    if failed:
        publisher = CeleryPublisher(self.app)
        known = publisher.job_outcome(str(outcome)) if isinstance(outcome, str) else None
        text = known[1] if known else "the task raised (no result backend to say what)"
    else:
        text = job_result_text(outcome)
    try:
        job = rt.router.finish_background(job_id, ok=not failed, result=text)
    except errors.StoreError as exc:
        raise self.retry(exc=exc, countdown=min(2**self.request.retries, 30)) from exc
    return job.status.value
