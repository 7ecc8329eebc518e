"""Repairs of what a crash left behind: take over a dead turn, re-enqueue a lost turn task,
claim unpublished outbox rows."""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa

from agent_router import errors
from agent_router.domain import (
    AgentState,
    LedgerAction,
    OutboxEntry,
    OutboxKind,
    TurnStatus,
    TurnTrigger,
)
from agent_router.store import queries, routing, turns, values
from agent_router.store.decisions import move
from agent_router.store.models import (
    AgentRow,
    OutboxRow,
    TurnRow,
    utcnow,
)
from agent_router.store.tx import Tx


def take_over(
    tx: Tx,
    agent_id: int,
    *,
    reason: str,
    expected_turn_id: int | None = None,
    lease_check: bool = False,
) -> int:
    """Fence a running agent whose turn is presumed dead: bump the epoch so the old turn can
    write nothing, then schedule a ``recovery`` turn, or, if it was blocked in an ask, leave
    it suspended on that ask. Returns the new epoch."""
    session = tx.session
    agent = queries.lock_agent(tx.session, agent_id)
    if agent is None:
        raise errors.UnknownAgentError(f"no agent with id {agent_id}")
    if agent.state not in (AgentState.RUNNING, AgentState.WAITING) or agent.suspended:
        raise errors.TurnError(f"{agent.display_name} is {agent.state.value}: nothing to take over")
    old = session.scalars(
        sa.select(TurnRow).where(TurnRow.agent_id == agent.id, TurnRow.epoch == agent.epoch)
    ).one_or_none()
    if expected_turn_id is not None and (old is None or old.id != expected_turn_id):
        raise errors.TurnError("the turn changed since it was found expired")
    if lease_check and (
        old is None or old.lease_expires_at is None or old.lease_expires_at >= utcnow()
    ):
        raise errors.TurnError("the lease was renewed")
    if old is not None:
        old.status = TurnStatus.FENCED
        old.ended_at = utcnow()
        old.error = reason
    question = queries.waiting_question(tx.session, agent.id)
    if question is not None:
        move(agent, AgentState.WAITING)
        agent.suspended = True
        agent.epoch += 1
        question.asker_epoch = agent.epoch
    else:
        turns.close_dangling(tx, agent, old.id if old else None, turns.INTERRUPTED_RESULT, None)
        routing.schedule(tx, agent, TurnTrigger.RECOVERY)
    tx.agent_ledger(
        LedgerAction.TAKE_OVER,
        agent,
        turn_id=old.id if old else None,
        epoch=agent.epoch,
        reason=reason,
        suspended=agent.suspended,
    )
    return agent.epoch


#: A scheduled agent is re-enqueued after 1, 2, 4, ... (at most this many) delivery windows
#: without a claim: under a backlog its task is most likely still queued, and each copy would
#: only be refused by the fence.
MAX_BACKOFF_WINDOWS = 32
#: How many delivery windows an agent may wait behind a backlog before it is re-enqueued anyway.
BACKLOG_WINDOWS = 8


def stuck_scheduled(tx: Tx, *, older_than_seconds: float) -> int:
    """Re-enqueue agents left ``scheduled`` whose turn task never started (the task was
    lost after being published): scheduled, and its last enqueue published, longer ago than
    its delivery window: ``older_than_seconds`` for the first re-enqueue of an epoch, doubling
    with each one after (see :data:`MAX_BACKOFF_WINDOWS`). Not while its task is plausibly
    still queued: turns started since its last enqueue, all of agents scheduled before it (the
    broker hands tasks out in order: the workers are busy with a backlog it is part of), up to
    :data:`BACKLOG_WINDOWS`. Fenced claims make a duplicate harmless. Returns how many were
    re-enqueued."""
    session = tx.session
    now = utcnow()
    cutoff = now - timedelta(seconds=older_than_seconds)
    patience = now - timedelta(seconds=older_than_seconds * BACKLOG_WINDOWS)
    reenqueued = 0
    agents = session.scalars(
        sa.select(AgentRow)
        .where(AgentRow.state == AgentState.SCHEDULED, AgentRow.scheduled_at < cutoff)
        .order_by(AgentRow.id)
        .with_for_update(skip_locked=True)
    ).all()
    running = _running_turns(tx) if agents else []
    for agent in agents:
        sent, unpublished, last = session.execute(
            sa.select(
                sa.func.count(),
                sa.func.count().filter(OutboxRow.published_at.is_(None)),
                sa.func.max(OutboxRow.published_at),
            ).where(
                OutboxRow.agent_id == agent.id,
                OutboxRow.epoch == agent.epoch,
                OutboxRow.kind == OutboxKind.ENQUEUE_TURN,
            )
        ).one()
        # Unpublished: the outbox re-publisher covers it. Published within the window
        # (perhaps by this very sweep): the task has not yet had its time to start.
        windows = min(2 ** max(sent - 1, 0), MAX_BACKOFF_WINDOWS)
        due = now - timedelta(seconds=older_than_seconds * windows)
        if unpublished or (last is not None and last >= due):
            continue
        if last is not None and last >= patience and _behind_a_backlog(running, last):
            continue
        agent.scheduled_at = now
        tx.outbox(
            agent,
            OutboxKind.ENQUEUE_TURN,
            trigger=(agent.pending_trigger or TurnTrigger.NEW).value,
            reenqueued=True,
        )
        tx.agent_ledger(
            LedgerAction.REENQUEUED,
            agent,
            epoch=agent.epoch,
            backoff_windows=windows,
        )
        reenqueued += 1
    return reenqueued


def _running_turns(tx: Tx) -> list[tuple[datetime, datetime]]:
    """(scheduled at, started at) of every running turn's agent."""
    rows = tx.session.execute(
        sa.select(AgentRow.scheduled_at, TurnRow.started_at)
        .select_from(TurnRow)
        .join(AgentRow, AgentRow.id == TurnRow.agent_id)
        .where(TurnRow.status == TurnStatus.RUNNING, AgentRow.epoch == TurnRow.epoch)
    ).all()
    return [(scheduled, started) for scheduled, started in rows if scheduled is not None]


def _behind_a_backlog(running: list[tuple[datetime, datetime]], published: datetime) -> bool:
    """Turns started since ``published``, and every one of them scheduled before it."""
    since = [scheduled for scheduled, started in running if started > published]
    return bool(since) and all(scheduled <= published for scheduled in since)


def claim_unpublished(
    tx: Tx, *, older_than_seconds: float = 0.0, limit: int = 500
) -> list[OutboxEntry]:
    """Outbox rows to publish again: unpublished, older than ``older_than_seconds``, and not
    taken by a sweeper within that time. They are taken (``attempted_at``) in this
    transaction, skipping rows another sweeper holds locked, so that the timers of many
    workers publish a lost row once, not once each. A publish that fails leaves the row to
    the next pass after the same delay."""
    session = tx.session
    cutoff = utcnow() - timedelta(seconds=older_than_seconds)
    rows = session.scalars(
        queries.unpublished_since(cutoff, limit)
        .where(sa.or_(OutboxRow.attempted_at.is_(None), OutboxRow.attempted_at <= cutoff))
        .with_for_update(skip_locked=True)
    ).all()
    now = utcnow()
    for row in rows:
        row.attempted_at = now
    return [values.outbox_entry(r) for r in rows]
