"""The built-in agent loop on one claimed turn, synchronously (no broker): outputs to the lead,
the end-of-turn hook on failure, the step cap the model is told about, and a fenced turn that
writes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from agent_router import (
    Agent,
    MessageSubtype,
    MessageType,
    Router,
    Settings,
    TurnStatus,
    TurnTrigger,
)
from agent_router.agents.llm import Model, ScriptedModel
from agent_router.agents.loop import TurnOutcome, run_turn
from agent_router.agents.protocol import HEADING
from agent_router.agents.tools import default_registry
from agent_router.ops.checks import check_team, tool_pairing_problems
from agent_router.outbox import RecordingPublisher


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'loop.db'}",
        work_seconds=0,
        scripted_write_seconds=0,
        max_turn_steps=5,
    )
    r = Router(settings, publisher=RecordingPublisher())
    r.create_schema()
    yield r
    r.close()


def scripted(agent: Agent) -> Model:
    return ScriptedModel.for_agent(agent)


def start(router: Router, role: str = "Full-Stack Engineer") -> tuple[int, Agent]:
    team = router.create_team()
    agent = router.create_agent(team.id, role=role)
    router.send(team.id, to=agent.display_name, content="Ship it.", sender="Team Leader",
                type=MessageType.TASK)  # fmt: skip
    return team.id, agent


def test_sub_agent_turn_reports_progress_and_completion(router: Router) -> None:
    team_id, agent = start(router)
    turn = router.claim(agent.id)
    assert turn is not None
    assert run_turn(router, turn, models=scripted, tools=default_registry()) is TurnOutcome.ENDED

    to_lead = [m for m in router.messages(team_id) if m.target_name == "Team Leader"]
    assert [(m.type, m.subtype, m.wake) for m in to_lead] == [
        (MessageType.OUTPUT, MessageSubtype.PROGRESS_OUTPUT, False),
        (MessageType.OUTPUT, MessageSubtype.COMPLETION_REPORT, True),
    ]
    assert to_lead[1].dedup_key == f"report:{turn.id}"
    transcript = router.transcript(team_id, agent.display_name)
    assert [e["role"] for e in transcript] == ["user", "assistant", "tool", "assistant", "tool",
                                               "assistant"]  # fmt: skip
    assert router.agent(team_id, agent.display_name).state.value == "completed"
    assert check_team(router, team_id).ok


class Raises:
    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        raise RuntimeError("boom")


def test_failing_model_ends_turn_and_notifies_lead(router: Router) -> None:
    team_id, agent = start(router)
    turn = router.claim(agent.id)
    assert turn is not None
    assert run_turn(router, turn, models=lambda a: Raises(), tools=default_registry()) is (
        TurnOutcome.FAILED
    )
    (record,) = router.store.reads.turns(agent.id)
    assert record.status is TurnStatus.FAILED
    assert router.agent(team_id, agent.display_name).state.value == "completed"
    (notice,) = [m for m in router.messages(team_id) if m.type is MessageType.NOTICE]
    assert notice.source_name == "system" and "RuntimeError: boom" in notice.content


class Loops:
    """Always calls a tool: the runaway guard must stop it."""

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        call = {"id": f"c{len(messages)}", "type": "function",
                "function": {"name": "do_work", "arguments": '{"step": "again"}'}}  # fmt: skip
        return {"role": "assistant", "content": None, "tool_calls": [call]}


def test_the_step_cap_tells_the_model_before_its_last_call(router: Router) -> None:
    team_id, agent = start(router)
    turn = router.claim(agent.id)
    assert turn is not None
    seen: list[list[dict[str, Any]]] = []

    class Watches(Loops):
        def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
            seen.append(messages)
            return super().complete(messages, tools)

    assert run_turn(router, turn, models=lambda a: Watches(), tools=default_registry()) is (
        TurnOutcome.ENDED
    )
    transcript = router.transcript(team_id, agent.display_name)
    assert sum(e["role"] == "assistant" for e in transcript) == 5
    # The notice is in the request of the fifth (last) call and in no earlier one.
    told = ["limit of 5 model calls" in str(m[-1].get("content")) for m in seen]
    assert told == [False, False, False, False, True]
    assert seen[-1][-1]["role"] == "user"
    # The last reply's tool call was not run; its result says why; nothing dangles.
    assert transcript[-1]["role"] == "tool"
    assert transcript[-1]["content"].startswith("not run: the turn reached its limit")
    assert tool_pairing_problems(transcript, open_allowed=False) == []
    assert router.agent(team_id, agent.display_name).state.value == "completed"
    (record,) = router.store.reads.turns(agent.id)
    assert record.status is TurnStatus.ENDED
    assert check_team(router, team_id).ok


def test_fenced_turn_stops_and_writes_nothing(router: Router) -> None:
    team_id, agent = start(router)
    turn = router.claim(agent.id)
    assert turn is not None

    class TakenOver:
        def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
            # The worker looked dead: a newer epoch takes the agent over mid-call.
            router.take_over(team_id, agent.display_name, reason="lease expired")
            return {"role": "assistant", "content": "too late"}

    assert run_turn(router, turn, models=lambda a: TakenOver(), tools=default_registry()) is (
        TurnOutcome.FENCED
    )
    # Only the task it drained before the model call; the late reply was refused.
    assert [e["role"] for e in router.transcript(team_id, agent.display_name)] == ["user"]
    assert not [m for m in router.messages(team_id) if m.target_name == "Team Leader"]
    turns = router.store.reads.turns(agent.id)
    assert turns[0].status is TurnStatus.FENCED
    assert router.agent(team_id, agent.display_name).pending_trigger is TurnTrigger.RECOVERY


class Records:
    """Works three steps, then replies; keeps what it was shown at each call."""

    def __init__(self) -> None:
        self.seen: list[list[dict[str, Any]]] = []

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        self.seen.append(list(messages))
        if len(self.seen) > 3:
            return {"role": "assistant", "content": "done"}
        call = {"id": "call_0", "type": "function",
                "function": {"name": "do_work", "arguments": '{"step": "more"}'}}  # fmt: skip
        return {"role": "assistant", "content": None, "tool_calls": [call]}


# The transcript reads: every payload, or positions and payloads after a position.
WHOLE_OR_SINCE = {
    "SELECT ar_transcript_entries.payload",
    "SELECT ar_transcript_entries.position, ar_transcript_entries.payload",
}


def test_the_transcript_is_read_once_per_turn_and_extended(router: Router) -> None:
    team_id, agent = start(router)
    turn = router.claim(agent.id)
    assert turn is not None
    reads: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        columns = statement.split("FROM", maxsplit=1)[0].strip()
        if "FROM ar_transcript_entries" in statement and columns in WHOLE_OR_SINCE:
            reads.append(statement)

    sa.event.listen(router.store.engine, "before_cursor_execute", record)
    model = Records()
    try:
        outcome = run_turn(router, turn, models=lambda a: model, tools=default_registry())
    finally:
        sa.event.remove(router.store.engine, "before_cursor_execute", record)
    assert outcome is TurnOutcome.ENDED
    full = router.transcript(team_id, agent.display_name)
    # What the model saw at each step is the protocol section (the transcript has no system
    # prompt of its own), then the transcript up to then, as stored.
    assert [len(s) for s in model.seen] == [2, 4, 6, 8]
    assert all(seen[0]["content"].startswith(HEADING) for seen in model.seen)
    assert all(seen[1:] == full[: len(seen) - 1] for seen in model.seen)
    # One whole read, then only what was appended after the last entry read.
    assert len(reads) == 4  # one per model call
    assert "position >" not in reads[0]
    assert all("position >" in r for r in reads[1:])


def test_a_failure_the_lead_reads_never_quotes_the_database_driver() -> None:
    from agent_router.agents.loop import failure_text
    from agent_router.errors import StoreError

    driver = "database error: NumericValueOutOfRange('bigint out of range') UPDATE ar_budgets"

    text = failure_text(StoreError(driver))

    assert text.startswith("StoreError: the database refused a write of this turn")
    assert "bigint" not in text and "ar_budgets" not in text
    assert failure_text(ValueError("bad step")) == "ValueError: bad step"
