"""Storage lifecycle: deleting a team with every row it owns, and retention (finished teams and
published outbox rows older than a cutoff).

A deleted team's queued turn tasks are fenced by the deletion itself: a task whose agent row is
gone claims nothing, and a turn still running finds its agent gone at its next write (a stale
turn) and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from agent_router import errors
from agent_router.domain import TURN_STATES, AgentState, LedgerAction, QuestionStatus
from agent_router.store import queries
from agent_router.store.models import (
    AgentRow,
    BackgroundJobRow,
    BudgetRow,
    LedgerRow,
    MessageRow,
    ModelCallRow,
    OutboxRow,
    QuarantineRow,
    QuestionRow,
    TeamRow,
    TranscriptEntryRow,
    TurnRow,
    utcnow,
)
from agent_router.store.tx import Tx

#: Teams deleted by one prune transaction; a prune runs batches until none is left.
PRUNE_BATCH = 200

_BUSY_STATES = frozenset({AgentState.SCHEDULED, *TURN_STATES})


@dataclass(frozen=True, kw_only=True)
class Deletion:
    """What a delete or a prune removed (with ``dry_run``: would remove)."""

    teams: tuple[int, ...] = ()
    rows: dict[str, int] = field(default_factory=dict)  # table name -> rows
    questions: tuple[int, ...] = ()  # their wake keys go too
    dry_run: bool = False

    @property
    def total(self) -> int:
        return sum(self.rows.values())


def _team_rows(
    teams: Any, outbox_pruned_before: datetime | None
) -> list[tuple[type[Any], sa.ColumnElement[bool]]]:
    """Every table's rows of ``teams`` (a subquery of team ids), in an order that deletes
    children before the rows they reference. Outbox rows a prune counts on their own
    (published before ``outbox_pruned_before``) are left out."""
    agents = sa.select(AgentRow.id).where(AgentRow.team_id.in_(teams))
    outbox: sa.ColumnElement[bool] = OutboxRow.team_id.in_(teams)
    if outbox_pruned_before is not None:
        outbox = sa.and_(
            outbox,
            sa.or_(
                OutboxRow.published_at.is_(None), OutboxRow.published_at >= outbox_pruned_before
            ),
        )
    return [
        (TranscriptEntryRow, TranscriptEntryRow.agent_id.in_(agents)),
        (LedgerRow, sa.or_(LedgerRow.team_id.in_(teams), LedgerRow.agent_id.in_(agents))),
        (OutboxRow, outbox),
        (BackgroundJobRow, BackgroundJobRow.team_id.in_(teams)),
        (ModelCallRow, ModelCallRow.team_id.in_(teams)),
        (QuarantineRow, QuarantineRow.team_id.in_(teams)),
        (BudgetRow, BudgetRow.team_id.in_(teams)),
        (MessageRow, MessageRow.team_id.in_(teams)),
        (QuestionRow, QuestionRow.team_id.in_(teams)),
        (TurnRow, TurnRow.team_id.in_(teams)),
        (AgentRow, AgentRow.team_id.in_(teams)),
        (TeamRow, TeamRow.id.in_(teams)),
    ]


def delete_teams(
    tx: Tx, team_ids: list[int], *, dry_run: bool, outbox_pruned_before: datetime | None = None
) -> Deletion:
    """Delete the teams ``team_ids`` (locked first) and every row they own."""
    session = tx.session
    locked = session.scalars(
        sa.select(TeamRow.id).where(TeamRow.id.in_(team_ids)).order_by(TeamRow.id).with_for_update()
    ).all()
    if not locked:
        return Deletion(dry_run=dry_run)
    # Their agents too, in id order after the teams (the canonical order): a row of an agent is
    # checked against the agent's row (its foreign key), so a write to one of them finishes
    # before the deletion starts, and one that comes later waits for it and finds no agent.
    session.execute(
        sa.select(AgentRow.id)
        .where(AgentRow.team_id.in_(locked))
        .order_by(AgentRow.id)
        .with_for_update()
    )
    teams = sa.select(TeamRow.id).where(TeamRow.id.in_(locked)).scalar_subquery()
    questions = session.scalars(
        sa.select(QuestionRow.id).where(
            QuestionRow.team_id.in_(teams), QuestionRow.status == QuestionStatus.OPEN
        )
    ).all()
    rows: dict[str, int] = {}
    for table, where in _team_rows(teams, outbox_pruned_before):
        rows[str(table.__tablename__)] = _remove(tx, table, where, dry_run=dry_run)
    return Deletion(teams=tuple(locked), rows=rows, questions=tuple(questions), dry_run=dry_run)


def delete_team(tx: Tx, team_id: int, *, dry_run: bool) -> Deletion:
    deletion = delete_teams(tx, [team_id], dry_run=dry_run)
    if not deletion.teams:
        raise errors.UnknownTeamError(f"unknown team {team_id}")
    return deletion


def finished_teams(tx: Tx, *, before: datetime, limit: int, after: int = 0) -> list[int]:
    """Teams (ids above ``after``) with nothing in flight (no agent scheduled, running or
    waiting) and no ledger event since ``before``."""
    busy = sa.select(AgentRow.id).where(
        AgentRow.team_id == TeamRow.id, AgentRow.state.in_(_BUSY_STATES)
    )
    recent = sa.select(LedgerRow.id).where(
        LedgerRow.team_id == TeamRow.id, LedgerRow.created_at >= before
    )
    return list(
        tx.session.scalars(
            sa.select(TeamRow.id)
            .where(
                TeamRow.id > after, TeamRow.created_at < before, ~busy.exists(), ~recent.exists()
            )
            .order_by(TeamRow.id)
            .limit(limit)
        )
    )


def prune_outbox(tx: Tx, *, before: datetime, dry_run: bool) -> int:
    """Published outbox rows older than ``before`` (their tasks were sent long ago)."""
    where = sa.and_(OutboxRow.published_at.is_not(None), OutboxRow.published_at < before)
    return _remove(tx, OutboxRow, where, dry_run=dry_run)


def _remove(tx: Tx, table: type[Any], where: sa.ColumnElement[bool], *, dry_run: bool) -> int:
    """Delete the rows of ``table`` matching ``where``; how many (``dry_run``: count them)."""
    if dry_run:
        return tx.session.scalar(sa.select(sa.func.count()).where(where)) or 0
    return queries.changed(
        tx.session, sa.delete(table).where(where).execution_options(synchronize_session=False)
    )


#: Refusals of one kind (team, reason, sender, receiver) within this many seconds share one
#: ledger row, counted in its ``repeats``: a sender retrying a refused send does not grow the
#: ledger by a row per attempt.
REFUSAL_WINDOW_SECONDS = 60.0


def aggregate_refusal(tx: Tx, fields: dict[str, Any]) -> bool:
    """Count a refusal on the latest row of its kind within the window (locked); ``False``
    when there is none, and the refusal needs a row of its own."""
    team_id = fields.get("team_id")
    if team_id is None:
        return False
    now = utcnow()
    latest = tx.session.scalars(
        sa.select(LedgerRow)
        .where(
            LedgerRow.team_id == team_id,
            LedgerRow.action == LedgerAction.SEND_REJECTED,
            LedgerRow.created_at >= now - timedelta(seconds=REFUSAL_WINDOW_SECONDS),
        )
        .order_by(LedgerRow.id.desc())
        .limit(1)
        .with_for_update()
    ).one_or_none()
    key = ("reason", "sender", "to")
    if latest is None or any(latest.detail.get(k) != fields.get(k) for k in key):
        return False
    latest.detail = {
        **latest.detail,
        "repeats": int(latest.detail.get("repeats", 1)) + 1,
        "last_at": now.isoformat(),
        "message": fields.get("message", latest.detail.get("message")),
    }
    return True
