"""Routing: accept a message and deliver it by the receiver's state, resolve a waiter, schedule
a turn. The lock: the target agent's row (and the question an answer answers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import aliased

from agent_router import errors, formats
from agent_router.constants import wake_token
from agent_router.domain import (
    AgentState,
    Delivery,
    LedgerAction,
    MessageStatus,
    MessageType,
    OutboxKind,
    QuestionKind,
    QuestionStatus,
    RouteOutcome,
    TurnTrigger,
)
from agent_router.store import decisions, queries, refusals, values
from agent_router.store.decisions import close_question, move
from agent_router.store.models import (
    AgentRow,
    MessageRow,
    QuestionRow,
    utcnow,
)
from agent_router.store.rules import is_external
from agent_router.store.tx import Refused, Tx
from agent_router.store.values import SendRequest

#: The sender name of the person in the chat.
USER = "user"


# The first statement of every send, built once (it runs on the hot path): lock the target and
# take its next sequence number, returning it with the sender's id and state.
_sender = aliased(AgentRow, name="sender")

_of_sender = sa.select(_sender.id).where(
    _sender.team_id == sa.bindparam("b_team"), _sender.display_name == sa.bindparam("b_sender")
)

_LOCK_TARGET = (
    sa.update(AgentRow)
    .where(
        AgentRow.team_id == sa.bindparam("b_team"), AgentRow.display_name == sa.bindparam("b_to")
    )
    .values(next_seq=AgentRow.next_seq + 1)
    .returning(
        AgentRow,
        _of_sender.scalar_subquery(),
        _of_sender.with_only_columns(_sender.state).scalar_subquery(),
    )
    .execution_options(populate_existing=True, synchronize_session=False)
)


_INSERT_MESSAGE = sa.insert(MessageRow).returning(MessageRow.id)


def route(tx: Tx, req: SendRequest) -> Delivery:
    """Accept one message and deliver it by the receiver's state (:func:`decisions.decide`)."""
    target, source_id = _lock_target(tx, req)
    if req.dedup_key is not None:
        duplicate = _duplicate(tx, req, target)
        if duplicate is not None:
            return duplicate
    state_before = target.state
    answered = question_for_answer(tx, req, target) if req.type is MessageType.ANSWER else None
    waiting_on = _waiting_on(tx, target, answered)
    # Decided from the state before anything changes, so the row is inserted once, final.
    outcome = decisions.decide(
        target.state,
        None if waiting_on is None else values.question(waiting_on),
        decisions.Incoming(
            type=req.type,
            sender_id=source_id,
            wake=req.wake,
            answers=answered.id if answered is not None else None,
            subtype=req.subtype,
            from_user=req.sender == USER,
        ),
    )
    msg = _insert_message(
        tx, req, target, source_id=source_id, outcome=outcome, waiting_on=waiting_on
    )
    if answered is not None:
        close_question(answered, QuestionStatus.ANSWERED, answer_message_id=msg.id)
    if outcome is RouteOutcome.RESOLVED:
        assert waiting_on is not None
        if waiting_on is not answered:
            # The report ends an output wait; any message of the asked agent to the asker is
            # its answer: either way the question is answered by this message, delivered once.
            close_question(waiting_on, QuestionStatus.ANSWERED, answer_message_id=msg.id)
        resolve_waiter(tx, target, waiting_on, msg, turn_id=msg.consumed_turn_id)
    elif outcome is RouteOutcome.TRIGGERED_NEW_TURN:
        schedule(tx, target, TurnTrigger.NEW)
    tx.agent_ledger(
        LedgerAction.ROUTE,
        target,
        outcome=outcome,
        message_id=msg.id,
        epoch=target.epoch,
        **route_detail(req, msg.seq, state_before, target.state),
    )
    return _delivery(target, msg)


def route_detail(
    req: SendRequest, seq: int, before: AgentState, after: AgentState
) -> dict[str, Any]:
    """The detail of a route's ledger event: the message's sequence number, type, sender and
    wake flag, and the receiver's state before and after."""
    return {
        "seq": seq,
        "type": req.type.value,
        "sender": req.sender,
        "wake": req.wake,
        "state_before": before.value,
        "state_after": after.value,
    }


