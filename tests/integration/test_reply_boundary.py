"""What models and tools return cannot break an agent, on SQLite and PostgreSQL: a lone
surrogate a model writes (as a JSON escape in its arguments, or in its text), a tool's return
value of any type, two tool calls under one id from any model (a custom one in the built-in loop,
a host's own loop through the hosted turn API), and usage so absurd that its cost passes the
64-bit columns. Each is driven through the real OpenAI SDK against the scripted HTTP server
where a model is involved, and each asserts that no turn failed, that every later request still
encodes (the server received it), and what the transcript and the ledger hold.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agent_router import MessageType, Router, Settings
from agent_router.agents import hosted
from agent_router.agents.host_tools import HostToolset
from agent_router.agents.llm import Model
from agent_router.agents.loop import TurnOutcome, run_turn
from agent_router.agents.roles import RoleCatalogue
from agent_router.agents.toolbox import agent_tools
from agent_router.agents.tools import default_registry
from agent_router.domain import Agent, LedgerAction
from agent_router.formats import parse_fence
from agent_router.limits import REPLACEMENT
from agent_router.outbox import RecordingPublisher
from agent_router.store.rules import MAX_STORED, NANO
from agent_router.validation import MAX_TOKENS_PER_CALL
from tests.support.chat_server import (
    ChatServer,
    Reply,
    View,
    completion,
    tool_call,
    usage,
)

from .test_sloppy_models import ENG, LEAD, Team

#: A lone surrogate as a JSON escape: what a model's arguments hold as text.
ESCAPED = "\\ud800"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChatServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with ChatServer() as s:
        yield s


@pytest.fixture
def router(database_url: str) -> Iterator[Router]:
    settings = Settings(
        database_url=database_url,
        ask_block_seconds=0.05,
        wake_recheck_seconds=0.05,
        openai_model="sloppy-model",
        openai_api_key="sk-test",
        openai_max_retries=0,
        openai_timeout_seconds=10,
        # Absurd usage would spend any budget at once; unlimited, the totals themselves are
        # what is tested.
        budget_model_calls=None,
        budget_turns=None,
        budget_tokens=None,
        budget_cost_usd=None,
        models={"sloppy-model": {"input": 300.0, "output": 300.0}},
    )
    r = Router(settings, publisher=RecordingPublisher())
    yield r
    r.close()


def _every_text(router: Router, team: int) -> list[str]:
    """Every message's content and every ledger event's detail of the team, as text."""
    texts = [m.content for m in router.messages(team)]
    texts += [json.dumps(e.detail, ensure_ascii=False) for e in router.ledger(team)]
    return texts


# ------------------------------------------------------------------- a lone surrogate


def test_a_lone_surrogate_a_model_writes_breaks_no_later_request(
    router: Router, server: ChatServer
) -> None:
    def lead(view: View) -> Reply:
        if view.replies() == 0:
            task = '{"role": "Full-Stack Engineer", "task": "fix the form ' + ESCAPED + '"}'
            return completion(None, [tool_call("c-create", "create_sub_agent", task)])
        return completion("Noted \ud800.")  # the body's JSON escapes it: a surrogate decoded

    def engineer(view: View) -> Reply:
        if view.replies() == 0:
            message = '{"target": "Team Leader", "message": "blocked on ' + ESCAPED + '"}'
            return completion(None, [tool_call("c-tell", "send_message_to_agent", message)])
        return completion("Done.")

    team = Team(router, server, {LEAD: lead, ENG: engineer})
    team.task("Staff the form.")
    first = team.run()
    team.task("Anything else?")
    later = team.run()

    assert {outcome for _, outcome in first + later} == {TurnOutcome.ENDED}
    # Every agent was called again after the surrogate entered its transcript: each of those
    # requests encoded (the server received it).
    assert len(team.sloppy.requests_of(LEAD)) >= 3
    assert len(team.sloppy.requests_of(ENG)) == 2
    stored = router.transcript(team.id, LEAD)
    [create] = [c for e in stored if e["role"] == "assistant" for c in e.get("tool_calls") or []]
    assert json.loads(create["function"]["arguments"])["task"] == f"fix the form {REPLACEMENT}"
    assert all("\ud800" not in str(e) for e in stored)
    assert f"Noted {REPLACEMENT}." in [e.get("content") for e in stored]
    # What the others read is U+FFFD: the engineer's task, the lead the engineer's message.
    task = team.sloppy.requests_of(ENG)[0].fresh_seen()[0]
    assert task.content == f"fix the form {REPLACEMENT}"
    read_by_lead = [s.content for v in team.sloppy.requests_of(LEAD) for s in v.fresh_seen()]
    assert f"blocked on {REPLACEMENT}" in read_by_lead
    # The request quotes the model's own arguments back with U+FFFD in place of the escape.
    last = team.sloppy.requests_of(LEAD)[-1]
    sent = [c for m in last.messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert json.loads(sent[0]["function"]["arguments"])["task"] == f"fix the form {REPLACEMENT}"
    team.check()


def test_an_agent_whose_stored_reply_already_holds_a_surrogate_escape_runs_again(
    router: Router, server: ChatServer
) -> None:
    """A transcript written before replies were made storable keeps the model's escape as
    written: the requests built from it send U+FFFD, and the agent's turns succeed."""
    team = Team(router, server, {LEAD: lambda view: completion("Carrying on.")})
    team.task("Start.")
    turn = router.claim(router.agent(team.id, LEAD).id)
    assert turn is not None
    turn.drain()
    arguments = '{"role": "Full-Stack Engineer", "task": "' + ESCAPED + '"}'
    old_reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c-old", "type": "function",
             "function": {"name": "create_sub_agent", "arguments": arguments}}
        ],
    }  # fmt: skip
    router.store.append_assistant(turn.record, old_reply)  # as the store held it, unchanged
    turn.append_tool_result("c-old", '{"ok": false, "error": "not run"}')
    turn.end()
    stored = router.transcript(team.id, LEAD)
    assert any(ESCAPED in str(c) for e in stored for c in e.get("tool_calls") or [])

    team.task("Go on.")
    assert team.run() == [(LEAD, TurnOutcome.ENDED)]

    [view] = team.sloppy.requests_of(LEAD)
    sent = [c for m in view.messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert json.loads(sent[0]["function"]["arguments"])["task"] == REPLACEMENT
    team.check()


# -------------------------------------------------------------- what a tool returns


class Opaque:
    """An object JSON cannot hold, with a readable repr."""

    def __repr__(self) -> str:
        return "Opaque(42)"


class Unprintable(Exception):  # noqa: N818 - named for what it is
    """An error whose message raises when it is made."""

    def __str__(self) -> str:
        raise ValueError("no message")


def test_a_host_tool_may_return_anything_and_the_model_reads_it(
    router: Router, server: ChatServer
) -> None:
    host = HostToolset()

    @host.tool
    def raw_bytes() -> bytes:
        """Bytes that are not UTF-8."""
        return b"ok \xff\xfe end"

    @host.tool
    def opaque() -> Opaque:
        """An object."""
        return Opaque()

    @host.tool
    def huge() -> int:
        """A number of 5,000 digits."""
        return int("9" * 4000) * 10**1000 + 9

    @host.tool
    def nested() -> dict[str, Any]:
        """Bytes, an object and a huge number inside JSON."""
        return {"data": b"\xff", "thing": Opaque(), "n": 10**5000, "ok": [1, 2.5, None]}

    @host.tool
    def broken() -> str:
        """Raises an error whose message cannot be made."""
        raise Unprintable

    names = ("raw_bytes", "opaque", "huge", "nested", "broken")
    calls = [tool_call(name, name, {}) for name in names]

    def engineer(view: View) -> Reply:
        return completion(None, calls) if view.replies() == 0 else completion("Done.")

    team = Team(router, server, {ENG: engineer})
    roles = RoleCatalogue.demo()  # the software team's roles: a Full-Stack Engineer
    team.tools = agent_tools(router.settings, roles, host=host)
    router.create_agent(team.id, role="Full-Stack Engineer")
    router.send(team.id, to=ENG, content="Use them.", sender=LEAD, type=MessageType.TASK)

    assert team.run() == [(ENG, TurnOutcome.ENDED), (LEAD, TurnOutcome.ENDED)]

    stored = {k: parse_fence(v).content for k, v in team.results(ENG).items()}
    assert stored["raw_bytes"] == f"ok {REPLACEMENT}{REPLACEMENT} end"
    assert json.loads(stored["opaque"]) == "Opaque(42)"
    assert "too long to show" in json.loads(stored["huge"])
    inside = json.loads(stored["nested"])
    assert inside["data"] == REPLACEMENT and inside["thing"] == "Opaque(42)"
    assert "too long to show" in inside["n"] and inside["ok"] == [1, 2.5, None]
    assert json.loads(stored["broken"])["error"] == "Unprintable"
    # The model read each result in its next request.
    second = team.sloppy.requests_of(ENG)[1]
    read = {m["tool_call_id"]: m["content"] for m in second.fresh_results()}
    assert {k: parse_fence(v).content for k, v in read.items()} == stored
    assert not any("ended before it returned" in t for t in _every_text(router, team.id))
    team.check()


# --------------------------------------------------------------- one id, two calls


class TwoCallsOneId:
    """A custom model (not the OpenAI one): its first reply makes two calls under one id."""

    def __init__(self) -> None:
        self.requests: list[list[dict[str, Any]]] = []

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.requests.append(messages)
        if len(self.requests) > 1:
            return {"role": "assistant", "content": "Both listed."}
        call = {"id": "same", "type": "function",
                "function": {"name": "list_sub_agents", "arguments": "{}"}}  # fmt: skip
        return {"role": "assistant", "content": None, "tool_calls": [call, dict(call)]}


def _answered_calls(router: Router, team: int) -> tuple[list[str], list[str]]:
    """The ids of the lead's tool calls, and those its results answer."""
    stored = router.transcript(team, LEAD)
    calls = [c["id"] for e in stored if e["role"] == "assistant" for c in e.get("tool_calls") or []]
    answered = [e["tool_call_id"] for e in stored if e["role"] == "tool"]
    return calls, answered


def test_a_custom_model_writing_two_calls_under_one_id_gets_both_run(router: Router) -> None:
    team = router.create_team().id
    router.send(team, to=LEAD, content="List them twice.", sender="user", type=MessageType.TASK)
    model = TwoCallsOneId()

    def models(agent: Agent) -> Model:
        return model

    turn = router.claim(router.agent(team, LEAD).id)
    assert turn is not None

    assert run_turn(router, turn, models=models, tools=default_registry()) is TurnOutcome.ENDED

    calls, answered = _answered_calls(router, team)
    assert len(calls) == 2 and calls[0] == "same" and calls[1] != "same"
    assert answered == calls
    # The model read both results, each under its own id.
    reread = [m.get("tool_call_id") for m in model.requests[1] if m["role"] == "tool"]
    assert reread == calls


def test_a_host_loop_stepping_two_calls_under_one_id_gets_both_run(router: Router) -> None:
    team = router.create_team().id
    router.send(team, to=LEAD, content="List them twice.", sender="user", type=MessageType.TASK)
    lead = router.agent(team, LEAD)
    model = TwoCallsOneId()
    texts = []

    with hosted.claim(lead.id, lead.epoch, router=router, tools=default_registry()) as turn:
        assert turn is not None
        while True:
            with turn.model_call(model="custom") as call:
                reply = model.complete(call.messages, call.tools)
                call.usage(None, reply=reply)
            if (text := turn.step(reply)) is not None:
                break
        texts.append(text)

    assert turn.outcome == TurnOutcome.ENDED and texts == ["Both listed."]
    calls, answered = _answered_calls(router, team)
    assert len(set(calls)) == 2 and answered == calls


# ------------------------------------------------------------------- absurd usage


def test_usage_past_the_cost_columns_saturates_and_fails_no_turn(
    router: Router, server: ChatServer
) -> None:
    """2**40 prompt and 2**40 completion tokens a call at $300 a million: a call costs about
    $660 million, and the team's 64-bit total in nano-dollars would overflow at the 14th
    call."""
    absurd = usage(MAX_TOKENS_PER_CALL, MAX_TOKENS_PER_CALL)
    steps = 20

    def lead(view: View) -> Reply:
        if view.replies() < steps - 1:
            call = tool_call(f"c{view.replies()}", "list_sub_agents", {})
            return completion(None, [call], usage=absurd)
        return completion("Done.", usage=absurd)

    team = Team(router, server, {LEAD: lead})
    assert router.settings.max_turn_steps > steps
    team.task("Count.")

    assert team.run() == [(LEAD, TurnOutcome.ENDED)]

    budget = router.budget(team.id)
    assert budget.usage.model_calls == steps
    assert budget.usage.prompt_tokens == steps * MAX_TOKENS_PER_CALL
    assert budget.usage.cost_usd == MAX_STORED / NANO
    calls = [e for e in router.ledger(team.id) if e.action is LedgerAction.MODEL_CALL]
    assert len(calls) == steps
    saturated = [e.detail.get("saturated") for e in calls]
    # The totals reach the column's range at the 14th call and stay there.
    assert saturated[:13] == [None] * 13
    assert all(s == ["team_cost_nano"] for s in saturated[13:]), saturated
    for text in _every_text(router, team.id):
        assert "bigint" not in text and "OutOfRange" not in text, text
    team.check()
