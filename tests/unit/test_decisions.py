"""The store's decisions as data: the routing table, the agent transition table and the closing
of a question, checked on plain values and unsaved rows (no database)."""

from __future__ import annotations

import itertools
from datetime import datetime

import pytest

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
from agent_router.store.decisions import (
    TRANSITIONS,
    Incoming,
    close_question,
    decide,
    move,
    resolves,
)
from agent_router.store.models import AgentRow, QuestionRow


def _waiting_on(question_id: int, kind: QuestionKind) -> Question:
    """An open question of agent 1 to agent 2, which agent 1 is blocked on."""
    return Question(
        id=question_id,
        team_id=1,
        asker_agent_id=1,
        target_agent_id=2,
        tool_call_id=f"call-{question_id}",
        status=QuestionStatus.OPEN,
        waiting=True,
        deadline=datetime(2030, 1, 1),
        kind=kind,
    )


ASK = _waiting_on(7, QuestionKind.ASK)
OUTPUT_WAIT = _waiting_on(8, QuestionKind.OUTPUT)
WAKE = Incoming(type=MessageType.MESSAGE, sender_id=3, wake=True)
CONTEXT = Incoming(type=MessageType.NOTICE, sender_id=None, wake=False)


@pytest.mark.parametrize(
    ("state", "msg", "outcome"),
    [
        (AgentState.IDLE, WAKE, RouteOutcome.TRIGGERED_NEW_TURN),
        (AgentState.COMPLETED, WAKE, RouteOutcome.TRIGGERED_NEW_TURN),
        (AgentState.IDLE, CONTEXT, RouteOutcome.QUEUED),
        (AgentState.COMPLETED, CONTEXT, RouteOutcome.QUEUED),
        (AgentState.SCHEDULED, WAKE, RouteOutcome.COALESCED),
        (AgentState.SCHEDULED, CONTEXT, RouteOutcome.COALESCED),
        (AgentState.RUNNING, WAKE, RouteOutcome.INJECTED_INLINE),
        (AgentState.RUNNING, CONTEXT, RouteOutcome.INJECTED_INLINE),
    ],
)
def test_the_routing_table_by_receiver_state(
    state: AgentState, msg: Incoming, outcome: RouteOutcome
) -> None:
    assert decide(state, None, msg) is outcome


def test_only_the_asked_agent_releases_an_ask() -> None:
    from_asked = Incoming(type=MessageType.MESSAGE, sender_id=ASK.target_agent_id, wake=True)
    assert decide(AgentState.WAITING, ASK, from_asked) is RouteOutcome.RESOLVED
    # Anyone else (a peer, the user, the system) is queued behind the wait.
    external = Incoming(type=MessageType.MESSAGE, sender_id=None, wake=True)
    for msg in (WAKE, external):
        assert not resolves(ASK, msg)
        assert decide(AgentState.WAITING, ASK, msg) is RouteOutcome.INJECTED_INLINE
    assert decide(AgentState.WAITING, ASK, CONTEXT) is RouteOutcome.QUEUED
    context_from_asked = Incoming(type=MessageType.NOTICE, sender_id=2, wake=False)
    assert decide(AgentState.WAITING, ASK, context_from_asked) is RouteOutcome.QUEUED


def test_an_answer_resolves_only_the_question_it_answers() -> None:
    own = Incoming(type=MessageType.ANSWER, sender_id=2, wake=True, answers=ASK.id)
    other = Incoming(type=MessageType.ANSWER, sender_id=2, wake=True, answers=ASK.id + 1)
    assert decide(AgentState.WAITING, ASK, own) is RouteOutcome.RESOLVED
    assert decide(AgentState.WAITING, ASK, other) is RouteOutcome.INJECTED_INLINE


