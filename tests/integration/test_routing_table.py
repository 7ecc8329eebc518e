"""The routing table, row by row, through the public API, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from agent_router import (
    AgentState,
    AgentTerminatedError,
    LedgerAction,
    MessageStatus,
    MessageType,
    QuestionClosedError,
    RouteOutcome,
    Router,
    TurnTrigger,
    UnknownAgentError,
)
from agent_router.domain import OutboxKind, QuestionStatus
from agent_router.formats import parse
from agent_router.outbox import RecordingPublisher

from ..conftest import with_pgbouncer
from .helpers import assistant, start_running, start_waiting, tool_call

pytestmark = with_pgbouncer


def test_public_api_walkthrough(router: Router) -> None:
    team = router.create_team()
    assert team.lead.display_name == "Team Leader"
    ui = router.create_agent(team.id, role="UI Operator")
    assert ui.display_name == "UI Operator_1"
    d = router.send(
        team.id,
        to="UI Operator_1",
        content="build the page",
        sender="Team Leader",
        type=MessageType.TASK,
    )
    assert d.outcome is RouteOutcome.TRIGGERED_NEW_TURN
    assert router.agent(team.id, "UI Operator_1").state is AgentState.SCHEDULED
    turn = router.claim_turn(team.id, "UI Operator_1")
    assert turn is not None
    delivered = turn.drain()
    assert [m.id for m in delivered] == [d.message_id]
    turn.append_assistant(assistant(None, tool_call("c1")))
    turn.append_tool_result("c1", "ok")
    turn.append_assistant(assistant("done"))
    end = turn.end()
    assert end.follow_up is False
    assert router.agent(team.id, "UI Operator_1").state is AgentState.COMPLETED
    transcript = router.transcript(team.id, "UI Operator_1")
    assert [e["role"] for e in transcript] == ["user", "assistant", "tool", "assistant"]
    envelope = parse(transcript[0]["content"])
    assert (envelope.type, envelope.sender, envelope.content) == (
        MessageType.TASK,
        "Team Leader",
        "build the page",
    )
    actions = [e.action for e in router.ledger(team.id)]
    assert actions[:2] == [LedgerAction.TEAM_CREATED, LedgerAction.AGENT_CREATED]
    assert actions.count(LedgerAction.ROUTE) == 1
    assert LedgerAction.TURN_CLAIMED in actions and LedgerAction.TURN_ENDED in actions


@pytest.mark.parametrize("resting", [AgentState.IDLE, AgentState.COMPLETED])
def test_resting_agent_gets_exactly_one_turn(
    router: Router, publisher: RecordingPublisher, resting: AgentState
) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    if resting is AgentState.COMPLETED:
        start_running(router, team.id, "Engineer_1").end()
    assert router.agent(team.id, "Engineer_1").state is resting
    before = len(router.outbox(team.id))
    d = router.send(team.id, to="Engineer_1", content="new task", sender="Team Leader")
    assert d.outcome is RouteOutcome.TRIGGERED_NEW_TURN
    agent = router.agent(team.id, "Engineer_1")
    assert agent.state is AgentState.SCHEDULED and agent.pending_trigger is TurnTrigger.NEW
    new_rows = router.outbox(team.id)[before:]
    assert [(r.kind, r.epoch) for r in new_rows] == [(OutboxKind.ENQUEUE_TURN, agent.epoch)]
    assert new_rows[-1].id in {e.id for e in publisher.entries}


def test_agent_created_with_its_task_is_woken_by_it(
    router: Router, publisher: RecordingPublisher
) -> None:
    team = router.create_team()
    agent, d = router.create_agent_with_task(
        team.id,
        role="Engineer",
        task="Add /health.",
        sender="Team Leader",
        system_prompt="Be brief.",
    )
    assert agent.display_name == d.target == "Engineer_1"
    assert agent.state is AgentState.SCHEDULED and d.outcome is RouteOutcome.TRIGGERED_NEW_TURN
    (task,) = [m for m in router.messages(team.id) if m.target_name == "Engineer_1"]
    assert (task.id, task.type, task.source_name) == (d.message_id, MessageType.TASK, "Team Leader")
    assert [e.kind for e in router.outbox(team.id)] == [OutboxKind.ENQUEUE_TURN]
    assert router.outbox(team.id)[0].id in {e.id for e in publisher.entries}
    created, routed = (
        [e for e in router.ledger(team.id) if e.action is action]
        for action in (LedgerAction.AGENT_CREATED, LedgerAction.ROUTE)
    )
    assert created[0].id < routed[0].id  # created, then routed: one transaction, in that order
    turn = router.claim_turn(team.id, "Engineer_1")
    assert turn is not None
    drained = turn.drain()
    assert [m.content for m in drained] == ["Add /health."]
    assert router.transcript(team.id, "Engineer_1")[0]["content"] == "Be brief."


def test_scheduled_agent_coalesces(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    first = router.send(team.id, to="Engineer_1", content="one", sender="Team Leader")
    outbox = len(router.outbox(team.id))
    second = router.send(team.id, to="Engineer_1", content="two", sender="Team Leader")
    assert (first.outcome, second.outcome) == (
        RouteOutcome.TRIGGERED_NEW_TURN,
        RouteOutcome.COALESCED,
    )
    assert len(router.outbox(team.id)) == outbox  # no second enqueue
    turn = router.claim_turn(team.id, "Engineer_1")
    assert turn is not None
    assert [m.content for m in turn.drain()] == ["one", "two"]


def test_running_agent_gets_message_inline_before_next_model_call(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="UI Operator")
    turn = start_running(router, team.id, "UI Operator_1")
    turn.append_assistant(assistant("I will create a new API", tool_call("c1")))
    outbox = len(router.outbox(team.id))
    d = router.send(
        team.id, to="UI Operator_1", content="check the auth module first", sender="Team Leader"
    )
    assert d.outcome is RouteOutcome.INJECTED_INLINE
    assert len(router.outbox(team.id)) == outbox
    assert router.agent(team.id, "UI Operator_1").state is AgentState.RUNNING
    turn.append_tool_result("c1", "created")
    drained = turn.drain()
    assert [m.id for m in drained] == [d.message_id]
    transcript = router.transcript(team.id, "UI Operator_1")
    assert [e["role"] for e in transcript[-3:]] == ["assistant", "tool", "user"]


def test_waiting_agent_gets_message_as_tool_result(
    router: Router, publisher: RecordingPublisher
) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Full-Stack Engineer")
    start_waiting(router, team.id, "Full-Stack Engineer_1", "Team Leader", call_id="ask-7")
    assert router.agent(team.id, "Full-Stack Engineer_1").state is AgentState.WAITING
    question = next(m for m in router.messages(team.id) if m.type is MessageType.ASK)
    assert question.question_id is not None
    d = router.send(
        team.id,
        to="Full-Stack Engineer_1",
        content="reuse auth",
        sender="Team Leader",
        type=MessageType.ANSWER,
        question_id=question.question_id,
    )
    assert d.outcome is RouteOutcome.RESOLVED
    assert router.agent(team.id, "Full-Stack Engineer_1").state is AgentState.RUNNING
    last = router.transcript(team.id, "Full-Stack Engineer_1")[-1]
    assert last["role"] == "tool" and last["tool_call_id"] == "ask-7"
    assert parse(last["content"]).content == "reuse auth"
    msg = next(m for m in router.messages(team.id) if m.id == d.message_id)
    assert msg.status is MessageStatus.DELIVERED
    # The wake signal goes to the router's waker, not the turn publisher; its row is published.
    wake = router.outbox(team.id)[-1]
    assert (
        wake.kind is OutboxKind.WAKE_WAITER and wake.payload["question_id"] == question.question_id
    )
    assert all(e.kind is OutboxKind.ENQUEUE_TURN for e in publisher.entries)
    assert wake.id not in {u.id for u in router.store.reads.unpublished()}


def test_only_the_agent_waited_on_releases_an_ask(router: Router) -> None:
    """Messages from anyone but the asked agent queue behind the wait (a context-only one as
    `queued`) and are drained after the answer, which is the ask's result."""
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    router.create_agent(team.id, role="Designer")
    turn = start_waiting(router, team.id, "Engineer_1", "Team Leader")
    qid = next(m for m in router.messages(team.id) if m.type is MessageType.ASK).question_id
    from_user = router.send(team.id, to="Engineer_1", content="stop and report", sender="user")
    from_peer = router.send(
        team.id, to="Engineer_1", content="FYI: starting on the reset API", sender="Designer_1"
    )
    context = router.send(
        team.id, to="Engineer_1", content="build is green", sender="system", wake=False
    )
    assert [d.outcome for d in (from_user, from_peer, context)] == [
        RouteOutcome.INJECTED_INLINE,
        RouteOutcome.INJECTED_INLINE,
        RouteOutcome.QUEUED,
    ]
    assert router.agent(team.id, "Engineer_1").state is AgentState.WAITING
    answer = router.send(
        team.id,
        to="Engineer_1",
        content="the answer",
        sender="Team Leader",
        type=MessageType.ANSWER,
        question_id=qid,
    )
    assert answer.outcome is RouteOutcome.RESOLVED
    assert router.question(qid or 0).status is QuestionStatus.ANSWERED
    last = router.transcript(team.id, "Engineer_1")[-1]
    assert last["role"] == "tool" and parse(last["content"]).content == "the answer"
    drained = turn.drain()
    assert [m.id for m in drained] == [d.message_id for d in (from_user, from_peer, context)]


