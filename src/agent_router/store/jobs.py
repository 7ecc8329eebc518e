"""Background jobs: record one, route its completion once, batch the completions of a burst."""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa

from agent_router import validation
from agent_router.domain import (
    AgentState,
    BackgroundJob,
    Delivery,
    JobStatus,
    LedgerAction,
    MessageType,
    OutboxKind,
    RouteOutcome,
    TurnTrigger,
)
from agent_router.store import queries, refusals, routing, values
from agent_router.store.models import (
    AgentRow,
    BackgroundJobRow,
    OutboxRow,
    utcnow,
)
from agent_router.store.rules import JOB_BATCH_MAX_WINDOWS
from agent_router.store.tx import Tx
from agent_router.store.values import SendRequest


def start_job(tx: Tx, team_id: int, agent: str, *, name: str, task_id: str) -> BackgroundJob:
    """Record a background job before its task is sent, so that a completion (or the
    poller) always finds it."""
    queries.team(tx.session, team_id)
    row = queries.agent_by_name(tx.session, team_id, agent)
    if row is None:
        raise refusals.error("unknown_agent", name=agent, team_id=team_id)
    if row.state is AgentState.TERMINATED:
        raise refusals.error("terminated", name=agent)
    if (
        tx.session.scalar(sa.select(BackgroundJobRow.id).where(BackgroundJobRow.task_id == task_id))
        is not None
    ):
        raise refusals.error("job_task_recorded", task_id=task_id)
    job = tx.added(
        BackgroundJobRow(
            team_id=team_id,
            agent_id=row.id,
            name=name[:200],
            task_id=task_id,
            status=JobStatus.RUNNING,
        )
    )
    tx.agent_ledger(
        LedgerAction.JOB_STARTED,
        row,
        job_id=job.id,
        name=job.name,
        task_id=task_id,
    )
    return values.job(job)


def finish_job(
    tx: Tx, job_id: int, *, ok: bool, result: str, batch_seconds: float = 0.0
) -> BackgroundJob:
    """Route a job's completion to its agent as a ``notice`` from ``job:<name>``, once: the
    job's row lock orders the link callback against the poller, and the second finds the
    job finished (the dedup key ``job:<id>`` guards the message as well).

    If the notice wakes a resting agent, its turn task is published ``batch_seconds`` late:
    completions arriving meanwhile coalesce into that one turn."""
    session = tx.session
    job = session.get(BackgroundJobRow, job_id, with_for_update={"key_share": True})
    if job is None:
        raise refusals.error("unknown_job", job_id=job_id)
    if job.status is not JobStatus.RUNNING:
        return values.job(job)
    agent = session.get(AgentRow, job.agent_id)
    assert agent is not None
    job.status = JobStatus.SUCCEEDED if ok else JobStatus.FAILED
    job.finished_at = utcnow()
    job.result = result
    delivery: Delivery | None = None
    if agent.state is not AgentState.TERMINATED:
        verb = "finished" if ok else "failed"
        delivery = routing.route(
            tx,
            SendRequest(
                team_id=job.team_id,
                to=agent.display_name,
                content=f"Background job {job.name} ({job.task_id}) {verb}: {result}",
                sender=f"{validation.EXTERNAL_PREFIX}{job.name}",
                type=MessageType.NOTICE,
                dedup_key=f"job:{job.id}",
            ),
        )
        job.notice_message_id = delivery.message_id
        if batch_seconds > 0:
            batch_turn(tx, agent, delivery, batch_seconds)
    tx.agent_ledger(
        LedgerAction.JOB_FINISHED,
        agent,
        message_id=job.notice_message_id,
        job_id=job.id,
        status=job.status.value,
        reported=delivery is not None,
    )
    return values.job(job)


def batch_turn(
    tx: Tx,
    agent: AgentRow,
    delivery: Delivery,
    seconds: float,
) -> None:
    """Debounce: the first completion schedules the agent's turn ``seconds`` late; each
    further one that arrives before that turn started pushes it back by ``seconds`` again
    (a new epoch; the earlier task is refused by the fence), for at most
    :data:`JOB_BATCH_MAX_WINDOWS` windows after the first."""
    session = tx.session
    now = utcnow()
    if delivery.outcome is RouteOutcome.TRIGGERED_NEW_TURN:
        delay_turn(tx, seconds, first=now)
        return
    if delivery.outcome is not RouteOutcome.COALESCED:
        return
    batch = session.scalars(
        sa.select(OutboxRow)
        .where(
            OutboxRow.agent_id == agent.id,
            OutboxRow.epoch == agent.epoch,
            OutboxRow.kind == OutboxKind.ENQUEUE_TURN,
        )
        .order_by(OutboxRow.id.desc())
        .limit(1)
    ).one_or_none()
    first_at = (batch.payload or {}).get("batch_started") if batch else None
    if first_at is None:
        return  # not a batch turn (a message woke it): it starts as published
    first = datetime.fromisoformat(first_at)
    if now - first >= timedelta(seconds=seconds * JOB_BATCH_MAX_WINDOWS):
        return
    routing.schedule(tx, agent, agent.pending_trigger or TurnTrigger.NEW)
    delay_turn(tx, seconds, first=first)


def delay_turn(tx: Tx, seconds: float, *, first: datetime) -> None:
    """Give the turn task just scheduled a countdown (published with it)."""
    session = tx.session
    entry = tx.entries[-1]
    payload = {**entry.payload, "countdown": seconds, "batch_started": first.isoformat()}
    row = session.get(OutboxRow, entry.id)
    assert row is not None and entry.kind is OutboxKind.ENQUEUE_TURN
    row.payload = payload
    tx.entries[-1] = values.outbox_entry(row)
