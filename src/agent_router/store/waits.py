"""Waits-for edges under the team lock: ask, wait for an output, expire, release."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

import sqlalchemy as sa

from agent_router.domain import (
    AgentState,
    Delivery,
    LedgerAction,
    MessageStatus,
    MessageSubtype,
    MessageType,
    Question,
    QuestionKind,
    QuestionStatus,
    TurnRecord,
)
from agent_router.store import queries, refusals, routing, turns, values
from agent_router.store.decisions import close_question, move
from agent_router.store.models import (
    AgentRow,
    MessageRow,
    QuestionRow,
    utcnow,
)
from agent_router.store.rules import EXPIRED_RESULT
from agent_router.store.tx import Refused, Tx
from agent_router.store.values import Ask


@dataclass(frozen=True)
class WaitEdge:
    """A waits-for edge that :func:`open_wait_edge` checked: the waiting turn, the locked rows
    of its agent and of the agent waited on (``target`` by name), the tool call that waits,
    and what ends the wait."""

    turn: TurnRecord
    waiter: AgentRow
    target_row: AgentRow
    target: str
    tool_call_id: str
    kind: QuestionKind


class _Wait(NamedTuple):
    operation: str  # what the fence check of the waiting turn names
    verb: str  # what its refusals say it would do
    action: LedgerAction  # the ledger event of an opened wait


_WAITS = {
    QuestionKind.ASK: _Wait("ask", "ask", LedgerAction.ASK),
    QuestionKind.OUTPUT: _Wait("wait_output", "wait", LedgerAction.WAIT_OUTPUT),
}


def open_wait_edge(
    tx: Tx, turn: TurnRecord, target: str, tool_call_id: str, kind: QuestionKind
) -> WaitEdge:
    """The checks before a new waits-for edge (an ask, or a wait for an output), under the
    team lock that serializes edge creation, then both agents' locks by id. Refused (a
    ledger event, no wait) for an unknown, terminated or same target, a tool call that is not
    open, or an edge that would close a cycle."""
    session = tx.session
    operation, verb, _action = _WAITS[kind]
    probe = session.get(AgentRow, turn.agent_id)
    if probe is None:
        raise refusals.error("no_agent_id", agent_id=turn.agent_id)
    team_id = probe.team_id
    queries.team(tx.session, team_id, lock=True)
    target_row = queries.agent_by_name(tx.session, team_id, target)

    def refuse(reason: str, code: str, cycle: list[str] | None = None, **fields: Any) -> Refused:
        return wait_refusal(turn, team_id, target, reason, code, cycle=cycle, kind=kind, **fields)

    if target_row is None:
        raise refuse("unknown_target", "ask_unknown_target")
    for agent_id in sorted({turn.agent_id, target_row.id}):
        queries.lock_agent(tx.session, agent_id)
    waiter, _row = turns.fenced(tx, turn, operation)
    if target_row.id == waiter.id:
        raise refuse("self", "ask_self" if verb == "ask" else "wait_self")
    if target_row.state is AgentState.TERMINATED:
        raise refuse("terminated", "ask_terminated")
    if tool_call_id not in queries.open_tool_calls(tx.session, waiter.id):
        raise tx.refuse(
            refusals.error("not_open_tool_call", call=tool_call_id),
            LedgerAction.ASK_REFUSED,
            team_id=team_id,
            agent_id=waiter.id,
            turn_id=turn.id,
            reason="bad_tool_call_id",
        )
    cycle = queries.cycle_through(tx.session, waiter, target_row)
    if cycle:
        raise refuse("cycle", "cycle", cycle=cycle, verb=verb)
    return WaitEdge(
        turn=turn,
        waiter=waiter,
        target_row=target_row,
        target=target,
        tool_call_id=tool_call_id,
        kind=kind,
    )


def open_question(
    tx: Tx, edge: WaitEdge, timeout_seconds: float | None, **detail: Any
) -> QuestionRow:
    """The new waits-for edge (checked by :func:`open_wait_edge`): an open question with
    its deadline, and the waiter ``waiting``, blocking in its worker; ledgered as an ``ask``
    or a ``wait_output`` with ``detail``."""
    waiter = edge.waiter
    timeout = timeout_seconds or tx.settings.question_timeout_seconds
    question = tx.added(
        QuestionRow(
            team_id=waiter.team_id,
            asker_agent_id=waiter.id,
            target_agent_id=edge.target_row.id,
            tool_call_id=edge.tool_call_id,
            asker_epoch=waiter.epoch,
            status=QuestionStatus.OPEN,
            kind=edge.kind,
            waiting=True,
            deadline=utcnow() + timedelta(seconds=timeout),
        )
    )
    move(waiter, AgentState.WAITING)
    waiter.suspended = False
    tx.agent_ledger(
        _WAITS[edge.kind].action,
        waiter,
        turn_id=edge.turn.id,
        epoch=waiter.epoch,
        question_id=question.id,
        target=edge.target,
        **detail,
    )
    return question


def ask(tx: Tx, turn: TurnRecord, asked: Ask) -> tuple[Question, Delivery]:
    """Open a question from the turn's agent to ``asked.target`` and put the asker in
    ``waiting``.

    Refused (no wait, a ledger event) when it asks oneself, targets a terminated or unknown
    agent, or would close a cycle in the team's waits-for graph."""
    edge = open_wait_edge(tx, turn, asked.target, asked.tool_call_id, QuestionKind.ASK)
    q = open_question(tx, edge, asked.timeout_seconds)
    delivery = routing.route(tx, asked.message(edge.waiter.team_id, edge.waiter.display_name, q.id))
    return values.question(q), delivery


