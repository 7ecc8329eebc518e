"""The user in the team: the lead's answer and progress are messages to the user, the lead asks
the user and waits holding no worker, and the team's feed reads on from a cursor. On SQLite
and PostgreSQL, with the built-in loop on the scripted model."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event

from agent_router import Router, errors
from agent_router.agents.llm import ScriptedModel, directive
from agent_router.agents.loop import TurnOutcome, run_turn
from agent_router.agents.tools import default_registry
from agent_router.domain import (
    AgentState,
    FeedItem,
    OutboxKind,
    QuestionKind,
    QuestionStatus,
    RouteOutcome,
    TurnStatus,
    TurnTrigger,
    UserMessageKind,
)
from agent_router.ops.checks import check_team
from agent_router.outbox import RecordingPublisher

from .helpers import assistant, tool_call


@contextmanager
def statements_sent(router: Router) -> Iterator[list[str]]:
    """Every statement the router's store sends meanwhile (SQLite's BEGIN among them)."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(router.store.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(router.store.engine, "before_cursor_execute", record)


LEAD = "Team Leader"


def _run_lead(router: Router, team_id: int) -> TurnOutcome:
    lead = router.agent(team_id, LEAD)
    turn = router.claim(lead.id, builtin=True)
    assert turn is not None
    return run_turn(router, turn, models=ScriptedModel.for_agent, tools=default_registry())


def test_the_lead_s_final_reply_is_its_answer_to_the_user(router: Router) -> None:
    team = router.create_team()
    progress = directive("tell_user", text="Looking into it.")
    router.send(team.id, to=LEAD, content=f"Plan the release.\n{progress}")
    assert _run_lead(router, team.id) is TurnOutcome.ENDED
    said = router.user_messages(team.id)
    assert [(m.kind, m.sender) for m in said] == [
        (UserMessageKind.PROGRESS, LEAD),
        (UserMessageKind.ANSWER, LEAD),
    ]
    assert said[0].content == "Looking into it."
    # The answer is the final reply of the transcript, which stays as it was.
    assert said[1].content == router.transcript(team.id, LEAD)[-1]["content"]
    assert router.user_messages(team.id, after=said[0].id) == said[1:]
    assert router.user_messages(team.id, after=said[1].id) == []


def test_the_lead_asks_the_user_and_holds_no_worker_until_the_reply(
    router: Router, publisher: RecordingPublisher
) -> None:
    team = router.create_team()
    router.send(team.id, to=LEAD, content=directive("ask_user", question="Which colour?"))
    assert _run_lead(router, team.id) is TurnOutcome.SUSPENDED
    lead = router.agent(team.id, LEAD)
    # The turn ended at once: the agent waits suspended, no turn of it is running.
    assert (lead.state, lead.suspended) == (AgentState.WAITING, True)
    assert [t.status for t in router.reads.turns(lead.id)] == [TurnStatus.SUSPENDED]
    (asked,) = router.user_messages(team.id)
    assert (asked.kind, asked.content) == (UserMessageKind.QUESTION, "Which colour?")
    assert asked.question_id is not None
    question = router.question(asked.question_id)
    assert (question.kind, question.target, question.status) == (
        QuestionKind.USER,
        "user",
        QuestionStatus.OPEN,
    )
    # Nobody in the team may answer the user's question.
    with pytest.raises(errors.WrongQuestionError):
        router.send(
            team.id,
            to=LEAD,
            content="red",
            sender="system",
            type="answer",
            question_id=asked.question_id,
        )
    # A team waiting on the user is at rest: nothing is owed that the team could pay.
    assert check_team(router, team.id, quiescent=True).ok
    delivery = router.answer(asked.question_id, "Blue, please.")
    assert delivery.outcome is RouteOutcome.RESOLVED
    assert router.question(asked.question_id).status is QuestionStatus.ANSWERED
    enqueued = [e for e in publisher.entries if e.kind is OutboxKind.ENQUEUE_TURN]
    assert enqueued[-1].payload["trigger"] == TurnTrigger.CONTINUATION.value
    assert _run_lead(router, team.id) is TurnOutcome.ENDED
    transcript = router.transcript(team.id, LEAD)
    (call,) = next(e for e in transcript if e.get("tool_calls"))["tool_calls"]
    (result,) = [e for e in transcript if e.get("tool_call_id") == call["id"]]
    assert call["function"]["name"] == "ask_user"
    assert "Blue, please." in result["content"]
    assert [m.kind for m in router.user_messages(team.id)] == [
        UserMessageKind.QUESTION,
        UserMessageKind.ANSWER,
    ]