def test_an_output_wait_ends_only_on_the_awaited_agents_report() -> None:
    report = Incoming(
        type=MessageType.OUTPUT,
        sender_id=2,
        wake=True,
        subtype=MessageSubtype.COMPLETION_REPORT,
    )
    plain_output = Incoming(type=MessageType.OUTPUT, sender_id=2, wake=True)
    progress = Incoming(
        type=MessageType.OUTPUT, sender_id=2, wake=False, subtype=MessageSubtype.PROGRESS_OUTPUT
    )
    other_sender = Incoming(type=MessageType.OUTPUT, sender_id=3, wake=True)
    not_output = Incoming(type=MessageType.MESSAGE, sender_id=2, wake=True)
    external = Incoming(type=MessageType.OUTPUT, sender_id=None, wake=True)
    for msg in (report, plain_output):
        assert decide(AgentState.WAITING, OUTPUT_WAIT, msg) is RouteOutcome.RESOLVED
    assert decide(AgentState.WAITING, OUTPUT_WAIT, progress) is RouteOutcome.QUEUED
    for msg in (other_sender, not_output, external, progress):
        assert not resolves(OUTPUT_WAIT, msg)
    for msg in (other_sender, not_output, external):
        assert decide(AgentState.WAITING, OUTPUT_WAIT, msg) is RouteOutcome.INJECTED_INLINE


def test_a_waiting_receiver_without_a_wait_takes_the_message_inline() -> None:
    assert decide(AgentState.WAITING, None, WAKE) is RouteOutcome.INJECTED_INLINE


def test_a_terminated_receiver_is_never_routed_to() -> None:
    with pytest.raises(errors.AgentTerminatedError):
        decide(AgentState.TERMINATED, None, WAKE)


def _agent(state: AgentState) -> AgentRow:
    return AgentRow(display_name="Engineer_1", state=state)


@pytest.mark.parametrize(("current", "to"), list(itertools.product(AgentState, AgentState)))
def test_move_follows_the_transition_table(current: AgentState, to: AgentState) -> None:
    agent = _agent(current)
    if to in TRANSITIONS[current]:
        move(agent, to)
        assert agent.state is to
    else:
        with pytest.raises(errors.StoreError, match="illegal transition"):
            move(agent, to)
        assert agent.state is current


def test_the_transition_table_keeps_the_life_cycle() -> None:
    assert TRANSITIONS[AgentState.TERMINATED] == frozenset()  # final
    live = set(AgentState) - {AgentState.TERMINATED}
    assert all(AgentState.TERMINATED in TRANSITIONS[s] for s in live)  # terminate from anywhere
    assert all(AgentState.IDLE in TRANSITIONS[s] for s in live)  # stop from anywhere
    # Only a claim starts a turn, and only a turn ends one.
    assert {s for s in AgentState if AgentState.RUNNING in TRANSITIONS[s]} == {
        AgentState.SCHEDULED,
        AgentState.WAITING,
    }
    assert {s for s in AgentState if AgentState.COMPLETED in TRANSITIONS[s]} == {
        AgentState.RUNNING,
        AgentState.WAITING,
    }


def _question() -> QuestionRow:
    return QuestionRow(id=5, status=QuestionStatus.OPEN, waiting=True)


def test_close_question_answers_with_the_answering_message() -> None:
    q = _question()
    close_question(q, QuestionStatus.ANSWERED, answer_message_id=11)
    assert (q.status, q.answer_message_id, q.waiting) == (QuestionStatus.ANSWERED, 11, True)
    assert q.closed_at is not None


def test_close_question_can_end_the_wait_as_well() -> None:
    q = _question()
    close_question(q, QuestionStatus.CANCELLED, stop_waiting=True)
    assert (q.status, q.answer_message_id, q.waiting) == (QuestionStatus.CANCELLED, None, False)
    assert q.closed_at is not None


@pytest.mark.parametrize(
    ("status", "answer"),
    [
        (QuestionStatus.OPEN, None),
        (QuestionStatus.ANSWERED, None),
        (QuestionStatus.EXPIRED, 11),
        (QuestionStatus.CANCELLED, 11),
    ],
)
def test_close_question_refuses_a_close_that_makes_no_sense(
    status: QuestionStatus, answer: int | None
) -> None:
    q = _question()
    with pytest.raises(errors.StoreError):
        close_question(q, status, answer_message_id=answer)
    assert (q.status, q.waiting, q.closed_at) == (QuestionStatus.OPEN, True, None)
