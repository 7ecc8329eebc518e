"""The sweeper's bulkheads: agents a repair kept failing for.

A pass repairs one agent at a time. A repair that fails (an error the database gives for that
agent's rows alone, a bug one agent's data runs into) is recorded here and ledgered
(``sweep_failed``), and the passes leave the agent alone for a while: one sweep period after
the first failure, then two, four, ... up to :data:`MAX_BACKOFF_PERIODS`. From
:data:`QUARANTINE_AFTER` failures in a row the agent is quarantined (``quarantined``, once;
``check`` reports it); a repair that succeeds for it again lifts it (``quarantine_lifted``).
"""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from agent_router import limits
from agent_router.domain import TERMINATED_AND_RESTING, LedgerAction, Quarantine, SweepStep
from agent_router.store.models import AgentRow, QuarantineRow, utcnow
from agent_router.store.tx import Tx

#: Failures in a row after which an agent is quarantined (and reported by ``check``).
QUARANTINE_AFTER = 3
#: The longest an agent is left alone after a failure, in sweep periods.
MAX_BACKOFF_PERIODS = 64
#: How much of a failure's error is kept.
ERROR_CHARS = 1000
#: Why a settled agent's quarantine is lifted (:func:`settled`).
SETTLED_REASON = "nothing left to repair"


def value(row: QuarantineRow) -> Quarantine:
    return Quarantine(
        agent_id=row.agent_id,
        team_id=row.team_id,
        step=row.step,
        failures=row.failures,
        error=row.error,
        first_failed_at=row.first_failed_at,
        last_failed_at=row.last_failed_at,
        until=row.until,
    )


def record_failure(
    tx: Tx, agent_id: int, step: SweepStep, error: str, *, period_seconds: float
) -> Quarantine | None:
    """One more failure of ``step`` for the agent: ledgered, and the agent left alone for its
    backoff; ``None`` when the agent is gone."""
    session = tx.session
    agent = session.get(AgentRow, agent_id)
    if agent is None:
        return None
    now = utcnow()
    text = limits.storable(error)[:ERROR_CHARS]
    insert = (sqlite if tx.settings.is_sqlite else postgresql).insert(QuarantineRow)
    session.execute(
        insert.values(
            agent_id=agent.id,
            team_id=agent.team_id,
            step=step,
            failures=0,
            error=text,
            first_failed_at=now,
            last_failed_at=now,
            until=now,
        ).on_conflict_do_nothing()
    )
    row = session.scalars(
        sa.select(QuarantineRow)
        .where(QuarantineRow.agent_id == agent.id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one()
    row.failures += 1
    periods = min(2 ** (row.failures - 1), MAX_BACKOFF_PERIODS)
    row.step, row.error, row.last_failed_at = step, text, now
    row.until = now + timedelta(seconds=period_seconds * periods)
    detail = {"step": step.value, "failures": row.failures, "error": text}
    tx.agent_ledger(LedgerAction.SWEEP_FAILED, agent, left_alone_periods=periods, **detail)
    if row.failures == QUARANTINE_AFTER:
        tx.agent_ledger(LedgerAction.QUARANTINED, agent, **detail)
    session.flush()
    return value(row)


def lift(tx: Tx, agent_id: int, *, reason: str) -> bool:
    """The agent's failures are behind it (a repair succeeded, or nothing is left to repair):
    its row goes, and a quarantine is ledgered lifted."""
    session = tx.session
    row = session.scalars(
        sa.select(QuarantineRow).where(QuarantineRow.agent_id == agent_id).with_for_update()
    ).one_or_none()
    if row is None:
        return False
    if row.failures >= QUARANTINE_AFTER:
        tx.ledger(
            LedgerAction.QUARANTINE_LIFTED,
            team_id=row.team_id,
            agent_id=row.agent_id,
            step=row.step.value,
            failures=row.failures,
            reason=reason,
        )
    session.delete(row)
    return True


def settled(tx: Tx, *, keep: set[int]) -> list[int]:
    """Agents whose backoff is over and that no repair needs any more (resting or
    terminated: no turn to take over, nothing scheduled, no wait to expire), other than
    ``keep`` (a pass tried them): lifted. A background job's failed report stays until it is
    made."""
    now = utcnow()
    rows = tx.session.execute(
        sa.select(QuarantineRow.agent_id)
        .join(AgentRow, AgentRow.id == QuarantineRow.agent_id)
        .where(
            QuarantineRow.until <= now,
            QuarantineRow.step != SweepStep.POLL_JOB,
            AgentRow.state.in_(TERMINATED_AND_RESTING),
        )
        .order_by(QuarantineRow.agent_id)
    ).scalars()
    lifted = [agent_id for agent_id in rows if agent_id not in keep]
    for agent_id in lifted:
        lift(tx, agent_id, reason=SETTLED_REASON)
    return lifted