def send_many(tx: Tx, reqs: Sequence[SendRequest]) -> list[Delivery]:
    """Several messages of one team in this one transaction, each routed as :func:`route`
    routes it, their targets locked in ascending id order (the canonical lock order); the
    deliveries come back in the order given."""
    team_ids = {req.team_id for req in reqs}
    if len(team_ids) > 1:
        raise errors.InvalidMessageError("the messages of one send_many go to one team")
    if not reqs:
        return []
    found = tx.session.execute(
        sa.select(AgentRow.display_name, AgentRow.id).where(
            AgentRow.team_id == reqs[0].team_id,
            AgentRow.display_name.in_({req.to for req in reqs}),
        )
    )
    ids = {name: agent_id for name, agent_id in found}
    # Unknown targets first: the refusal comes before any lock is taken.
    order = sorted(range(len(reqs)), key=lambda i: (ids.get(reqs[i].to, 0), i))
    deliveries: dict[int, Delivery] = {i: route(tx, reqs[i]) for i in order}
    return [deliveries[i] for i in range(len(reqs))]


def _waiting_on(tx: Tx, target: AgentRow, answered: QuestionRow | None) -> QuestionRow | None:
    """The question a waiting target is blocked on (``None`` unless it is waiting)."""
    if target.state is not AgentState.WAITING:
        return None
    # An answer usually answers the very question waited on: then it is read once.
    if answered is not None and answered.waiting:
        return answered
    return queries.waiting_question(tx.session, target.id)


def _lock_target(tx: Tx, req: SendRequest) -> tuple[AgentRow, int | None]:
    """The locked target row (its next sequence number taken) and the sender's id; refused for
    an unknown team, target or sender, a self-send, and a terminated target or sender."""
    # One statement locks the target, takes its next sequence number and reads its state
    # (UPDATE ... RETURNING: the row lock of an UPDATE that changes no key column is the
    # same FOR NO KEY UPDATE lock), and reads the sender's id and state on the way. A refusal
    # rolls the increment back with everything else.
    found = tx.session.execute(
        _LOCK_TARGET, {"b_team": req.team_id, "b_to": req.to, "b_sender": req.sender}
    ).one_or_none()
    if found is None:
        queries.team(tx.session, req.team_id)  # an unknown team says so, not "unknown agent"
        resolve_sender(req, sender_of(tx, req))
        raise reject(req, "unknown_target", queries.unknown_agent(tx.session, req.team_id, req.to))
    target, source_id, source_state = found
    source_id = resolve_sender(req, (source_id, source_state))
    if source_id == target.id:
        raise reject(req, "self_send", refusals.error("self_send"))
    if target.state is AgentState.TERMINATED:
        raise reject(req, "terminated", refusals.error("terminated", name=req.to))
    return target, source_id


def _duplicate(tx: Tx, req: SendRequest, target: AgentRow) -> Delivery | None:
    """The first delivery of ``req.dedup_key`` to ``target``, if there was one."""
    first = tx.session.scalars(
        sa.select(MessageRow).where(
            MessageRow.target_agent_id == target.id, MessageRow.dedup_key == req.dedup_key
        )
    ).one_or_none()
    if first is None:
        return None
    if (first.content, first.source_name, first.type, first.subtype, first.question_id) != (
        req.content,
        req.sender,
        req.type,
        req.subtype,
        req.question_id,
    ):
        raise reject(
            req,
            "dedup_conflict",
            refusals.error(
                "dedup_conflict",
                dedup_key=req.dedup_key,
                message_id=first.id,
                target=target.display_name,
            ),
        )
    target.next_seq -= 1  # no new message: give the number back
    tx.agent_ledger(
        LedgerAction.DUPLICATE_SEND,
        target,
        outcome=first.outcome,
        message_id=first.id,
        dedup_key=req.dedup_key,
    )
    return _delivery(target, first, duplicate=True)