def test_any_message_of_the_asked_agent_releases_the_ask_as_its_answer(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    turn = start_waiting(router, team.id, "Engineer_1", "Team Leader")
    qid = next(m for m in router.messages(team.id) if m.type is MessageType.ASK).question_id
    message = router.send(team.id, to="Engineer_1", content="use auth", sender="Team Leader")
    assert message.outcome is RouteOutcome.RESOLVED
    question = router.question(qid or 0)
    assert (question.status, question.answer_message_id) == (
        QuestionStatus.ANSWERED,
        message.message_id,
    )
    # A late answer to the closed question is refused: it was answered already.
    with pytest.raises(QuestionClosedError):
        router.send(
            team.id,
            to="Engineer_1",
            content="the answer",
            sender="Team Leader",
            type=MessageType.ANSWER,
            question_id=qid,
        )
    assert turn.drain() == []


def test_context_only_notice_is_queued_without_a_turn(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    outbox = len(router.outbox(team.id))
    d = router.send(
        team.id,
        to="Engineer_1",
        content="FYI: build is green",
        sender="system",
        type=MessageType.NOTICE,
        wake=False,
    )
    assert d.outcome is RouteOutcome.QUEUED
    assert router.agent(team.id, "Engineer_1").state is AgentState.IDLE
    assert len(router.outbox(team.id)) == outbox
    # Seen at the next turn, before the message that woke it.
    wake = router.send(team.id, to="Engineer_1", content="go", sender="Team Leader")
    turn = router.claim_turn(team.id, "Engineer_1")
    assert turn is not None
    assert [m.id for m in turn.drain()] == [d.message_id, wake.message_id]


def test_terminated_or_unknown_target_is_rejected_with_ledger_only(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    router.terminate(team.id, "Engineer_1", reason="test")
    messages = len(router.messages(team.id))
    with pytest.raises(AgentTerminatedError):
        router.send(team.id, to="Engineer_1", content="hello", sender="Team Leader")
    assert len(router.messages(team.id)) == messages
    rejected = [e for e in router.ledger(team.id) if e.action is LedgerAction.SEND_REJECTED]
    assert rejected and rejected[-1].outcome is RouteOutcome.REJECTED

    unknown = len(router.ledger(team.id))
    with pytest.raises(UnknownAgentError):
        router.send(team.id, to="Nobody_1", content="hello", sender="Team Leader")
    assert len(router.messages(team.id)) == messages
    assert [e.action for e in router.ledger(team.id)[unknown:]] == [LedgerAction.SEND_REJECTED]
