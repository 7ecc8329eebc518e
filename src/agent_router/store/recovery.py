"""Repairs of what a crash left behind: take over a dead turn, re-enqueue a lost turn task (one
agent at a time, each in a transaction of its own), claim unpublished outbox rows."""

from __future__ import annotations

import bisect
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agent_router.domain import (
    AgentState,
    LedgerAction,
    OutboxEntry,
    OutboxKind,
    TurnStatus,
    TurnTrigger,
)
from agent_router.store import queries, refusals, routing, rules, turns, values
from agent_router.store.decisions import move
from agent_router.store.models import (
    AgentRow,
    OutboxRow,
    TurnRow,
    utcnow,
)
from agent_router.store.tx import Tx
from agent_router.store.values import Scheduled


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
        raise refusals.error("no_agent_id", agent_id=agent_id)
    if agent.state not in (AgentState.RUNNING, AgentState.WAITING) or agent.suspended:
        raise refusals.error(
            "nothing_to_take_over", name=agent.display_name, state=agent.state.value
        )
    old = session.scalars(
        sa.select(TurnRow).where(TurnRow.agent_id == agent.id, TurnRow.epoch == agent.epoch)
    ).one_or_none()
    if expected_turn_id is not None and (old is None or old.id != expected_turn_id):
        raise refusals.error("turn_changed")
    if lease_check and (
        old is None or old.lease_expires_at is None or old.lease_expires_at >= utcnow()
    ):
        raise refusals.error("lease_renewed")
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
        turns.close_dangling(tx, agent, old.id if old else None, rules.INTERRUPTED_RESULT, None)
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


def expired_turn(session: Session, agent_id: int) -> int | None:
    """The agent's running turn at its current epoch if its lease has expired (read without a
    lock: :func:`take_over` checks again under it, ``lease_check``), else ``None``."""
    agent = session.get(AgentRow, agent_id)
    if agent is None:
        return None
    turn = session.scalars(
        sa.select(TurnRow).where(
            TurnRow.agent_id == agent_id,
            TurnRow.epoch == agent.epoch,
            TurnRow.status == TurnStatus.RUNNING,
        )
    ).one_or_none()
    if turn is None or turn.lease_expires_at is None or turn.lease_expires_at >= utcnow():
        return None
    return turn.id


#: A scheduled agent is re-enqueued after 1, 2, 4, ... (at most this many) delivery windows
#: without a claim: each copy of a task still queued would only be refused by the fence.
MAX_BACKOFF_WINDOWS = 32
#: Where the broker's queue depth is not known: how many delivery windows an agent may wait
#: behind a backlog (turns started since its publish, all of agents scheduled before it)
#: before it is re-enqueued anyway.
BACKLOG_WINDOWS = 8


def scheduled(session: Session, *, older_than_seconds: float) -> list[Scheduled]:
    """Agents scheduled longer ago than ``older_than_seconds`` with what their current epoch's
    turn tasks were (a read: each re-enqueue locks its agent in a transaction of its own)."""
    cutoff = utcnow() - timedelta(seconds=older_than_seconds)
    outbox = sa.and_(
        OutboxRow.agent_id == AgentRow.id,
        OutboxRow.epoch == AgentRow.epoch,
        OutboxRow.kind == OutboxKind.ENQUEUE_TURN,
    )
    rows = session.execute(
        sa.select(
            AgentRow.id,
            AgentRow.team_id,
            AgentRow.epoch,
            AgentRow.runner,
            sa.func.count(OutboxRow.id),
            sa.func.count(OutboxRow.id).filter(OutboxRow.published_at.is_(None)),
            sa.func.max(OutboxRow.published_at),
        )
        .select_from(AgentRow)
        .outerjoin(OutboxRow, outbox)
        .where(AgentRow.state == AgentState.SCHEDULED, AgentRow.scheduled_at < cutoff)
        .group_by(AgentRow.id, AgentRow.team_id, AgentRow.epoch, AgentRow.runner)
        .order_by(AgentRow.id)
    ).all()
    return [
        Scheduled(
            agent_id=r[0],
            team_id=r[1],
            epoch=r[2],
            runner=r[3],
            sent=r[4],
            unpublished=r[5],
            last_published=r[6],
        )
        for r in rows
    ]


