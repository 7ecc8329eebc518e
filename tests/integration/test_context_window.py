"""An agent whose transcript outgrows its model's window keeps working: the built-in loop and
the openai SDK against a scripted server that refuses any request above a token limit with
OpenAI's own HTTP 400 ``context_length_exceeded`` body. The stored transcript stays complete."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from agent_router import MessageType, Router, Settings
from agent_router.agents.context import pairing_holds
from agent_router.agents.llm import Model
from agent_router.agents.loop import TurnOutcome, run_turn
from agent_router.agents.openai_model import OpenAIModel
from agent_router.agents.tools import default_registry
from agent_router.domain import Agent
from agent_router.ops.checks import check_team
from tests.support.chat_server import (
    ChatServer,
    RecordedRequest,
    Reply,
    completion,
    context_length_exceeded,
    tool_call,
)

#: The server's window, in its own count (a quarter of the request's JSON characters).
WINDOW = 3000
TURNS = 25


def server_tokens(request: RecordedRequest) -> int:
    return len(json.dumps(request.body["messages"])) // 4


class SmallWindow:
    """Refuses what exceeds ``WINDOW``; otherwise one ``do_work`` call, then a final reply."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.refused: list[int] = []
        self.served: list[int] = []

    def __call__(self, request: RecordedRequest) -> Reply:
        tokens = server_tokens(request)
        if tokens > WINDOW:
            with self.lock:
                self.refused.append(tokens)
            return context_length_exceeded(WINDOW, tokens)
        with self.lock:
            self.served.append(tokens)
        messages = request.body["messages"]
        if messages[-1]["role"] == "tool":
            return completion(f"Step done after {len(messages)} messages.")
        call = tool_call(f"w{len(messages)}", "do_work", {"step": "read the report"})
        return completion("Reading the report.", [call])


@pytest.fixture
def small_window(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ChatServer, SmallWindow]]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    responder = SmallWindow()
    with ChatServer(responder=responder) as server:
        yield server, responder


def test_the_agent_works_on_across_many_turns_past_its_window(
    router: Router, settings: Settings, small_window: tuple[ChatServer, SmallWindow]
) -> None:
    server, responder = small_window
    model = OpenAIModel(settings.model_copy(update={
        "openai_model": "small-model", "openai_base_url": server.base_url,
        "openai_api_key": "sk-test", "openai_max_retries": 0, "work_seconds": 0,
    }))  # fmt: skip

    def models(agent: Agent) -> Model:
        return model

    team = router.create_team()
    agent = router.create_agent(team.id, role="Analyst")
    reports = [f"Report {n}: " + f"line {n} of the findings. " * 60 for n in range(TURNS)]
    try:
        for report in reports:
            router.send(team.id, to=agent.display_name, content=report, sender="Team Leader",
                        type=MessageType.MESSAGE)  # fmt: skip
            turn = router.claim(agent.id)
            assert turn is not None
            outcome = run_turn(router, turn, models=models, tools=default_registry())
            assert outcome is TurnOutcome.ENDED
    finally:
        model.close()

    transcript = router.transcript(team.id, agent.display_name)
    stored_tokens = len(json.dumps(transcript)) // 4
    print(
        f"\nsmall window: {TURNS} turns, {len(server.requests)} requests, "
        f"{len(responder.refused)} refused ({responder.refused}), largest served "
        f"{max(responder.served)} of {WINDOW}; stored transcript {len(transcript)} entries, "
        f"~{stored_tokens} tokens"
    )
    # Every turn ended normally although the transcript is several windows long.
    assert stored_tokens > 3 * WINDOW
    assert 1 <= len(responder.refused) <= 2  # refused, compacted tighter, and it stuck
    assert all(tokens <= WINDOW for tokens in responder.served)
    assert len(responder.served) == 2 * TURNS  # one tool step and one final reply per turn
    # The record is complete: every report verbatim, every reply and tool result, in pairs.
    contents = [str(e.get("content")) for e in transcript]
    assert all(any(report in c for c in contents) for report in reports)
    assert sum(e["role"] == "assistant" for e in transcript) == 2 * TURNS
    assert sum(e["role"] == "tool" for e in transcript) == TURNS
    assert pairing_holds(transcript)
    # The last request (before the final reply) kept the newest turn whole, and was shorter.
    last_sent = server.requests[-1].body["messages"]
    assert last_sent[-1]["tool_call_id"] == transcript[-2]["tool_call_id"]
    assert reports[-1] in last_sent[-3]["content"]
    assert len(last_sent) < len(transcript) - 1
    assert pairing_holds(last_sent)
    assert check_team(router, team.id).ok