def _delivery(target: AgentRow, msg: MessageRow, *, duplicate: bool = False) -> Delivery:
    """What a send returns: ``msg``, as routed to ``target`` (``duplicate``: a retried send
    found it, the first delivery of its dedup key)."""
    return Delivery(
        message_id=msg.id,
        outcome=msg.outcome,
        target=target.display_name,
        seq=msg.seq,
        epoch=target.epoch,
        duplicate=duplicate,
    )


def _insert_message(
    tx: Tx,
    req: SendRequest,
    target: AgentRow,
    *,
    source_id: int | None,
    outcome: RouteOutcome,
    waiting_on: QuestionRow | None,
) -> MessageRow:
    """The message row, final as inserted: a resolving message is delivered as it is inserted,
    into the turn that waits for it."""
    resolves = outcome is RouteOutcome.RESOLVED
    waiter_turn_id = (
        queries.waiter_turn_id(tx.session, target, waiting_on)
        if resolves and waiting_on is not None
        else None
    )
    fields = {name: getattr(req, name) for name in values.SENT_COLUMNS} | dict(
        body=formats.stored_body(req.content),
        seq=target.next_seq - 1,
        source_name=req.sender,
        source_agent_id=source_id,
        target_agent_id=target.id,
        outcome=outcome,
        status=MessageStatus.DELIVERED if resolves else MessageStatus.PENDING,
        consumed_turn_id=waiter_turn_id,
        consumed_at=utcnow() if resolves else None,
        created_at=utcnow(),
    )
    # A Core INSERT built once, not the unit of work: the row is final as inserted, and the
    # object returned is only read (its id, seq and outcome, and the message it renders).
    message_id = tx.session.connection().execute(_INSERT_MESSAGE, fields).scalar_one()
    return MessageRow(id=message_id, **fields)


def reject(req: SendRequest, reason: str, error: errors.AgentRouterError) -> Refused:
    """A send refused with ``error`` (of :mod:`~agent_router.store.refusals`): its
    ``send_rejected`` event records ``reason`` and the error's code and fields."""
    return Refused(
        error,
        LedgerAction.SEND_REJECTED,
        team_id=req.team_id,
        outcome=RouteOutcome.REJECTED,
        reason=reason,
        to=req.to,
        sender=req.sender,
        type=req.type.value,
        subtype=req.subtype.value if req.subtype else None,
        refused=error.code,
        fields=error.fields,
    )


def resolve_sender(req: SendRequest, found: tuple[int | None, AgentState | None]) -> int | None:
    """The sending agent's id (``None`` for an external sender), from ``found``: its
    ``(id, state)`` as read with the target, or ``(None, None)`` when no such agent."""
    if is_external(req.sender):
        return None  # display names may not take these forms, so no lookup is needed
    source_id, state = found
    if source_id is not None:
        if state is AgentState.TERMINATED:
            raise reject(
                req,
                "sender_terminated",
                refusals.error("sender_terminated", sender=req.sender),
            )
        return source_id
    raise reject(
        req,
        "unknown_sender",
        refusals.error("unknown_sender", sender=req.sender, team_id=req.team_id),
    )


def question_for_answer(tx: Tx, req: SendRequest, target: AgentRow) -> QuestionRow:
    session = tx.session
    if req.question_id is None:
        raise reject(req, "no_question_id", refusals.error("no_question_id"))
    question = session.scalars(
        sa.select(QuestionRow)
        .where(QuestionRow.id == req.question_id)
        .with_for_update(key_share=True)
    ).one_or_none()
    if question is None or question.team_id != req.team_id:
        raise reject(
            req,
            "unknown_question",
            refusals.error("unknown_question", question_id=req.question_id, team_id=req.team_id),
        )
    if question.asker_agent_id != target.id:
        raise reject(
            req,
            "wrong_question",
            refusals.error("not_asked_by", question_id=question.id, target=target.display_name),
        )
    if question.kind is QuestionKind.USER and req.sender != USER:
        raise reject(
            req, "wrong_question", refusals.error("users_question", question_id=question.id)
        )
    if question.kind is QuestionKind.OUTPUT:
        raise reject(
            req, "wrong_question", refusals.error("not_a_question", question_id=question.id)
        )
    if question.status is not QuestionStatus.OPEN:
        raise reject(
            req,
            "question_closed",
            refusals.error(
                "question_closed", question_id=question.id, status=question.status.value
            ),
        )
    return question


