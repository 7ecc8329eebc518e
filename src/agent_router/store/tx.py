"""The unit of work: one transaction's session, settings, buffered ledger and buffered outbox.

Every transition is a function of a :class:`Tx`. Ledger events and outbox rows written through
it are buffered on the transaction: the ledger rows are inserted together just before commit,
and the outbox entries are handed to the store's publisher after commit (never before, never
for a transaction that rolled back).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Session, SessionTransaction

from agent_router import errors, limits
from agent_router.domain import LedgerAction, OutboxEntry, OutboxKind, RouteOutcome
from agent_router.logfields import get_logger
from agent_router.settings import Settings
from agent_router.store.models import AgentRow, LedgerRow, OutboxRow, utcnow

logger = get_logger("agent_router.store")

_LEDGER_BUFFER = "agent_router.ledger"

_Row = TypeVar("_Row")

_INSERT_OUTBOX = sa.insert(OutboxRow).returning(OutboxRow.id)
_INSERT_LEDGER = sa.insert(LedgerRow)


def written_published(
    kind: OutboxKind, now: Any, payload: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The publication columns of a new outbox row of ``kind``. A wake row is written marked
    published, as sent once: its signal only cuts a blocked call's sleep short, and a lost one
    is found by the call's periodic re-read of the database (``wake_recheck_seconds``) as soon
    as the sweeper would have sent it again. So nothing re-sends it, and no round trip after
    the commit marks it. So is a message to the user of a team with no user task: its signal
    only wakes the team's feed, whose readers read the database."""
    signal_only = kind is OutboxKind.DELIVER_USER and not (payload or {}).get("task")
    if kind is OutboxKind.WAKE_WAITER or signal_only:
        return {"published_at": now, "attempts": 1}
    return {"published_at": None, "attempts": 0}


class Refused(Exception):  # noqa: N818 - control flow, never escapes the store
    """Abort the transaction, then record a ledger event and raise ``error``."""

    def __init__(self, error: errors.AgentRouterError, action: LedgerAction, **ledger: Any) -> None:
        super().__init__(str(error))
        self.error = error
        self.action = action
        self.ledger = ledger


#: Detail fields a ledger event's log record carries too (scalars; no content, no name a
#: LogRecord attribute already has).
_LOGGED_DETAIL = (
    "trigger",
    "state",
    "failed",
    "suspended",
    "question_id",
    "count",
    "reason",
    # A model call's: which model, its tokens and cost.
    "model",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cost_usd",
)


class Tx:
    """One open transaction. ``entries``: the outbox rows it wrote, in order."""

    def __init__(self, session: Session, settings: Settings) -> None:
        self.session = session
        self.settings = settings
        self.entries: list[OutboxEntry] = []

    def ledger(self, action: LedgerAction, *, agent: str | None = None, **fields: Any) -> None:
        """A ledger event (:func:`ledger_row`), buffered: the transaction's events are written
        together just before it commits (one statement, no unit of work). Nothing reads the
        ledger inside a writing transaction. ``agent``: the display name its log line shows."""
        row = ledger_row(action, **fields)
        self.session.info.setdefault(_LEDGER_BUFFER, []).append(row)
        log_event(row, agent=agent)

    def added(self, row: _Row) -> _Row:
        """``row``, inserted now (its id and defaults are known when this returns)."""
        self.session.add(row)
        self.session.flush()
        return row

    def agent_ledger(self, action: LedgerAction, agent: AgentRow, **fields: Any) -> None:
        """A ledger event about ``agent``: its team and id are taken from the row."""
        self.ledger(
            action, agent=agent.display_name, team_id=agent.team_id, agent_id=agent.id, **fields
        )

    def outbox(self, agent: AgentRow, kind: OutboxKind, **payload: Any) -> OutboxEntry:
        """Write an outbox row for ``agent``'s current epoch; published after commit. A wake row
        is written marked published (see :func:`written_published`)."""
        if kind is OutboxKind.ENQUEUE_TURN:
            # Names for monitors (Flower shows the task as "UI Operator_1 (team 3) epoch 2"):
            # carried here so that publishing needs no extra read.
            payload = {"agent": agent.display_name, "team_id": agent.team_id, **payload}
            if agent.runner:  # a host owns the agent's turns: its task is published by name
                payload["task"] = agent.runner
        # A Core INSERT built once, not the unit of work: nothing reads the row back in this
        # transaction, and the publisher needs only its id.
        row_id = (
            self.session.connection()
            .execute(
                _INSERT_OUTBOX,
                {
                    "team_id": agent.team_id,
                    "agent_id": agent.id,
                    "kind": kind,
                    "epoch": agent.epoch,
                    "payload": payload,
                    **written_published(kind, utcnow(), payload),
                },
            )
            .scalar_one()
        )
        entry = OutboxEntry(
            id=row_id, kind=kind, agent_id=agent.id, epoch=agent.epoch, payload=payload
        )
        self.entries.append(entry)
        return entry

    @staticmethod
    def refuse(error: errors.AgentRouterError, action: LedgerAction, **ledger: Any) -> Refused:
        """A refusal to raise: the transaction rolls back, then ``action`` is ledgered with
        ``ledger`` in a transaction of its own and ``error`` reaches the caller."""
        return Refused(error, action, **ledger)


