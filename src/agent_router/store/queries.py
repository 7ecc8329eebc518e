"""The shared reads (most of them under lock) and the transcript append that transitions are
built of. Functions of a session: the read views use them as well."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agent_router import errors
from agent_router.domain import (
    LedgerAction,
    MessageStatus,
)
from agent_router.store import refusals
from agent_router.store.models import (
    AgentRow,
    LedgerRow,
    MessageRow,
    OutboxRow,
    QuestionRow,
    TeamRow,
    TranscriptEntryRow,
    TurnRow,
)


def team(session: Session, team_id: int, *, lock: bool = False) -> TeamRow:
    stmt = sa.select(TeamRow).where(TeamRow.id == team_id)
    if lock:
        stmt = stmt.with_for_update(key_share=True)
    team = session.scalars(stmt).one_or_none()
    if team is None:
        raise refusals.error("unknown_team", team_id=team_id)
    return team


def agent_by_name(
    session: Session, team_id: int, name: str, *, lock: bool = False
) -> AgentRow | None:
    stmt = sa.select(AgentRow).where(AgentRow.team_id == team_id, AgentRow.display_name == name)
    if lock:
        # See _lock_agent: the locked read must replace a stale, unlocked copy.
        stmt = stmt.with_for_update(key_share=True).execution_options(populate_existing=True)
    return session.scalars(stmt).one_or_none()


#: Characters a name's key keeps: ASCII letters (lower-cased) and digits.
_KEY_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_KEY_LOWER = _KEY_UPPER.lower()
_NOT_KEY = re.compile(r"[^abcdefghijklmnopqrstuvwxyz0123456789]")
#: The shortest key a name given may have to be matched by prefix.
MIN_PREFIX_KEY = 3


def name_key(name: str) -> str:
    """A display name as it is compared for a suggestion: ASCII letters lower-cased, and
    nothing but ASCII letters and digits (``Full-Stack Engineer_1`` -> ``fullstackengineer1``).
    ``ar__name_key`` in postgresql/common.sql computes the same."""
    return _NOT_KEY.sub("", name.translate(str.maketrans(_KEY_UPPER, _KEY_LOWER)))


def unknown_agent(session: Session, team_id: int, name: str) -> errors.AgentRouterError:
    """The refusal of an agent name the team does not have, with the agent it was probably
    meant for (``close``; ``ar__unknown_agent`` in postgresql/common.sql finds the same)."""
    given = name_key(name)
    close: str | None = None
    if given:
        names = session.scalars(
            sa.select(AgentRow.display_name)
            .where(AgentRow.team_id == team_id)
            .order_by(AgentRow.id)
        ).all()
        keys = [(n, name_key(n)) for n in names]
        close = next((n for n, k in keys if k == given), None)
        if close is None and len(given) >= MIN_PREFIX_KEY:
            close = next(
                (n for n, k in keys if k and (k.startswith(given) or given.startswith(k))), None
            )
    guess = {"close": close} if close is not None else {}
    return refusals.error("unknown_agent", name=name, team_id=team_id, **guess)


def lock_agent(session: Session, agent_id: int) -> AgentRow | None:
    # populate_existing: a row this session read before taking the lock (a probe) would
    # otherwise keep its stale state, and a transition would act on what it was, not is.
    stmt = (
        sa.select(AgentRow)
        .where(AgentRow.id == agent_id)
        .with_for_update(key_share=True)
        .execution_options(populate_existing=True)
    )
    return session.scalars(stmt).one_or_none()


def mailbox_depth(session: Session, agent_id: int, *only: sa.ColumnElement[bool]) -> int:
    """Pending messages in the agent's mailbox (``only``: those that match these too)."""
    return (
        session.scalar(
            sa.select(sa.func.count())
            .select_from(MessageRow)
            .where(
                MessageRow.target_agent_id == agent_id,
                MessageRow.status == MessageStatus.PENDING,
                *only,
            )
        )
        or 0
    )


def waiting_question(session: Session, agent_id: int) -> QuestionRow | None:
    return session.scalars(
        sa.select(QuestionRow)
        .where(QuestionRow.asker_agent_id == agent_id, QuestionRow.waiting.is_(True))
        .with_for_update(key_share=True)
    ).one_or_none()


def open_tool_calls(session: Session, agent_id: int) -> list[str]:
    """Tool call ids of the last assistant message that have no result yet, in order."""
    last_assistant = session.scalars(
        sa.select(TranscriptEntryRow)
        .where(TranscriptEntryRow.agent_id == agent_id, TranscriptEntryRow.role == "assistant")
        .order_by(TranscriptEntryRow.position.desc())
        .limit(1)
    ).one_or_none()
    if last_assistant is None:
        return []
    calls = [str(c["id"]) for c in last_assistant.payload.get("tool_calls") or []]
    if not calls:
        return []
    answered = set(
        session.scalars(
            sa.select(TranscriptEntryRow.tool_call_id).where(
                TranscriptEntryRow.agent_id == agent_id,
                TranscriptEntryRow.position > last_assistant.position,
                TranscriptEntryRow.role == "tool",
            )
        )
    )
    return [c for c in calls if c not in answered]


