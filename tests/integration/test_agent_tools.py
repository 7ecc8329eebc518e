"""A sub-agent's turn with real tools: MCP servers (``mcp-server-time`` over stdio, the in-repo
notes server over streamable HTTP) and a host function, driven by a scripted Chat Completions
server through the OpenAI SDK. Everything runs on 127.0.0.1: no network."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field

from agent_router import Agent, MessageType, Router, Settings, formats
from agent_router.agents.host_tools import HostToolset
from agent_router.agents.llm import Model
from agent_router.agents.loop import TurnOutcome, run_turn
from agent_router.agents.openai_model import OpenAIModel
from agent_router.agents.roles import RoleCatalogue
from agent_router.agents.toolbox import AgentTools, agent_tools
from agent_router.agents.tools import ToolContext
from agent_router.ops.checks import tool_pairing_problems
from agent_router.outbox import RecordingPublisher
from tests.support.chat_server import ChatServer, RecordedRequest, Reply, completion, tool_call
from tests.support.mcp_http_server import TOKEN_HEADER, NotesServer

ROLE = "Tool User"

#: One model reply per request: a list of calls, or the final text.
Step = list[dict[str, Any]] | str


@pytest.fixture
def chat() -> Iterator[ChatServer]:
    with ChatServer() as server:
        yield server


@pytest.fixture
def settings(tmp_path: Path, chat: ChatServer) -> Settings:
    return Settings(
        database_url=f"sqlite:///{tmp_path / 'tools.db'}",
        max_turn_steps=8,
        openai_model="test-model",
        openai_base_url=chat.base_url,
        openai_api_key="sk-test",
        openai_max_retries=0,
        mcp_call_timeout_seconds=30,
    )


@pytest.fixture
def router(settings: Settings) -> Iterator[Router]:
    r = Router(settings, publisher=RecordingPublisher())
    r.create_schema()
    yield r
    r.close()


def catalogue(extra: str) -> RoleCatalogue:
    return RoleCatalogue.from_toml(
        f'[[roles]]\nname = "{ROLE}"\nsystem_prompt = "You use tools."\n{extra}'
    )


def scripted(steps: list[Step], before: dict[int, Callable[[], object]] | None = None) -> Any:
    """A responder answering request ``i`` with ``steps[i]``, after running ``before[i]``."""
    count = iter(range(len(steps)))

    def respond(request: RecordedRequest) -> Reply:
        i = next(count)
        if before and i in before:
            before[i]()
        step = steps[i]
        return completion(step) if isinstance(step, str) else completion(None, step)

    return respond


def run_sub_agent_turn(
    router: Router, settings: Settings, tools: AgentTools, agent: Agent | None = None
) -> Agent:
    """Give a new sub-agent (or ``agent``) a message and run its turn to the end."""
    if agent is None:
        agent = router.create_agent(router.create_team().id, role=ROLE)
    router.send(agent.team_id, to=agent.display_name, content="Use your tools.",
                sender="Team Leader", type=MessageType.TASK)  # fmt: skip
    model = OpenAIModel(settings)

    def models(agent: Agent) -> Model:
        return model

    turn = router.claim(agent.id)
    assert turn is not None
    try:
        assert run_turn(router, turn, models=models, tools=tools) is TurnOutcome.ENDED
    finally:
        model.close()
    transcript = router.transcript(agent.team_id, agent.display_name)
    assert tool_pairing_problems(transcript, open_allowed=False) == []
    return agent


def results(router: Router, agent: Agent) -> dict[str, str]:
    """Tool call id -> the result in the stored transcript."""
    transcript = router.transcript(agent.team_id, agent.display_name)
    return {e["tool_call_id"]: e["content"] for e in transcript if e["role"] == "tool"}


def outputs(stored: dict[str, str], server: str) -> dict[str, str]:
    """Tool call id -> what the tool returned, read from the fence around each stored result
    (every one names ``server``)."""
    out = {}
    for call_id, text in stored.items():
        output = formats.parse_fence(text)
        assert output.server == server, text
        out[call_id] = output.content
    return out


def sent_results(request: RecordedRequest) -> dict[str, str]:
    """Tool call id -> the result as the model received it."""
    return {
        m["tool_call_id"]: m["content"] for m in request.body["messages"] if m["role"] == "tool"
    }


def tool_schemas(request: RecordedRequest) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"] for t in request.body.get("tools", [])}


def test_a_stdio_server_from_pypi_answers_a_sub_agent(
    router: Router, settings: Settings, chat: ChatServer
) -> None:
    server = f'command = ["{sys.executable}", "-m", "mcp_server_time", "--local-timezone", "UTC"]'
    roles = catalogue(f'mcp_servers = ["time"]\n[mcp_servers.time]\n{server}\n')
    chat.responder = scripted(
        [
            [
                tool_call("now", "time__get_current_time", {"timezone": "UTC"}),
                tool_call("bad", "time__get_current_time", {"timezone": "Nowhere/Atlantis"}),
            ],
            [tool_call("dead", "time__get_current_time", {"timezone": "UTC"})],
            [tool_call("again", "time__get_current_time", {"timezone": "Asia/Tokyo"})],
            "It is late.",
        ],
        before={1: kill_time_servers},
    )
    agent = run_sub_agent_turn(router, settings, agent_tools(settings, roles))

    first = chat.requests[0]
    schemas = tool_schemas(first)
    assert {"time__get_current_time", "time__convert_time", "ask_master"} <= set(schemas)
    assert schemas["time__get_current_time"]["parameters"]["required"] == ["timezone"]
    # The server's real answer, stored in the transcript and sent to the model, fenced with the
    # tool's and the server's names.
    fenced = results(router, agent)
    assert sent_results(chat.requests[-1]) == fenced
    assert fenced["now"].startswith('<tool-output tool="get_current_time" server="time">\n')
    stored = outputs(fenced, "time")
    now = json.loads(stored["now"])
    assert now["timezone"] == "UTC"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", now["datetime"])
    # The server's isError result is an error the model can read.
    bad = json.loads(stored["bad"])
    assert bad["ok"] is False and bad["reason"] == "tool_error"
    assert "Nowhere/Atlantis" in bad["error"]
    # The server process died between two steps: one error result, then a new process.
    dead = json.loads(stored["dead"])
    assert dead["ok"] is False and dead["reason"] == "server_unavailable"
    assert json.loads(stored["again"])["timezone"] == "Asia/Tokyo"


def time_servers() -> list[int]:
    """The ``mcp_server_time`` processes this process started."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and b"mcp_server_time" in cmdline:
            found.append(int(proc.name))
    return found