def test_a_question_the_user_leaves_unanswered_expires(router: Router) -> None:
    team = router.create_team()
    router.send(team.id, to=LEAD, content="Start.")
    turn = router.claim(team.lead.id, builtin=True)
    assert turn is not None
    turn.drain()
    turn.append_assistant(assistant(None, tool_call("call-1", "ask_user")))
    question, said = turn.ask_user("Still there?", tool_call_id="call-1", timeout_seconds=0.001)
    assert said.question_id == question.id
    assert router.expire_questions() == 1
    assert router.question(question.id).status is QuestionStatus.EXPIRED
    (result,) = [e for e in router.transcript(team.id, LEAD) if e.get("tool_call_id") == "call-1"]
    assert result["content"].startswith("expired")
    lead = router.agent(team.id, LEAD)
    assert (lead.state, lead.pending_trigger) == (AgentState.SCHEDULED, TurnTrigger.CONTINUATION)


def test_any_message_of_the_user_ends_the_wait_and_others_queue(router: Router) -> None:
    team = router.create_team()
    router.send(team.id, to=LEAD, content=directive("ask_user", question="Go on?"))
    assert _run_lead(router, team.id) is TurnOutcome.SUSPENDED
    queued = router.send(team.id, to=LEAD, content="a notice", sender="system")
    assert queued.outcome is RouteOutcome.INJECTED_INLINE
    resolved = router.send(team.id, to=LEAD, content="Yes, go on.")
    assert resolved.outcome is RouteOutcome.RESOLVED
    assert router.agent(team.id, LEAD).state is AgentState.SCHEDULED


def test_the_feed_reads_on_from_its_cursor(router: Router) -> None:
    team = router.create_team()
    router.send(team.id, to=LEAD, content="Hello team.")
    assert _run_lead(router, team.id) is TurnOutcome.ENDED
    items = router.events(team.id)
    kinds = [i.kind for i in items if i.kind != "event"]
    assert kinds == ["user", UserMessageKind.ANSWER.value]
    assert items[0].content == "Hello team."
    cursors = [i.cursor for i in items]
    assert cursors == sorted(cursors)
    assert router.events(team.id, after=cursors[-1]) == []
    assert router.events(team.id, after=cursors[0]) == items[1:]


def test_a_waiting_reader_is_woken_by_a_message_to_the_user(router: Router) -> None:
    team = router.create_team()
    got: list[FeedItem] = []
    # A wait far longer than the test may take: the reader returns with the event, so it was
    # woken, not timed out.
    reader = threading.Thread(
        target=lambda: got.extend(router.events(team.id, after=0, wait=3600.0))
    )
    reader.start()
    router.send(team.id, to=LEAD, content="Are you there?")
    reader.join(timeout=120.0)
    assert not reader.is_alive()
    assert [(i.kind, i.content) for i in got][:1] == [("user", "Are you there?")]


def test_a_reader_of_a_quiet_team_sends_no_statement_while_it_waits(router: Router) -> None:
    team = router.create_team()
    router.send(team.id, to=LEAD, content="Hello.")
    cursor = router.events(team.id)[-1].cursor
    with statements_sent(router) as once:
        assert router.events(team.id, after=cursor) == []
    with statements_sent(router) as waiting:
        assert router.events(team.id, after=cursor, wait=1.0) == []
    # The read before the wait, and nothing while it waited out its second.
    assert once
    assert waiting == once