def resolve_waiter(
    tx: Tx,
    target: AgentRow,
    question: QuestionRow,
    msg: MessageRow,
    *,
    turn_id: int | None = None,
) -> None:
    """The message becomes the blocked call's tool result, in this transaction. ``turn_id``
    (the waiting turn) is given when ``msg`` was inserted already delivered."""
    question.waiting = False  # before the next statement: one UPDATE of the question
    if msg.status is not MessageStatus.DELIVERED:
        turn_id = queries.waiter_turn_id(tx.session, target, question)
        msg.status = MessageStatus.DELIVERED
        msg.consumed_turn_id = turn_id
        msg.consumed_at = utcnow()
    message = values.message(msg, target.display_name)
    end_wait(
        tx,
        target,
        question,
        formats.render(formats.envelope_of(message)),
        LedgerAction.QUESTION_RESOLVED,
        turn_id=turn_id,
        message_id=msg.id,
        meta=formats.metadata(message),
        suspended=target.suspended,
    )


def release(
    tx: Tx,
    asker: AgentRow,
    question: QuestionRow,
    result: str,
) -> None:
    """End a wait without an answer: a synthetic tool result, then wake or continue."""
    question.waiting = False  # before the next statement: one UPDATE of the question
    end_wait(
        tx,
        asker,
        question,
        result,
        LedgerAction.QUESTION_CANCELLED,
        turn_id=queries.waiter_turn_id(tx.session, asker, question),
        meta={"synthetic": result.split(":", 1)[0], "question_id": question.id},
        result=result,
    )


def end_wait(
    tx: Tx,
    waiter: AgentRow,
    question: QuestionRow,
    tool_result: str,
    action: LedgerAction,
    *,
    turn_id: int | None,
    message_id: int | None = None,
    meta: dict[str, Any],
    **detail: Any,
) -> None:
    """A wait ends (``question`` no longer ``waiting``): ``tool_result`` becomes the blocked tool
    call's result in the waiter's transcript, ``action`` is ledgered with ``detail``, and the
    waiter continues (:func:`continue_waiter`)."""
    queries.append(
        tx.session,
        waiter,
        {"role": "tool", "tool_call_id": question.tool_call_id, "content": tool_result},
        turn_id=turn_id,
        message_id=message_id,
        meta=meta,
    )
    tx.agent_ledger(
        action, waiter, message_id=message_id, epoch=waiter.epoch, question_id=question.id, **detail
    )
    continue_waiter(tx, waiter, question)


def schedule(tx: Tx, agent: AgentRow, trigger: TurnTrigger) -> None:
    """Fence a new epoch and enqueue exactly one turn task for it (through the outbox)."""
    agent.epoch += 1
    move(agent, AgentState.SCHEDULED)
    agent.pending_trigger = trigger
    agent.scheduled_at = utcnow()
    tx.outbox(agent, OutboxKind.ENQUEUE_TURN, trigger=trigger.value)


def continue_waiter(tx: Tx, asker: AgentRow, question: QuestionRow) -> None:
    if asker.suspended:
        asker.suspended = False
        schedule(tx, asker, TurnTrigger.CONTINUATION)
    else:
        move(asker, AgentState.RUNNING)
        tx.outbox(
            asker,
            OutboxKind.WAKE_WAITER,
            question_id=question.id,
            token=wake_token(question.deadline),
        )


def sender_of(tx: Tx, req: SendRequest) -> tuple[int | None, AgentState | None]:
    if is_external(req.sender):
        return None, None
    row = queries.agent_by_name(tx.session, req.team_id, req.sender)
    return (row.id, row.state) if row is not None else (None, None)