def transcript_after(
    session: Session, agent_id: int, position: int | None, *, also: Sequence[int] = ()
) -> list[tuple[int, dict[str, Any]]]:
    """The agent's transcript entries after ``position`` (all with ``None``) and those at the
    positions ``also``, with their positions, in order."""
    stmt = sa.select(TranscriptEntryRow.position, TranscriptEntryRow.payload).where(
        TranscriptEntryRow.agent_id == agent_id
    )
    if position is not None:
        after = TranscriptEntryRow.position > position
        if also:
            after = sa.or_(after, TranscriptEntryRow.position.in_(sorted(set(also))))
        stmt = stmt.where(after)
    rows = session.execute(stmt.order_by(TranscriptEntryRow.position)).all()
    return [(p, payload) for p, payload in rows]


# Built once (appends and waiter lookups run on the hot path of every resolved wait).
_APPEND = sa.insert(cast("sa.Table", TranscriptEntryRow.__table__))

_WAITER_TURN = sa.select(TurnRow.id).where(
    TurnRow.agent_id == sa.bindparam("agent_id"), TurnRow.epoch == sa.bindparam("epoch")
)


def append(
    session: Session,
    agent: AgentRow,
    payload: dict[str, Any],
    *,
    turn_id: int | None,
    message_id: int | None = None,
    meta: dict[str, Any] | None = None,
) -> None:
    """One transcript entry at the end of ``agent``'s transcript, in one statement. The agent's
    row is locked (or was inserted in this transaction): its ``next_position`` is free, and is
    bumped with the agent's row."""
    position = agent.next_position
    agent.next_position = position + 1
    session.execute(
        _APPEND,
        {
            "agent_id": agent.id,
            "position": position,
            "role": payload["role"],
            "payload": payload,
            "meta": meta,
            "message_id": message_id,
            "tool_call_id": payload.get("tool_call_id"),
            "turn_id": turn_id,
        },
    )


def changed(session: Session, stmt: sa.Executable) -> int:
    """Run an UPDATE or a DELETE; how many rows it changed."""
    result = cast("sa.CursorResult[Any]", session.execute(stmt))
    return int(result.rowcount or 0)


def waiter_turn_id(session: Session, waiter: AgentRow, question: QuestionRow) -> int | None:
    return session.scalar(_WAITER_TURN, {"agent_id": waiter.id, "epoch": question.asker_epoch})


def cycle_through(session: Session, asker: AgentRow, target: AgentRow) -> list[str]:
    """The waits-for path target -> ... -> asker, if the new edge asker -> target closes one."""
    names = {
        a.id: a.display_name
        for a in session.scalars(sa.select(AgentRow).where(AgentRow.team_id == asker.team_id))
    }
    edges = dict(
        session.execute(
            sa.select(QuestionRow.asker_agent_id, QuestionRow.target_agent_id).where(
                QuestionRow.team_id == asker.team_id, QuestionRow.waiting.is_(True)
            )
        ).all()
    )
    path = [asker.id, target.id]
    current = target.id
    while current in edges:
        current = edges[current]
        path.append(current)
        if current == asker.id:
            return [names[i] for i in path]
        if len(path) > len(names) + 1:  # pragma: no cover - a cycle not through asker
            break
    return []


def unpublished_since(cutoff: datetime, limit: int) -> sa.Select[OutboxRow]:
    """Outbox rows never published and created at or before ``cutoff``, oldest first."""
    return (
        sa.select(OutboxRow)
        .where(OutboxRow.published_at.is_(None), OutboxRow.created_at <= cutoff)
        .order_by(OutboxRow.id)
        .limit(limit)
    )


def pending_wake(session: Session, agent_id: int) -> int:
    """Pending wake messages in the agent's mailbox."""
    return mailbox_depth(session, agent_id, MessageRow.wake.is_(True))


def stop_reason(session: Session, agent: AgentRow) -> str | None:
    """The reason of the agent's latest stop request (the lead's words, or a spent budget's),
    from its ``stop_requested`` ledger event: what the stop it honours at a boundary records."""
    detail = session.scalar(
        sa.select(LedgerRow.detail)
        .where(
            LedgerRow.team_id == agent.team_id,
            LedgerRow.agent_id == agent.id,
            LedgerRow.action == LedgerAction.STOP_REQUESTED,
        )
        .order_by(LedgerRow.id.desc())
        .limit(1)
    )
    reason = (detail or {}).get("reason")
    return reason if isinstance(reason, str) else None
