"""No poison: a model that writes absurd values, through the real OpenAI SDK over HTTP (the
scripted server plays it), on SQLite and PostgreSQL. Tool call ids of 300 characters, NULs in
tool arguments and in a prose answer, a question id of 5,000 digits, JSON nested 100,000 deep,
an argument of 20 MB: no turn fails, every message is delivered, ``check`` finds nothing, and
a sweeper pass afterwards repairs another team as it should (on PostgreSQL, a call id too long
for its column used to fail the turn, leave its agent running, and fail every later pass for
every team)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_router import AgentState, MessageType, QuestionStatus, Router, Settings
from agent_router import validation as check
from agent_router.domain import TurnTrigger
from agent_router.formats import parse
from agent_router.ops.checks import check_team
from agent_router.outbox import RecordingPublisher
from tests.support.chat_server import (
    ChatServer,
    Reply,
    View,
    absurd_id,
    completion,
    digits,
    huge,
    nested,
    tool_call,
)

from .helpers import assistant, start_running
from .test_sloppy_models import ENG, LEAD, Team, asks, reminded

#: The prose answer the lead writes: a NUL in it, and longer than one message (64 KiB).
PROSE = "Use OAuth\x00 with PKCE.\n" + "Details follow. " * 4500
#: What reaches the engineer of it: nothing but the NUL changed.
DELIVERED = PROSE.replace("\x00", "\ufffd")


@pytest.fixture(params=["sqlite", "postgresql"])
def own_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of the test's own: its sweeper pass sees only this test's teams."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'poison.db'}"
    return str(request.getfixturevalue("own_pg_schema_url"))


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChatServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with ChatServer() as s:
        yield s


@pytest.fixture
def router(own_database: str) -> Iterator[Router]:
    settings = Settings(
        database_url=own_database,
        ask_block_seconds=0.05,
        wake_recheck_seconds=0.05,
        lease_seconds=1.0,
        heartbeat_seconds=0.2,
        sweep_seconds=0.1,
        openai_model="sloppy-model",
        openai_api_key="sk-test",
        openai_max_retries=0,
        openai_timeout_seconds=30,
    )
    r = Router(settings, publisher=RecordingPublisher())
    r.create_schema()
    yield r
    r.close()


def lead(view: View) -> Reply:
    """A lead that writes every absurd value a broken model can."""
    if view.replies() == 0:
        return completion(
            None,
            [
                tool_call(
                    absurd_id("a"),
                    "create_sub_agent",
                    {"role": "Full-Stack Engineer", "task": "Build the login\x00 page."},
                ),
                tool_call("c-deep", "list_sub_agents", nested(100_000)),
                tool_call("c-deeper-than-python", "list_sub_agents", nested(10_000)),
                tool_call(
                    "c-digits",
                    "answer_sub_agent_question",
                    '{"question_id": ' + digits(5000) + ', "answer": "yes"}',
                ),
                tool_call(
                    "c-huge", "send_message_to_sub_agent", {"display_name": ENG, "message": huge()}
                ),
            ],
        )
    if view.replies() == 1:
        message = {"display_name": ENG, "message": "Use the design\x00 system."}
        return completion(None, [tool_call(absurd_id("b"), "send_message_to_sub_agent", message)])
    if asks(view) or reminded(view):
        return completion(PROSE)  # an answer in prose, reminded or not
    if any(s.type == "output" and s.sender == ENG for s in view.fresh_seen()):
        return completion("All done.")
    return completion("Delegated.")


def engineer(view: View) -> Reply:
    """Asks the lead under a call id no column holds, then reports what it was told."""
    if view.replies() == 0:
        return completion(
            None, [tool_call(absurd_id("q"), "ask_master", {"question": "Which auth\x00?"})]
        )
    return completion("Done\x00: the login page uses what I was told.")


def test_absurd_values_from_a_model_fail_no_turn_and_stop_no_sweep(
    router: Router, server: ChatServer
) -> None:
    # Another team, whose worker died in a turn: the sweeper must still take it over.
    other = router.create_team()
    router.create_agent(other.id, role="Engineer")
    dead = start_running(router, other.id, "Engineer_1")
    dead.append_assistant(assistant("working on it"))

    team = Team(router, server, {LEAD: lead, ENG: engineer})
    team.task("Add a login page.")
    outcomes = team.run()
    assert {outcome.value for _, outcome in outcomes} <= {"ended", "suspended"}, outcomes

    # What the lead's absurd calls became: results it can act on, under ids that fit.
    results = {k: json.loads(v) for k, v in team.results(LEAD).items()}
    assert all(len(call_id) <= check.MAX_KEY_CHARS for call_id in results)
    created = results[check.call_id(absurd_id("a"))]
    assert created["ok"] and created["display_name"] == ENG
    assert (results["c-deep"]["reason"], results["c-huge"]["reason"]) == (
        "arguments_too_large",
        "arguments_too_large",
    )
    assert "20971" in results["c-huge"]["error"]  # its size, in bytes
    assert results["c-deeper-than-python"]["reason"] == "bad_arguments"
    assert "nest too deep" in results["c-deeper-than-python"]["error"]
    assert results["c-digits"]["reason"] == "unknown_question"
    assert "5000 digits" in results["c-digits"]["error"]
    assert results[check.call_id(absurd_id("b"))]["ok"]
    # Nothing of the 20 MB is kept to be sent again: the stored call holds its size and head.
    stored = [
        c["function"]["arguments"]
        for e in router.transcript(team.id, LEAD)
        if e["role"] == "assistant"
        for c in e.get("tool_calls") or ()
    ]
    assert max(len(a) for a in stored) <= router.settings.max_tool_argument_bytes
    assert sum(a.startswith(check.ARGUMENTS_NOT_KEPT) for a in stored) == 2

    # The engineer got its task and the lead's message, each NUL escaped, and the whole prose
    # answer: the first part the result of its ask, the rest messages after it.
    envelopes = [e for e in router.transcript(team.id, ENG) if e["role"] in ("user", "tool")]
    seen = [parse(e["content"]) for e in envelopes]
    contents = [s.content for s in seen if s.sender == LEAD]
    assert "Build the login\ufffd page." in contents
    assert "Use the design\ufffd system." in contents
    [question] = [
        router.question(m.question_id)
        for m in router.messages(team.id)
        if m.type is MessageType.ASK and m.question_id
    ]
    assert question.status is QuestionStatus.ANSWERED
    assert question.tool_call_id == check.call_id(absurd_id("q"))
    parts = [s.content for s in seen if s.sender == LEAD and s.content.startswith("[part ")]
    assert len(parts) == 2 and parts[0].startswith("[part 1/2]\n")
    assert "".join(p.split("\n", 1)[1] for p in parts) == DELIVERED
    # The lead read the engineer's report; the team rests, every message delivered.
    assert (team.state(LEAD), team.state(ENG)) == (AgentState.COMPLETED, AgentState.COMPLETED)
    assert router.store.budget(team.id).exhausted is None
    team.check()

    # A sweeper pass repairs the other team: the dead turn is taken over, nothing failed.
    time.sleep(router.settings.lease_seconds + 0.2)
    report = router.sweep()
    assert (report.taken_over, report.failed, report.failures) == (1, 0, ())
    healed = router.agent(other.id, "Engineer_1")
    assert (healed.state, healed.pending_trigger) == (AgentState.SCHEDULED, TurnTrigger.RECOVERY)
    assert check_team(router, team.id, quiescent=True).ok
    assert router.store.reads.quarantined() == []


def test_a_host_loop_answers_a_long_call_id_by_the_models_own(router: Router) -> None:
    """A host's loop stores the model's reply and answers its calls under the ids the model
    wrote: the router keeps a call id no column holds under one it makes from it, the same
    every time, so the result pairs with its call."""
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    turn = start_running(router, team.id, "Engineer_1")
    long_id = absurd_id("h", 500)
    turn.append_assistant(
        {
            "role": "assistant",
            "content": "Looking\x00.",
            "tool_calls": [
                {"id": long_id, "type": "function", "function": {"name": "t", "arguments": "{}"}}
            ],
        }
    )
    assert turn.open_tool_calls() == [check.call_id(long_id)]
    turn.append_tool_result(long_id, "found\x00 it")
    turn.append_assistant(assistant("done"))
    turn.end()
    result = [e for e in router.transcript(team.id, "Engineer_1") if e["role"] == "tool"]
    assert [(r["tool_call_id"], r["content"]) for r in result] == [
        (check.call_id(long_id), "found\ufffd it")
    ]
    assert check_team(router, team.id, quiescent=True).ok
