"""Dedup keys name one send: a model server reusing a call id in a later reply sends a new
message, and a key reused for something else is refused as a conflict, never a silent success."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agent_router import DedupConflictError, MessageType, Router, Settings
from agent_router.agents.loop import TurnOutcome, run_turn
from agent_router.agents.tools import default_registry
from agent_router.outbox import RecordingPublisher


class ReusesCallZero:
    """Each reply sends ``message`` to Engineer_1 with the call id ``call_0`` (as servers that
    number calls per reply do), then ends the turn."""

    def __init__(self) -> None:
        self.message = ""

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "tool":
            return {"role": "assistant", "content": "sent"}
        arguments = json.dumps({"display_name": "Engineer_1", "message": self.message})
        function = {"name": "send_message_to_sub_agent", "arguments": arguments}
        call = {"id": "call_0", "type": "function", "function": function}
        return {"role": "assistant", "content": None, "tool_calls": [call]}


@pytest.fixture
def router(database_url: str) -> Iterator[Router]:
    r = Router(Settings(database_url=database_url, work_seconds=0), publisher=RecordingPublisher())
    yield r
    r.close()


def test_a_call_id_reused_in_a_later_turn_sends_a_new_message(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    model = ReusesCallZero()
    results = []
    for text in ("first steer", "second steer"):
        model.message = text
        router.send(team.id, to="Team Leader", content=f"please send {text}")
        turn = router.claim_turn(team.id, "Team Leader")
        assert turn is not None
        assert run_turn(router, turn, models=lambda a: model, tools=default_registry()) is (
            TurnOutcome.ENDED
        )
        tool = [e for e in router.transcript(team.id, "Team Leader") if e["role"] == "tool"][-1]
        results.append(json.loads(tool["content"]))
    to_engineer = [m.content for m in router.messages(team.id) if m.target_name == "Engineer_1"]
    assert to_engineer == ["first steer", "second steer"]
    assert results[0]["message_id"] != results[1]["message_id"]
    assert all(r["ok"] for r in results)
    assert all(
        m.type is MessageType.MESSAGE
        for m in router.messages(team.id)
        if m.target_name != "Team Leader"
    )


def test_a_dedup_key_reused_for_another_message_is_a_conflict(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    first = router.send(team.id, to="Engineer_1", content="deploy v1", dedup_key="deploy")
    again = router.send(team.id, to="Engineer_1", content="deploy v1", dedup_key="deploy")
    assert again.duplicate and again.message_id == first.message_id  # a retry: the same send
    ledger = len(router.ledger(team.id))
    for changed in (
        {"content": "deploy v2"},
        {"sender": "Team Leader"},
        {"type": MessageType.NOTICE},
    ):
        kwargs: dict[str, Any] = {"content": "deploy v1", "sender": "user", **changed}
        with pytest.raises(DedupConflictError):
            router.send(team.id, to="Engineer_1", dedup_key="deploy", **kwargs)
    assert [m.content for m in router.messages(team.id)] == ["deploy v1"]
    rejected = router.ledger(team.id)[ledger:]
    assert {e.detail["reason"] for e in rejected} == {"dedup_conflict"}
    assert sum(e.detail.get("repeats", 1) for e in rejected) == 3
    # The row counting them holds the latest refusal's code and fields, its sentence with them.
    conflict = {"dedup_key": "deploy", "message_id": first.message_id, "target": "Engineer_1"}
    assert (rejected[-1].detail["refused"], rejected[-1].detail["fields"]) == (
        "dedup_conflict",
        conflict,
    )
    # The same key to another agent names another message.
    router.create_agent(team.id, role="Designer")
    other = router.send(team.id, to="Designer_1", content="deploy v2", dedup_key="deploy")
    assert not other.duplicate
