"""Claiming, fencing, draining and the end-of-turn hook."""

from __future__ import annotations

import pytest

from agent_router import (
    AgentState,
    LedgerAction,
    MessageType,
    Router,
    StaleTurnError,
    ToolCallsPendingError,
    TurnTrigger,
)
from agent_router.agents.loop import claim
from agent_router.errors import InvalidTranscriptEntryError
from agent_router.ops.checks import check_team, tool_pairing_problems
from agent_router.store import Since

from .helpers import assistant, start_running, tool_call


def test_duplicate_and_stale_claims_return_none(router: Router) -> None:
    team = router.create_team()
    agent = router.create_agent(team.id, role="Engineer")
    assert router.claim_turn(team.id, "Engineer_1") is None  # nothing scheduled
    router.send(team.id, to="Engineer_1", content="go", sender="Team Leader")
    epoch = router.agent(team.id, "Engineer_1").epoch
    assert router.claim(agent.id, epoch - 1) is None  # stale epoch
    turn = router.claim(agent.id, epoch)
    assert turn is not None and turn.trigger is TurnTrigger.NEW
    assert router.claim(agent.id, epoch) is None  # duplicate delivery of the same task
    refused = [e for e in router.ledger(team.id) if e.action is LedgerAction.CLAIM_REFUSED]
    assert len(refused) == 3
    assert len(router.store.reads.turns(agent.id)) == 1