def published_by_runner(session: Session) -> dict[str | None, list[datetime]]:
    """When each scheduled agent's current turn task was last published, by the agent's runner
    (sorted): what is queued, as far as the database knows."""
    latest = (
        sa.select(AgentRow.runner, sa.func.max(OutboxRow.published_at).label("published"))
        .join(
            OutboxRow,
            sa.and_(
                OutboxRow.agent_id == AgentRow.id,
                OutboxRow.epoch == AgentRow.epoch,
                OutboxRow.kind == OutboxKind.ENQUEUE_TURN,
            ),
        )
        .where(AgentRow.state == AgentState.SCHEDULED, OutboxRow.published_at.is_not(None))
        .group_by(AgentRow.id, AgentRow.runner)
    )
    found: dict[str | None, list[datetime]] = {}
    for runner, published in session.execute(latest):
        if published is not None:
            found.setdefault(runner, []).append(published)
    for times in found.values():
        times.sort()
    return found


def backoff_windows(agent: Scheduled) -> int:
    """Delivery windows since its last publish before an agent's task counts as lost: 1, then
    2, 4, ... with each re-enqueue of the epoch (at most :data:`MAX_BACKOFF_WINDOWS`)."""
    return int(min(2 ** max(agent.sent - 1, 0), MAX_BACKOFF_WINDOWS))


def still_queued(
    agent: Scheduled, published: list[datetime], depth: int, *, as_of: datetime
) -> bool:
    """Is the agent's task plausibly still in its queue, which the broker said held ``depth``
    messages at ``as_of``? ``published``: when every scheduled agent of that queue had its
    task published (sorted), read after the depth. The queue hands tasks out in order, so if
    the agent's task is there, so is every task published after it: the queue held at least
    that many (the agent's included). Fewer means the task is gone (a broker restart, a
    worker that died holding it), whatever the depth of the backlog; stale copies and other
    tasks in the queue only make it wait longer, never re-enqueue twice. Publishes after
    ``as_of`` are not counted (the depth did not see them), and a task taken between the two
    reads only leaves the database's list, not the depth read before."""
    assert agent.last_published is not None
    first = bisect.bisect_left(published, agent.last_published)
    behind = bisect.bisect_right(published, as_of) - first
    return depth >= max(behind, 1)


def running_turns(session: Session) -> list[tuple[datetime, datetime]]:
    """(scheduled at, started at) of every running turn's agent."""
    rows = session.execute(
        sa.select(AgentRow.scheduled_at, TurnRow.started_at)
        .select_from(TurnRow)
        .join(AgentRow, AgentRow.id == TurnRow.agent_id)
        .where(TurnRow.status == TurnStatus.RUNNING, AgentRow.epoch == TurnRow.epoch)
    ).all()
    return [(scheduled, started) for scheduled, started in rows if scheduled is not None]


def behind_a_backlog(running: list[tuple[datetime, datetime]], published: datetime) -> bool:
    """Where the queue's depth is not known: turns started since ``published``, and every one
    of them scheduled before it (the broker hands tasks out in order: the workers are busy
    with a backlog the task is part of)."""
    since = [scheduled for scheduled, started in running if started > published]
    return bool(since) and all(scheduled <= published for scheduled in since)


def reenqueue(tx: Tx, agent: Scheduled, *, windows: int) -> bool:
    """Enqueue again the turn task of ``agent``, found lost: only if it is still scheduled in
    the same epoch and nobody published its task since it was read (another sweeper's pass);
    an agent another transaction holds is left to it. Fenced claims make a duplicate
    harmless."""
    session = tx.session
    row = session.scalars(
        sa.select(AgentRow)
        .where(AgentRow.id == agent.agent_id)
        .with_for_update(skip_locked=True)
        .execution_options(populate_existing=True)
    ).one_or_none()
    if row is None or row.state is not AgentState.SCHEDULED or row.epoch != agent.epoch:
        return False
    unpublished, last = session.execute(
        sa.select(
            sa.func.count().filter(OutboxRow.published_at.is_(None)),
            sa.func.max(OutboxRow.published_at),
        ).where(
            OutboxRow.agent_id == row.id,
            OutboxRow.epoch == row.epoch,
            OutboxRow.kind == OutboxKind.ENQUEUE_TURN,
        )
    ).one()
    if unpublished or last != agent.last_published:
        return False
    row.scheduled_at = utcnow()
    tx.outbox(
        row,
        OutboxKind.ENQUEUE_TURN,
        trigger=(row.pending_trigger or TurnTrigger.NEW).value,
        reenqueued=True,
    )
    tx.agent_ledger(LedgerAction.REENQUEUED, row, epoch=row.epoch, backoff_windows=windows)
    return True


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