def kill_time_servers() -> None:
    pids = time_servers()
    assert pids, "no mcp_server_time child process"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)  # the SDK's child watcher reaps it


def test_an_http_server_killed_mid_turn_is_an_error_result_then_reconnected(
    router: Router, settings: Settings, chat: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTES_TEST_TOKEN", "t0ken")
    notes = NotesServer().start()
    roles = catalogue(
        'mcp_servers = ["notes"]\n[mcp_servers.notes]\n'
        f'url = "{notes.url}"\ncall_timeout_seconds = 5\n'
        f'headers = {{ "{TOKEN_HEADER}" = "${{NOTES_TEST_TOKEN}}" }}\n'
    )
    chat.responder = scripted(
        [
            [
                tool_call("a", "notes__add_note", {"text": "first"}),
                tool_call("who", "notes__whoami", {}),
            ],
            [tool_call("b", "notes__add_note", {"text": "second"})],
            [tool_call("c", "notes__add_note", {"text": "third"})],
            [
                tool_call("slow", "notes__slow", {"seconds": 60}),
                tool_call("fail", "notes__fail", {"reason": "no disk"}),
            ],
            [tool_call("d", "notes__add_note", {"text": "fourth"})],
            "Noted.",
        ],
        before={1: notes.kill, 2: notes.start},
    )
    try:
        agent = run_sub_agent_turn(router, settings, agent_tools(settings, roles))
    finally:
        notes.kill()

    fenced = results(router, agent)
    stored = outputs(fenced, "notes")
    assert json.loads(stored["a"]) == {"count": 1, "notes": ["first"]}
    assert stored["who"] == "t0ken"  # the header, with the variable filled in
    down = json.loads(stored["b"])
    assert down["ok"] is False and down["reason"] == "server_unavailable"
    # A new process behind the same URL: a new session, and the notes of the old one are gone.
    assert json.loads(stored["c"]) == {"count": 1, "notes": ["third"]}
    assert json.loads(stored["slow"])["reason"] == "timeout"
    assert json.loads(stored["fail"])["reason"] == "tool_error"
    # A timeout leaves the session usable.
    assert json.loads(stored["d"]) == {"count": 2, "notes": ["third", "fourth"]}
    assert [sent_results(r) for r in chat.requests][-1] == fenced


def test_a_host_function_gets_validated_arguments(
    router: Router, settings: Settings, chat: ChatServer
) -> None:
    host = HostToolset()
    calls: list[tuple[str, int, str]] = []

    @host.tool
    def book_room(
        room: Annotated[str, Field(description="The room's name.")],
        people: int,
        ctx: ToolContext,
        minutes: int = 30,
    ) -> dict[str, Any]:
        """Book a meeting room.

        Rooms are booked for half an hour unless told otherwise."""
        if room == "attic":
            raise LookupError("no room called attic")
        calls.append((room, people, ctx.agent.display_name))
        return {"room": room, "people": people, "minutes": minutes}

    @host.tool(name="ping", description="Answers pong.")
    async def anything() -> str:
        await asyncio.sleep(0)
        return "pong"

    chat.responder = scripted(
        [
            [
                tool_call("ok", "book_room", {"room": "Blue", "people": "4"}),
                tool_call("missing", "book_room", {"room": "Blue"}),
                tool_call("extra", "book_room", {"room": "Blue", "people": 2, "floor": 3}),
                tool_call("wrong", "book_room", {"room": "Blue", "people": "many"}),
                tool_call("all", "book_room", {"room": 5, "floor": 3}),
                tool_call("raises", "book_room", {"room": "attic", "people": 1}),
                tool_call("ping", "ping", {}),
            ],
            "Booked.",
        ]
    )
    tools = agent_tools(settings, catalogue(""), host=host)
    agent = run_sub_agent_turn(router, settings, tools)

    schema = tool_schemas(chat.requests[0])
    assert schema["book_room"]["description"] == "Book a meeting room."
    assert schema["book_room"]["parameters"] == {
        "type": "object",
        "properties": {
            "room": {"type": "string", "description": "The room's name."},
            "people": {"type": "integer"},
            "minutes": {"type": "integer", "default": 30},
        },
        "required": ["room", "people"],
        "additionalProperties": False,
    }
    assert schema["ping"] == {
        "name": "ping",
        "description": "Answers pong.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    }
    # Called once, with the string "4" validated into the int 4 and the context injected.
    assert calls == [("Blue", 4, agent.display_name)]
    stored = results(router, agent)
    # What the function returned (or raised) is fenced as the host's; a call refused before it
    # ran is the router's answer.
    ran = outputs({k: stored[k] for k in ("ok", "raises", "ping")}, "host")
    assert json.loads(ran["ok"]) == {"room": "Blue", "people": 4, "minutes": 30}
    for call_id, field in (("missing", "people"), ("extra", "floor"), ("wrong", "people")):
        error = json.loads(stored[call_id])
        assert error["ok"] is False and error["reason"] == "bad_arguments", call_id
        assert f"`{field}`" in error["error"], error
    every = json.loads(stored["all"])["error"]  # three problems, one result
    assert all(f"`{field}`" in every for field in ("room", "people", "floor")), every
    raised = json.loads(ran["raises"])
    assert raised["reason"] == "tool_failed" and "no room called attic" in raised["error"]
    assert ran["ping"] == "pong"


def test_a_server_down_when_a_turn_starts_is_left_out_until_it_is_up(
    router: Router, settings: Settings, chat: ChatServer
) -> None:
    notes = NotesServer()  # not started yet
    roles = catalogue(f'mcp_servers = ["notes"]\n[mcp_servers.notes]\nurl = "{notes.url}"\n')
    tools = agent_tools(settings, roles)
    chat.responder = scripted(
        [
            [tool_call("early", "notes__add_note", {"text": "early"})],
            "The notes server is down.",
            [tool_call("later", "notes__add_note", {"text": "later"})],
            "Noted.",
        ]
    )
    agent = run_sub_agent_turn(router, settings, tools)  # the turn ends, it does not fail
    with notes:
        run_sub_agent_turn(router, settings, tools, agent)

    first_turn, second_turn = chat.requests[0], chat.requests[2]
    assert not any(name.startswith("notes__") for name in tool_schemas(first_turn))
    assert "notes__add_note" in tool_schemas(second_turn)
    stored = results(router, agent)
    assert json.loads(stored["early"])["reason"] == "server_unavailable"  # the router's answer
    assert json.loads(outputs({"later": stored["later"]}, "notes")["later"]) == {
        "count": 1,
        "notes": ["later"],
    }