def test_superseded_turn_can_write_nothing(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    old = start_running(router, team.id, "Engineer_1")
    old.append_assistant(assistant(None, tool_call("c1")))
    new_epoch = router.take_over(team.id, "Engineer_1", reason="lease expired")
    assert new_epoch == old.epoch + 1
    transcript = router.transcript(team.id, "Engineer_1")
    # The unfinished call of the dead turn got a synthetic result (guarantee 7).
    assert transcript[-1]["role"] == "tool" and transcript[-1]["content"].startswith("interrupted")
    router.send(team.id, to="Engineer_1", content="queued while recovering", sender="user")
    for attempt in (
        old.drain,
        lambda: old.append_assistant(assistant("late")),
        lambda: old.append_tool_result("c1", "late"),
        old.end,
    ):
        with pytest.raises(StaleTurnError):
            attempt()
    assert router.transcript(team.id, "Engineer_1") == transcript
    recovery = router.claim_turn(team.id, "Engineer_1")
    assert recovery is not None and recovery.trigger is TurnTrigger.RECOVERY
    assert [m.content for m in recovery.drain()] == ["queued while recovering"]
    stale = [e for e in router.ledger(team.id) if e.action is LedgerAction.STALE_WRITE_REFUSED]
    assert len(stale) == 4


def test_drain_refused_while_tool_calls_lack_results(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    turn = start_running(router, team.id, "Engineer_1")
    turn.append_assistant(assistant("two steps", tool_call("a"), tool_call("b")))
    router.send(team.id, to="Engineer_1", content="steer", sender="Team Leader")
    turn.append_tool_result("a", "done a")
    with pytest.raises(ToolCallsPendingError):
        turn.drain()
    with pytest.raises(ToolCallsPendingError):
        turn.append_assistant(assistant("too early"))
    turn.append_tool_result("b", "done b")
    assert [m.content for m in turn.drain()] == ["steer"]
    transcript = router.transcript(team.id, "Engineer_1")
    assert [e["role"] for e in transcript[-4:]] == ["assistant", "tool", "tool", "user"]
    assert tool_pairing_problems(transcript, open_allowed=False) == []


def test_tool_results_must_match_open_calls(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    turn = start_running(router, team.id, "Engineer_1")
    turn.append_assistant(assistant(None, tool_call("a")))
    with pytest.raises(InvalidTranscriptEntryError):
        turn.append_tool_result("zzz", "no such call")
    turn.append_tool_result("a", "ok")
    with pytest.raises(InvalidTranscriptEntryError):
        turn.append_tool_result("a", "twice")
    with pytest.raises(InvalidTranscriptEntryError):
        turn.append_assistant({"role": "user", "content": "not an assistant"})
    # Two calls under one id are stored under two (as every model's are), each answerable.
    stored = turn.append_assistant(assistant(None, tool_call("x"), tool_call("x")))
    first, second = (c["id"] for c in stored["tool_calls"])
    assert first == "x" and second != "x"
    assert sorted(turn.open_tool_calls()) == sorted([first, second])
    turn.append_tool_result(first, "one")
    turn.append_tool_result(second, "two")
    assert turn.open_tool_calls() == []


def test_end_with_pending_wake_messages_fires_exactly_one_follow_up(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    turn = start_running(router, team.id, "Engineer_1")
    turn.append_assistant(assistant("final words"))
    for i in range(3):  # messages land while the last output is written
        router.send(team.id, to="Engineer_1", content=f"late {i}", sender="Team Leader")
    outbox = len(router.outbox(team.id))
    end = turn.end()
    assert end.follow_up is True and end.state is AgentState.SCHEDULED
    assert len(router.outbox(team.id)) == outbox + 1
    follow = router.claim_turn(team.id, "Engineer_1")
    assert follow is not None and follow.trigger is TurnTrigger.FOLLOW_UP
    assert [m.content for m in follow.drain()] == ["late 0", "late 1", "late 2"]
    follow.append_assistant(assistant("handled"))
    assert follow.end().follow_up is False
    assert check_team(router, team.id, quiescent=True).ok


def test_end_with_only_context_notices_completes(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    turn = start_running(router, team.id, "Engineer_1")
    router.send(
        team.id,
        to="Engineer_1",
        content="fyi",
        sender="system",
        type=MessageType.NOTICE,
        wake=False,
    )
    end = turn.end()
    assert (end.follow_up, end.state) == (False, AgentState.COMPLETED)
    assert router.agent(team.id, "Engineer_1").mailbox_depth == 1


def test_failed_turn_closes_dangling_calls_and_still_follows_up(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    turn = start_running(router, team.id, "Engineer_1")
    turn.append_assistant(assistant(None, tool_call("a"), tool_call("b")))
    turn.append_tool_result("a", "ok")
    router.send(team.id, to="Engineer_1", content="pending", sender="Team Leader")
    end = turn.end(failed=True, error="model exploded")
    assert (end.follow_up, end.synthetic_results) == (True, 1)
    transcript = router.transcript(team.id, "Engineer_1")
    assert tool_pairing_problems(transcript, open_allowed=False) == []
    assert router.store.reads.turns(turn.agent_id)[-1].status.value == "failed"


def test_the_built_in_loops_claim_makes_its_first_model_calls_transition(router: Router) -> None:
    """The built-in loop's claim makes the transition before the turn's first model call too,
    in its own transaction: the pending messages drained, the call charged, the transcript
    read. The turn's first ``before_call`` returns that and sends nothing; the next one is a
    transition of its own. A claim of the router's alone only claims."""
    team = router.create_team()
    agent = router.create_agent(team.id, role="Engineer")
    for content in ("one", "two"):
        router.send(team.id, to="Engineer_1", content=content, sender="Team Leader")
    turn = claim(router, agent.id)
    assert turn is not None
    assert router.agent(team.id, "Engineer_1").mailbox_depth == 0
    claimed = [e.action for e in router.ledger(team.id) if e.turn_id == turn.id]
    assert claimed[0] is LedgerAction.TURN_CLAIMED and LedgerAction.DRAIN in claimed
    with router.reads.statements() as sent:
        before = turn.before_call(since=Since(None))
        rows = turn.transcript_rows()
    assert sent == []
    assert [m.content for m in before.messages] == ["one", "two"]
    assert [m.display_name for m in before.roster] == ["Team Leader", "Engineer_1"]
    assert [entry["role"] for _position, entry in rows] == ["user", "user"]
    turn.append_assistant(assistant("working"))
    router.send(team.id, to="Engineer_1", content="three", sender="Team Leader")
    with router.reads.statements() as sent:
        again = turn.before_call()
    assert sent
    assert [m.content for m in again.messages] == ["three"]
    turn.end()
    router.send(team.id, to="Engineer_1", content="four", sender="Team Leader")
    plain = router.claim(agent.id, builtin=True)
    assert plain is not None
    assert router.agent(team.id, "Engineer_1").mailbox_depth == 1