def expire_questions(tx: Tx, *, question_id: int | None = None) -> int:
    """Resolve open questions past their deadline with an ``expired`` tool result; the asker
    continues (woken if blocked, a continuation turn if suspended)."""
    session = tx.session
    expired = 0
    stmt = sa.select(QuestionRow.id).where(
        QuestionRow.status == QuestionStatus.OPEN, QuestionRow.deadline <= utcnow()
    )
    if question_id is not None:
        stmt = stmt.where(QuestionRow.id == question_id)
    overdue = session.scalars(stmt.order_by(QuestionRow.team_id, QuestionRow.id)).all()
    for qid in overdue:
        question = session.get(QuestionRow, qid)
        assert question is not None
        asker = queries.lock_agent(tx.session, question.asker_agent_id)
        assert asker is not None
        session.refresh(question, with_for_update=True)
        if question.status is not QuestionStatus.OPEN:
            continue
        close_question(question, QuestionStatus.EXPIRED)
        expired += 1
        tx.agent_ledger(
            LedgerAction.QUESTION_EXPIRED,
            asker,
            question_id=qid,
            waiting=question.waiting,
        )
        if question.waiting:
            routing.release(tx, asker, question, EXPIRED_RESULT)
    return expired


def wait_output(
    tx: Tx,
    turn: TurnRecord,
    *,
    target: str,
    tool_call_id: str,
    timeout_seconds: float | None = None,
) -> Question:
    """The lead waits for ``target``'s next output (a waits-for edge lead -> target, checked
    for cycles like an ask). An output of ``target`` already in the lead's mailbox is
    consumed at once; otherwise the lead is ``waiting`` until one arrives."""
    edge = open_wait_edge(tx, turn, target, tool_call_id, QuestionKind.OUTPUT)
    ready = _ready_output(tx, edge)
    q = open_question(tx, edge, timeout_seconds, ready=ready is not None)
    if ready is not None:
        close_question(q, QuestionStatus.ANSWERED, answer_message_id=ready.id)
        # The blocking path: state back to running, the wake signal unneeded but harmless.
        routing.resolve_waiter(tx, edge.waiter, q, ready)
    return values.question(q)


def _ready_output(tx: Tx, edge: WaitEdge) -> MessageRow | None:
    """An output of the agent waited on already pending for the waiter. Refused when there is
    none and that agent rests with nothing to work on (it would never produce one)."""
    target_row = edge.target_row
    ready = tx.session.scalars(
        sa.select(MessageRow)
        .where(
            MessageRow.target_agent_id == edge.waiter.id,
            MessageRow.source_agent_id == target_row.id,
            MessageRow.type == MessageType.OUTPUT,
            # A report ends the wait; progress narration does not.
            sa.or_(
                MessageRow.subtype.is_(None),
                MessageRow.subtype != MessageSubtype.PROGRESS_OUTPUT,
            ),
            MessageRow.status == MessageStatus.PENDING,
        )
        .order_by(MessageRow.seq)
        .limit(1)
    ).one_or_none()
    if (
        ready is None
        and target_row.state in (AgentState.IDLE, AgentState.COMPLETED)
        and not queries.pending_wake(tx.session, target_row.id)
    ):
        raise wait_refusal(
            edge.turn,
            edge.waiter.team_id,
            edge.target,
            "not_working",
            "not_working",
            kind=edge.kind,
            state=target_row.state.value,
        )
    return ready


def wait_refusal(
    turn: TurnRecord,
    team_id: int,
    target: str,
    reason: str,
    code: str,
    *,
    cycle: list[str] | None = None,
    kind: QuestionKind = QuestionKind.ASK,
    **fields: Any,
) -> Refused:
    """A refused wait edge: the tool gets :class:`AskRefusedError`, the ledger ``ask_refused``
    (with the wait's kind when it is not an ask)."""
    extra = {"kind": kind.value} if kind is not QuestionKind.ASK else {}
    return Refused(
        refusals.error(code, target=target, cycle=cycle or [], **fields),
        LedgerAction.ASK_REFUSED,
        team_id=team_id,
        agent_id=turn.agent_id,
        turn_id=turn.id,
        epoch=turn.epoch,
        reason=reason,
        target=target,
        cycle=cycle or [],
        **extra,
    )
