"""The model's window is a hard limit: an oversize tool result or message (the newest included)
is cut in the request, never in the transcript, so that no request passes the window less the
reply's reserve and no turn fails for it. The built-in loop and the openai SDK against a
scripted server that counts each prompt it receives the way the router does and refuses one
over the window with OpenAI's own HTTP 400 ``context_length_exceeded``."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from agent_router import MessageType, Router, Settings
from agent_router.agents.context import count_tokens, token_counter
from agent_router.agents.host_tools import host_function_tool
from agent_router.agents.loop import TurnOutcome, run_turn
from agent_router.agents.openai_model import OpenAIModel
from agent_router.agents.tools import default_registry
from tests.support.chat_server import (
    ChatServer,
    RecordedRequest,
    Reply,
    completion,
    context_length_exceeded,
    tool_call,
)

MODEL = "small-model"
WINDOW = 8192
RESERVE = WINDOW // 4  # the settings' reserve (4096) is capped at a quarter of the window
HUGE = 1_000_000
#: The note that stands for the middle of a cut text.
CUT = re.compile(r"\[([\d,]+) of ([\d,]+) characters of this message left out of this request")


def prompt_tokens(request: RecordedRequest) -> int:
    """The prompt's tokens as the router counts them."""
    body = request.body
    return count_tokens(body["messages"], body.get("tools") or (), token_counter(MODEL))


class CountingServer:
    """Counts every prompt; refuses one over ``WINDOW``; else calls the ``dump`` tool once
    per turn (when asked to in the newest message) and then replies."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompts: list[int] = []

    def __call__(self, request: RecordedRequest) -> Reply:
        tokens = prompt_tokens(request)
        with self.lock:
            self.prompts.append(tokens)
        if tokens > WINDOW:
            return context_length_exceeded(WINDOW, tokens)
        last = request.body["messages"][-1]
        if last["role"] == "user" and "dump it" in str(last["content"]):
            return completion(None, [tool_call(f"d{len(self.prompts)}", "dump", {})])
        return completion(f"Read {len(request.body['messages'])} messages.")


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ChatServer, CountingServer]]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    responder = CountingServer()
    with ChatServer(responder=responder) as server:
        yield server, responder


def _turns(
    router: Router, settings: Settings, server: ChatServer, messages: list[str]
) -> tuple[list[TurnOutcome], list[dict[str, Any]]]:
    """One turn of an agent per message, on a model with an 8,192-token window; the turns'
    outcomes and the agent's transcript."""
    model = OpenAIModel(settings.model_copy(update={
        "openai_model": MODEL, "openai_base_url": server.base_url, "openai_api_key": "sk-test",
        "openai_max_retries": 0, "context_window": WINDOW,
    }))  # fmt: skip
    tools = default_registry()
    tools.register(host_function_tool(lambda: "#" * HUGE, name="dump", description="A dump."))
    team = router.create_team()
    agent = router.create_agent(team.id, role="Analyst")
    outcomes = []
    try:
        for text in messages:
            router.send(team.id, to=agent.display_name, content=text, sender="Team Leader",
                        type=MessageType.MESSAGE)  # fmt: skip
            turn = router.claim(agent.id)
            assert turn is not None
            outcomes.append(run_turn(router, turn, models=lambda _a: model, tools=tools))
    finally:
        model.close()
    return outcomes, router.transcript(team.id, agent.display_name)


def _cut_notes(request: RecordedRequest) -> list[tuple[int, int, str]]:
    """Per cut text of the request: the characters its note says were left out, of how many,
    and the text."""
    out = []
    for message in request.body["messages"]:
        content = str(message.get("content") or "")
        for match in CUT.finditer(content):
            left, total = (int(g.replace(",", "")) for g in match.groups())
            out.append((left, total, content))
    return out


def test_an_oversize_tool_result_is_cut_in_every_request_never_in_the_transcript(
    router: Router, settings: Settings, counting: tuple[ChatServer, CountingServer]
) -> None:
    server, responder = counting
    outcomes, transcript = _turns(
        router, settings, server, ["dump it", "and now?", "anything else?"]
    )

    assert outcomes == [TurnOutcome.ENDED] * 3  # no failed turn
    assert len(responder.prompts) == 4  # the dump call, its reply, and one call per turn
    assert max(responder.prompts) <= WINDOW - RESERVE  # never over the window less the reserve
    # Every request after the dump holds its result cut, with the exact count left out.
    for request in server.requests[1:]:
        [(left, total, content)] = _cut_notes(request)
        assert total == HUGE
        assert content.count("#") == HUGE - left
    # The transcript keeps the result whole.
    stored = [e for e in transcript if e["role"] == "tool"]
    assert len(stored) == 1 and str(stored[0]["content"]).count("#") == HUGE


def test_an_oversize_message_is_cut_in_the_request_never_in_the_transcript(
    router: Router, settings: Settings, counting: tuple[ChatServer, CountingServer]
) -> None:
    server, responder = counting
    message = "Read this. " + "findings " * 6_666  # about 60,000 characters
    outcomes, transcript = _turns(router, settings, server, [message])

    assert outcomes == [TurnOutcome.ENDED]
    assert len(responder.prompts) == 1
    assert responder.prompts[0] <= WINDOW - RESERVE
    [(left, total, content)] = _cut_notes(server.requests[0])
    assert total == len(message)
    assert content.count("findings") < message.count("findings")
    body = content.split("\n", 1)[1]  # below the envelope's first line
    head, _, tail = body.partition("\n[")
    tail = tail.split("]\n", 1)[1].removesuffix("\n</agent-message>")
    assert message.startswith(head) and message.endswith(tail)
    assert len(head) + len(tail) + left == len(message)
    assert any(str(e.get("content")).count("findings") == message.count("findings")
               for e in transcript)  # fmt: skip