def ledger_row(
    action: LedgerAction,
    *,
    team_id: int | None,
    agent_id: int | None = None,
    outcome: RouteOutcome | None = None,
    message_id: int | None = None,
    turn_id: int | None = None,
    epoch: int | None = None,
    **detail: Any,
) -> dict[str, Any]:
    """A ledger event as the row it is written as; ``detail``: the event's own fields, made
    storable (:func:`limits.storable_json`: an event is never why its transaction fails)."""
    return {
        "team_id": team_id,
        "agent_id": agent_id,
        "action": action,
        "outcome": outcome,
        "message_id": message_id,
        "turn_id": turn_id,
        "epoch": epoch,
        "detail": limits.storable_json(detail),
        "created_at": utcnow(),
    }


def logging_events() -> bool:
    """Whether ledger events are logged (their log lines are INFO)."""
    return logger.isEnabledFor(logging.INFO)


def log_event(row: Mapping[str, Any], *, agent: str | None = None) -> None:
    """The log line of a ledger event, from its row (``action``, ``team_id``, ``agent_id`` and
    ``detail``; ``outcome``, ``message_id``, ``turn_id`` and ``epoch`` where it has them) and
    the ``agent``'s display name when the caller has it."""
    if not logger.isEnabledFor(logging.INFO):
        return
    action: LedgerAction = row["action"]
    outcome: RouteOutcome | None = row.get("outcome")
    detail: Mapping[str, Any] = row["detail"]
    logger.info(
        action.value,
        extra={
            "action": action.value,
            "team_id": row["team_id"],
            "agent": agent,
            "agent_id": row["agent_id"],
            "outcome": outcome.value if outcome else None,
            "message_id": row.get("message_id"),
            "turn_id": row.get("turn_id"),
            "epoch": row.get("epoch"),
            # What the event's detail says of a turn or a question, for the log line.
            **{k: detail[k] for k in _LOGGED_DETAIL if detail.get(k) is not None},
        },
    )


def write_ledger_buffer(session: Session) -> None:
    rows = session.info.pop(_LEDGER_BUFFER, None)
    if rows:
        session.flush()  # the rows they name exist first
        session.connection().execute(_INSERT_LEDGER, rows)


def drop_ledger_buffer(session: Session, transaction: SessionTransaction) -> None:
    # A rolled-back transaction's events never happened. Only the outermost transaction counts:
    # every flush runs in a subtransaction of its own.
    if transaction.parent is None:
        session.info.pop(_LEDGER_BUFFER, None)


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
        # The latest refusal's code and fields: its sentence is the one shown.
        **{k: fields[k] for k in ("refused", "fields") if fields.get(k) is not None},
    }
    return True
