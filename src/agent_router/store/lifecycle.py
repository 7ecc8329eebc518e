"""Storage lifecycle: deleting a team with every row it owns, and retention (finished teams,
published outbox rows and routine ledger events older than a cutoff).

Some rows are still owed to someone (:data:`OWED`): undelivered mail, open questions, a team
waiting for its spent budget to be raised, unpublished outbox rows, and the transcripts of
agents a turn is at work on (scheduled, running, waiting). A prune keeps every team that owes
any, and a deletion of a team that owes some is refused, unless asked to drop them
(``include_undelivered``); then what it dropped is ledgered (``owed_dropped``: the kinds, the
rows' ids, each message's sender, receiver and opening) in an event written after the team's
rows are gone, which outlives the team (a ledger event of a team alone has no foreign key).

A deleted team's queued turn tasks are fenced by the deletion itself: a task whose agent row is
gone claims nothing, and a turn still running finds its agent gone at its next write (a stale
turn) and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from agent_router.domain import (
    TURN_STATES,
    AgentState,
    LedgerAction,
    MessageStatus,
    QuestionStatus,
)
from agent_router.store import queries, refusals
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
    UserMessageRow,
)
from agent_router.store.tx import Tx
from agent_router.store.values import Deletion

#: A new transaction of the store, as a context manager (``SqliteStore._tx``): a prune runs several.
Transact = Callable[[], AbstractContextManager[Tx]]

#: Teams deleted by one prune transaction; a prune runs batches until none is left.
PRUNE_BATCH = 200

_BUSY_STATES = frozenset({AgentState.SCHEDULED, *TURN_STATES})


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
        (UserMessageRow, UserMessageRow.team_id.in_(teams)),
        (QuarantineRow, QuarantineRow.team_id.in_(teams)),
        (BudgetRow, BudgetRow.team_id.in_(teams)),
        (MessageRow, MessageRow.team_id.in_(teams)),
        (QuestionRow, QuestionRow.team_id.in_(teams)),
        (TurnRow, TurnRow.team_id.in_(teams)),
        (AgentRow, AgentRow.team_id.in_(teams)),
        (TeamRow, TeamRow.id.in_(teams)),
    ]


def _owed(
    of: Callable[[Any], sa.ColumnElement[bool]],
) -> dict[str, tuple[type[Any], sa.ColumnElement[bool]]]:
    """What a team may still owe someone, by kind: the table and the condition that find its
    rows of that kind (``of``: how a row's team id names the teams meant). Each kind is a
    reason to keep a team."""
    return {
        "undelivered_messages": (
            MessageRow,
            sa.and_(of(MessageRow.team_id), MessageRow.status == MessageStatus.PENDING),
        ),
        "open_questions": (
            QuestionRow,
            sa.and_(of(QuestionRow.team_id), QuestionRow.status == QuestionStatus.OPEN),
        ),
        "spent_budget": (
            BudgetRow,
            sa.and_(of(BudgetRow.team_id), BudgetRow.exhausted.is_not(None)),
        ),
        "unpublished_outbox": (
            OutboxRow,
            sa.and_(of(OutboxRow.team_id), OutboxRow.published_at.is_(None)),
        ),
        "current_transcripts": (
            AgentRow,
            sa.and_(of(AgentRow.team_id), AgentRow.state.in_(_BUSY_STATES)),
        ),
    }


#: The kinds of rows still owed to someone.
OWED = tuple(_owed(lambda team_id: team_id == 0))
#: Rows of each kind an ``owed_dropped`` event names (their count is always whole).
OWED_LISTED = 100


def owed(tx: Tx, team_ids: list[int]) -> dict[str, int]:
    """What the teams ``team_ids`` still owe, by kind (kinds they owe nothing of left out)."""
    found: dict[str, int] = {}
    for kind, (_table, where) in _owed(lambda team_id: team_id.in_(team_ids)).items():
        count = tx.session.scalar(sa.select(sa.func.count()).where(where)) or 0
        if count:
            found[kind] = count
    return found


def _record_drop(tx: Tx, team_id: int, owed_rows: dict[str, int], *, by: str) -> None:
    """Ledger what a deletion of ``team_id`` drops that was owed (read before the deletion;
    the event is written after it, with the transaction's other events, and outlives the
    team)."""
    session = tx.session
    messages = session.execute(
        sa.select(MessageRow.id, MessageRow.source_name, AgentRow.display_name, MessageRow.content)
        .join(AgentRow, AgentRow.id == MessageRow.target_agent_id)
        .where(MessageRow.team_id == team_id, MessageRow.status == MessageStatus.PENDING)
        .order_by(MessageRow.id)
        .limit(OWED_LISTED)
    ).all()
    questions = session.scalars(
        sa.select(QuestionRow.id)
        .where(QuestionRow.team_id == team_id, QuestionRow.status == QuestionStatus.OPEN)
        .order_by(QuestionRow.id)
        .limit(OWED_LISTED)
    ).all()
    tx.ledger(
        LedgerAction.OWED_DROPPED,
        team_id=team_id,
        by=by,
        owed=owed_rows,
        messages=[{"id": m[0], "from": m[1], "to": m[2], "content": m[3][:200]} for m in messages],
        questions=list(questions),
    )


def delete_teams(
    tx: Tx,
    team_ids: list[int],
    *,
    dry_run: bool,
    outbox_pruned_before: datetime | None = None,
    include_undelivered: bool = False,
    by: str = "delete",
    idle_since: datetime | None = None,
) -> Deletion:
    """Delete the teams ``team_ids`` (locked first) and every row they own. A team that still
    owes rows (:data:`OWED`) is refused (:class:`~agent_router.errors.OwedRowsError`), or with
    ``include_undelivered`` deleted and what it owed ledgered. With ``idle_since`` (a prune,
    which chose the teams before locking them), a team that became active since then or owes
    rows now (a send that committed in between) is kept, not deleted nor refused: it is in
    the result's ``kept``."""
    session = tx.session
    locked = list(
        session.scalars(
            sa.select(TeamRow.id)
            .where(TeamRow.id.in_(team_ids))
            .order_by(TeamRow.id)
            .with_for_update()
        ).all()
    )
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
    owed_rows: dict[str, int] = {}
    per_team = {team_id: owed(tx, [team_id]) for team_id in locked}
    kept: list[int] = []
    if idle_since is not None:
        # Read again under the locks: what committed since the teams were chosen is seen now.
        live = set(
            session.scalars(
                sa.select(TeamRow.id).where(TeamRow.id.in_(locked), _live(TeamRow.id, idle_since))
            ).all()
        )
        kept = [t for t in locked if t in live or (per_team[t] and not include_undelivered)]
        locked = [t for t in locked if t not in kept]
        per_team = {t: found for t, found in per_team.items() if t in locked}
        if not locked:
            return Deletion(dry_run=dry_run, kept=tuple(kept))
    for team_id, found in per_team.items():
        if found and not include_undelivered:
            raise refusals.error("owed_rows", team_id=team_id, owed=found)
        for kind, count in found.items():
            owed_rows[kind] = owed_rows.get(kind, 0) + count
    if not dry_run:
        for team_id, found in per_team.items():
            if found:
                _record_drop(tx, team_id, found, by=by)
    teams = sa.select(TeamRow.id).where(TeamRow.id.in_(locked)).scalar_subquery()
    questions = session.scalars(
        sa.select(QuestionRow.id)
        .where(QuestionRow.team_id.in_(teams), QuestionRow.status == QuestionStatus.OPEN)
        .order_by(QuestionRow.id)
    ).all()
    rows: dict[str, int] = {}
    for table, where in _team_rows(teams, outbox_pruned_before):
        rows[str(table.__tablename__)] = _remove(tx, table, where, dry_run=dry_run)
    return Deletion(
        teams=tuple(locked),
        rows=rows,
        questions=tuple(questions),
        dry_run=dry_run,
        owed=owed_rows,
        kept=tuple(kept),
    )


def delete_team(
    tx: Tx, team_id: int, *, dry_run: bool, include_undelivered: bool = False
) -> Deletion:
    deletion = delete_teams(tx, [team_id], dry_run=dry_run, include_undelivered=include_undelivered)
    if not deletion.teams:
        raise refusals.error("unknown_team", team_id=team_id)
    return deletion


def _live(team_id: sa.orm.InstrumentedAttribute[int], since: datetime) -> sa.ColumnElement[bool]:
    """Is the team ``team_id`` at work (an agent scheduled, running or waiting), or was it
    active since ``since``? Activity is read from rows that ledger retention never deletes (the
    messages, turns, model calls and agents of the team) as well as from the ledger, so a team
    whose routine events were deleted is still seen as active by its last message or turn."""
    return sa.or_(
        sa.select(AgentRow.id)
        .where(AgentRow.team_id == team_id, AgentRow.state.in_(_BUSY_STATES))
        .exists(),
        sa.select(AgentRow.id)
        .where(AgentRow.team_id == team_id, AgentRow.created_at >= since)
        .exists(),
        sa.select(MessageRow.id)
        .where(MessageRow.team_id == team_id, MessageRow.created_at >= since)
        .exists(),
        sa.select(TurnRow.id)
        .where(
            TurnRow.team_id == team_id,
            sa.or_(TurnRow.started_at >= since, TurnRow.ended_at >= since),
        )
        .exists(),
        sa.select(ModelCallRow.id)
        .where(ModelCallRow.team_id == team_id, ModelCallRow.created_at >= since)
        .exists(),
        sa.select(LedgerRow.id)
        .where(LedgerRow.team_id == team_id, LedgerRow.created_at >= since)
        .exists(),
    )


def finished_teams(
    tx: Tx, *, before: datetime, limit: int, after: int = 0, include_undelivered: bool = False
) -> tuple[list[int], list[int]]:
    """Teams (ids above ``after``) with nothing in flight (no agent scheduled, running or
    waiting) and no activity since ``before`` (:func:`_live`): those that owe nothing else
    (with ``include_undelivered``: every one), and those kept because they do."""
    owing = sa.or_(
        *(
            sa.select(table).where(where).exists()
            for table, where in _owed(lambda team_id: team_id == TeamRow.id).values()
        )
    )
    rows = tx.session.execute(
        sa.select(TeamRow.id, owing)
        .where(TeamRow.id > after, TeamRow.created_at < before, ~_live(TeamRow.id, before))
        .order_by(TeamRow.id)
        .limit(limit)
    ).all()
    finished = [team for team, owes in rows if include_undelivered or not owes]
    kept = [team for team, owes in rows if owes and not include_undelivered]
    return finished, kept


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


#: The ledger events a retention by age deletes: the record of routine work, one or more per
#: message routed. Every other action stays until its team is deleted: what ``check`` reads
#: (stops that keep mail, failed turns, refused outputs), what the store reads back (a stop's
#: reason, the latest refusal it counts repeats on), and the rare events that explain a repair
#: (take-overs, re-enqueues, fenced writes, quarantines, drops, budgets, terminations).
ROUTINE_LEDGER = frozenset(
    {
        LedgerAction.ROUTE,
        LedgerAction.DUPLICATE_SEND,
        LedgerAction.TURN_CLAIMED,
        LedgerAction.DRAIN,
        LedgerAction.TURN_ENDED,  # but not a failed turn's: check reports it
        LedgerAction.FOLLOW_UP,
        LedgerAction.ASK,
        LedgerAction.WAIT_OUTPUT,
        LedgerAction.QUESTION_RESOLVED,
        LedgerAction.OUTBOX_PUBLISHED,
        LedgerAction.MODEL_CALL,
        LedgerAction.JOB_STARTED,
        LedgerAction.JOB_FINISHED,
    }
)
#: Ledger rows one retention transaction deletes; a sweeper pass deletes one batch.
LEDGER_PRUNE_BATCH = 5000


def prune_ledger(tx: Tx, *, before: datetime, limit: int, dry_run: bool) -> int:
    """Delete up to ``limit`` routine ledger events (:data:`ROUTINE_LEDGER`) older than
    ``before``, oldest first; how many (``dry_run``: count every one, delete none)."""
    failed = LedgerRow.detail["failed"].as_boolean()
    where = sa.and_(
        LedgerRow.created_at < before,
        LedgerRow.action.in_(ROUTINE_LEDGER),
        sa.or_(LedgerRow.action != LedgerAction.TURN_ENDED, failed.is_(None), failed.is_(False)),
    )
    if dry_run:
        return tx.session.scalar(sa.select(sa.func.count()).where(where)) or 0
    batch = sa.select(LedgerRow.id).where(where).order_by(LedgerRow.id).limit(limit)
    return queries.changed(
        tx.session,
        sa.delete(LedgerRow)
        .where(LedgerRow.id.in_(batch.scalar_subquery()))
        .execution_options(synchronize_session=False),
    )


def prune_ledger_batches(
    transact: Transact, *, before: datetime, dry_run: bool, batches: int | None
) -> int:
    """Delete routine ledger events older than ``before`` (:func:`prune_ledger`), a batch per
    transaction of ``transact``, at most ``batches`` of them (``None``: until none is left);
    how many (``dry_run``: count them in one transaction, delete none)."""
    if dry_run:
        with transact() as tx:
            return prune_ledger(tx, before=before, limit=0, dry_run=True)

    def batch() -> int:
        with transact() as tx:
            return prune_ledger(tx, before=before, limit=LEDGER_PRUNE_BATCH, dry_run=False)

    return ledger_batches(batch, batches)


def ledger_batches(batch: Callable[[], int], batches: int | None) -> int:
    """Run ``batch`` (one transaction deleting up to :data:`LEDGER_PRUNE_BATCH` events; how
    many it deleted) until one deletes fewer, at most ``batches`` times (``None``: no limit);
    how many were deleted in all."""
    deleted = 0
    done = 0
    while batches is None or done < batches:
        count = batch()
        deleted += count
        done += 1
        if count < LEDGER_PRUNE_BATCH:
            break
    return deleted


def prune(
    transact: Transact, *, before: datetime, dry_run: bool, include_undelivered: bool
) -> Deletion:
    """Delete the published outbox rows older than ``before``, then the finished teams idle
    since then (:func:`finished_teams`, :func:`delete_teams`), :data:`PRUNE_BATCH` teams per
    transaction of ``transact``; what was deleted, summed over the batches."""
    with transact() as tx:  # first, so that a dry run counts each row once
        published = prune_outbox(tx, before=before, dry_run=dry_run)

    def batch(after: int) -> tuple[Deletion, int]:
        with transact() as tx:
            chosen, held = finished_teams(
                tx,
                before=before,
                limit=PRUNE_BATCH,
                after=after,
                include_undelivered=include_undelivered,
            )
            deletion = delete_teams(
                tx,
                chosen,
                dry_run=dry_run,
                outbox_pruned_before=before,
                include_undelivered=include_undelivered,
                by="prune",
                idle_since=before,
            )
        return replace(deletion, kept=(*held, *deletion.kept)), len(chosen) + len(held)

    return team_batches(published, batch, dry_run=dry_run)


def team_batches(
    published: int, batch: Callable[[int], tuple[Deletion, int]], *, dry_run: bool
) -> Deletion:
    """A prune's teams, batch after batch: ``batch(after)`` deletes (or counts) one batch of
    the teams with ids above ``after`` in a transaction of its own, and returns what it did
    (every team it looked at and kept in its ``kept``) and how many teams it looked at; fewer
    than :data:`PRUNE_BATCH` ends the prune. What was deleted, summed over the batches, with
    the ``published`` outbox rows the prune deleted first."""
    teams: list[int] = []
    kept: list[int] = []
    rows: dict[str, int] = {}
    owed: dict[str, int] = {}
    questions: list[int] = []
    while True:
        deletion, looked_at = batch(max(teams + kept, default=0))
        teams += deletion.teams
        kept += deletion.kept
        questions += deletion.questions
        for name, count in deletion.rows.items():
            rows[name] = rows.get(name, 0) + count
        for kind, count in deletion.owed.items():
            owed[kind] = owed.get(kind, 0) + count
        if looked_at < PRUNE_BATCH:
            break
    rows["ar_outbox"] = rows.get("ar_outbox", 0) + published
    return Deletion(
        teams=tuple(teams),
        rows=rows,
        questions=tuple(questions),
        dry_run=dry_run,
        owed=owed,
        kept=tuple(kept),
    )
