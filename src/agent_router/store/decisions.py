"""Decisions as data: how a message is delivered, which agent state may follow which, and how a
question closes. Pure functions of their arguments (no session, no clock but ``utcnow`` when a
question closes), so that they are tested without a database."""

from __future__ import annotations

from dataclasses import dataclass

from agent_router import errors
from agent_router.domain import (
    AgentState,
    MessageSubtype,
    MessageType,
    Question,
    QuestionKind,
    QuestionStatus,
    RouteOutcome,
)
from agent_router.store.models import AgentRow, QuestionRow, utcnow


@dataclass(frozen=True, kw_only=True)
class Incoming:
    """The parts of a message that decide its delivery. ``answers``: the question an answer
    answers (``None`` for any other message); ``sender_id``: ``None`` for an external sender;
    ``from_user``: the sender is the user."""

    type: MessageType
    sender_id: int | None
    wake: bool
    answers: int | None = None
    subtype: MessageSubtype | None = None
    from_user: bool = False


def resolves(waiting: Question, msg: Incoming) -> bool:
    """Does ``msg`` end the receiver's wait? Only the agent waited on releases it: an ask ends on
    that agent's answer to it, or on any other wake message that agent sends the asker; an
    output wait ends on that agent's report (an output that is not progress narration); a wait
    for the user (``ask_user``) ends on the user's answer to it, or on any other wake message
    of the user's. A message from anyone else is queued and read after the wait ends; the
    system releases a wait by other means (expired, cancelled)."""
    if waiting.kind is QuestionKind.USER:
        return msg.from_user and msg.wake and (msg.answers is None or msg.answers == waiting.id)
    if msg.sender_id is None or msg.sender_id != waiting.target_agent_id:
        return False
    if waiting.kind is QuestionKind.OUTPUT:
        return msg.type is MessageType.OUTPUT and msg.subtype is not MessageSubtype.PROGRESS_OUTPUT
    return msg.wake and (msg.answers is None or msg.answers == waiting.id)


def decide(state: AgentState, waiting: Question | None, msg: Incoming) -> RouteOutcome:
    """The routing table: the outcome of delivering ``msg`` to a receiver in ``state`` (blocked
    on ``waiting``, if it is waiting). A terminated receiver is refused before this is asked."""
    if state is AgentState.TERMINATED:
        raise errors.AgentTerminatedError("a terminated agent takes no messages")
    if state is AgentState.WAITING and waiting is not None and resolves(waiting, msg):
        return RouteOutcome.RESOLVED
    if state is AgentState.WAITING:
        return RouteOutcome.INJECTED_INLINE if msg.wake else RouteOutcome.QUEUED
    if state is AgentState.RUNNING:
        return RouteOutcome.INJECTED_INLINE
    if state is AgentState.SCHEDULED:
        return RouteOutcome.COALESCED
    return RouteOutcome.TRIGGERED_NEW_TURN if msg.wake else RouteOutcome.QUEUED


_STOPPABLE = {AgentState.IDLE, AgentState.TERMINATED}
#: Which state may follow which. ``idle`` follows any live state (a stop); ``terminated`` is final.
TRANSITIONS: dict[AgentState, frozenset[AgentState]] = {
    AgentState.IDLE: frozenset({AgentState.SCHEDULED, *_STOPPABLE}),
    AgentState.COMPLETED: frozenset({AgentState.SCHEDULED, *_STOPPABLE}),
    # scheduled -> scheduled: a batched turn pushed back to a new epoch.
    AgentState.SCHEDULED: frozenset({AgentState.SCHEDULED, AgentState.RUNNING, *_STOPPABLE}),
    AgentState.RUNNING: frozenset(
        {AgentState.WAITING, AgentState.SCHEDULED, AgentState.COMPLETED, *_STOPPABLE}
    ),
    # waiting -> waiting: a blocked ask suspended when its turn ends or is taken over.
    AgentState.WAITING: frozenset(
        {
            AgentState.WAITING,
            AgentState.RUNNING,
            AgentState.SCHEDULED,
            AgentState.COMPLETED,
            *_STOPPABLE,
        }
    ),
    AgentState.TERMINATED: frozenset(),
}


def can_move(current: AgentState, to: AgentState) -> bool:
    return to in TRANSITIONS[current]


def move(agent: AgentRow, to: AgentState) -> None:
    """The one way an agent changes state; an illegal transition is a store bug and raises."""
    if not can_move(agent.state, to):
        raise errors.StoreError(
            f"illegal transition of agent {agent.id}: {agent.state.value} -> {to.value}"
        )
    agent.state = to


def close_question(
    question: QuestionRow,
    status: QuestionStatus,
    *,
    answer_message_id: int | None = None,
    stop_waiting: bool = False,
) -> None:
    """The one way a question closes: ``answered`` (with the answering message), ``expired`` or
    ``cancelled``. ``stop_waiting``: the asker is no longer blocked on it either (a wait that
    is released instead has its tool result written, and clears ``waiting`` itself)."""
    if status is QuestionStatus.OPEN:
        raise errors.StoreError(f"question {question.id}: closing it cannot leave it open")
    if (status is QuestionStatus.ANSWERED) != (answer_message_id is not None):
        raise errors.StoreError(f"question {question.id}: an answer, and only an answer, has one")
    question.status = status
    if answer_message_id is not None:
        question.answer_message_id = answer_message_id
    if stop_waiting:
        question.waiting = False
    question.closed_at = utcnow()
