"""``agent-router run`` as a user runs it (a subprocess) against a local server that speaks Chat
Completions with tool calls over real HTTP. Behind the server, a scripted "LLM" decides the
replies: the ScriptedModel (chosen by the system prompt of each request), or a sloppy model
that forgets questions, answers in prose and sends a broken call among good ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agent_router import LedgerAction, Router, Settings
from agent_router.agents.llm import DEFAULT_SCRIPT, ROLE_SCRIPTS, ScriptedModel, directive
from tests.support.chat_server import (
    ChatServer,
    Move,
    RecordedRequest,
    Reply,
    SloppyModel,
    View,
    completion,
    message_reply,
    tool_call,
)

CLI = str(Path(sys.executable).parent / "agent-router")
ENG = "Full-Stack Engineer_1"
TIMEOUT = 240

TASK = "Ship a /health endpoint.\n" + directive(
    "create_sub_agent",
    role="Full-Stack Engineer",
    task="Add /health to the API.\n" + directive("ask_master", question="Check the database too?"),
)


def scripted_llm(request: RecordedRequest) -> Reply:
    messages: list[dict[str, Any]] = request.body["messages"]
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    role = next((r for r in ROLE_SCRIPTS if f"You are a {r}" in system), None)
    lead = "You are the Team Leader" in system
    script = None if lead else ROLE_SCRIPTS.get(role or "", DEFAULT_SCRIPT)
    reply = ScriptedModel(script=script).complete(messages, request.body.get("tools", []))
    return completion(reply.get("content"), reply.get("tool_calls") or [])


_OURS = ("AGENT_ROUTER_", "OPENAI_")
#: The runs staff the demo's software team (the lead creates a Full-Stack Engineer).
DEMO_TEAM = {"AGENT_ROUTER_ROLES_FILE": "demo"}


def run_cli(server: ChatServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OURS)}
    env.update(OPENAI_API_KEY="sk-test", AGENT_ROUTER_WORK_SECONDS="0", **DEMO_TEAM)
    return subprocess.run(
        [CLI, "run", TASK, "--model", "test-model", "--base-url", server.base_url, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
    )


def test_run_drives_a_team_with_a_chat_completions_model() -> None:
    with ChatServer(responder=scripted_llm) as server:
        proc = run_cli(server, "--json")
        requests = server.requests
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    result = records[-1]
    assert result["event"] == "result" and result["ok"] is True, result
    assert result["states"] == {"Team Leader": "completed", "Full-Stack Engineer_1": "completed"}
    actions = {r["action"] for r in records if r["event"] == "ledger"}
    assert {"agent_created", "ask", "question_resolved", "turn_claimed", "turn_ended"} <= actions

    # Real requests with the tools each agent may see, the API key, and the model name.
    assert all(r.headers["authorization"] == "Bearer sk-test" for r in requests)
    assert all(r.body["model"] == "test-model" for r in requests)
    tools = {
        r.body["messages"][0]["content"][:30]: {t["function"]["name"] for t in r.body["tools"]}
        for r in requests
    }
    lead_tools = next(v for k, v in tools.items() if "Team Leader" in k)
    sub_tools = next(v for k, v in tools.items() if "Full-Stack Engineer" in k)
    assert "create_sub_agent" in lead_tools and "ask_master" not in lead_tools
    assert "ask_master" in sub_tools and "create_sub_agent" not in sub_tools


def test_run_timeline_and_a_missing_key() -> None:
    with ChatServer(responder=scripted_llm) as server:
        proc = run_cli(server)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "Full-Stack Engineer_1" in proc.stdout and "completed" in proc.stdout
        env = {k: v for k, v in os.environ.items() if not k.startswith(_OURS)}
        no_key = subprocess.run(
            [CLI, "run", "x", "--model", "m", "--base-url", server.base_url],
            check=False, capture_output=True, text=True, timeout=TIMEOUT, env=env,
        )  # fmt: skip
    assert no_key.returncode == 1, no_key.stderr
    [line] = no_key.stderr.splitlines()
    assert line.startswith("agent-router: error:") and "API key" in line
    # No model at all: the one line names both ways to give one.
    no_model = subprocess.run(
        [CLI, "run", "x", "--base-url", "http://127.0.0.1:9/v1"],
        check=False, capture_output=True, text=True, timeout=TIMEOUT,
        env={**env, "OPENAI_API_KEY": "sk-test"},
    )  # fmt: skip
    assert no_model.returncode == 1, no_model.stderr
    [line] = no_model.stderr.splitlines()
    assert line.startswith("agent-router: error:") and "--model" in line
    assert "AGENT_ROUTER_OPENAI_MODEL" in line


def test_run_stops_at_its_budget_and_an_operator_raises_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'run.db'}"
    with ChatServer(responder=scripted_llm) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_OURS)}
        env.update(OPENAI_API_KEY="sk-test", AGENT_ROUTER_WORK_SECONDS="0",
                   AGENT_ROUTER_BUDGET_MODEL_CALLS="3", **DEMO_TEAM)  # fmt: skip
        proc = subprocess.run(
            [CLI, "run", TASK, "--model", "test-model", "--base-url", server.base_url,
             "--json", "--database-url", url],
            check=False, capture_output=True, text=True, timeout=TIMEOUT, env=env,
        )  # fmt: skip
        served = len(server.requests)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    result = records[-1]
    assert result["budget_exhausted"] == "model_calls" and result["ok"] is False
    assert result["usage"]["model_calls"] == served == 3
    spent = [r for r in records if r.get("action") == "budget_exhausted"]
    assert len(spent) == 1 and spent[0]["detail"]["budget"] == "model_calls"
    assert "budget model_calls spent (3 of 3)" in spent[0]["text"]
    calls = [r for r in records if r.get("action") == "model_call"]
    assert len(calls) == 3 and calls[0]["text"].startswith("model call (test-model): ")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CLI, *args, "--database-url", url], check=False,
                              capture_output=True, text=True, timeout=60, env=env)  # fmt: skip

    team = str(result["team_id"])
    status = [json.loads(line) for line in cli("status", team, "--json").stdout.splitlines()]
    assert sum(s["model_calls"] for s in status) == 3
    assert sum(s["prompt_tokens"] for s in status) == 3  # the scripted usage: 1 + 1 per call
    raised = cli("budget", team, "--model-calls", "50", "--unlimited", "cost", "--json")
    assert raised.returncode == 0, raised.stdout + raised.stderr
    budget = json.loads(raised.stdout)
    assert budget["exhausted"] is None
    assert budget["limits"]["model_calls"] == 50 and budget["limits"]["cost"] is None
    shown = cli("budget", team)
    assert "model_calls" in shown.stdout and "50" in shown.stdout
    ledger = cli("ledger", team).stdout
    assert "budget set by operator (CLI)" in ledger and "the team may go on" in ledger


# ------------------------------------------------------------------ with a sloppy model


def sloppy_lead(*, answers_with_tool: bool) -> Move:
    """A lead that staffs with one good call and one broken one, forgets the question it is
    asked, and after the reminder answers it with the tool or, again, in prose."""

    def move(view: View) -> Reply:
        fresh = view.fresh_seen()
        if any(s.type == "notice" and s.sender == "system" for s in fresh):
            if not answers_with_tool:
                return completion("Use PostgreSQL 16.")
            [ask] = [s for s in view.all_seen() if s.type == "ask"]
            args = {"question_id": ask.question_id, "answer": "Use PostgreSQL 16."}
            return completion(None, [tool_call("c-answer", "answer_sub_agent_question", args)])
        if view.replies() == 0:
            good = {"role": "Full-Stack Engineer", "task": "Build the password reset API."}
            return completion(
                None,
                [
                    tool_call("c-good", "create_sub_agent", good),
                    tool_call("c-bad", "create_sub_agent", '{"role": "UI Operator", "task": "Bu'),
                ],
            )
        if any(s.type == "ask" for s in fresh):
            return completion("Good question, carry on.")  # forgets to answer
        reports = [s.content for s in fresh if s.type == "output"]
        return completion(f"All done: {reports[-1]}" if reports else "Delegated.")

    return move


def engineer(view: View) -> Reply:
    if view.replies() == 0:
        return completion(None, [tool_call("c-ask", "ask_master", {"question": "Which database?"})])
    told = [s.content for s in view.all_seen() if s.role == "tool"]
    return completion(f"Reset API built; told: {told[-1]}")


def run_sloppy_cli(server: ChatServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OURS)}
    env.update(OPENAI_API_KEY="sk-test", NO_PROXY="127.0.0.1", **DEMO_TEAM)
    return subprocess.run(
        [CLI, "run", "Add a password reset.", "--model", "sloppy", "--base-url",
         server.base_url, *args],
        check=False, capture_output=True, text=True, timeout=TIMEOUT, env=env,
    )  # fmt: skip


def run_sloppy(server: ChatServer, *args: str) -> tuple[int, list[dict[str, Any]]]:
    proc = run_sloppy_cli(server, "--json", *args)
    try:
        return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()]
    except ValueError:
        raise AssertionError(proc.stdout[-3000:] + proc.stderr[-3000:]) from None


@pytest.mark.parametrize("answers_with_tool", [True, False], ids=["tool", "prose"])
def test_run_with_a_sloppy_model_reminds_answers_and_keeps_the_good_call(
    answers_with_tool: bool,
) -> None:
    model = SloppyModel(
        {"Team Leader": sloppy_lead(answers_with_tool=answers_with_tool), ENG: engineer}
    )
    with ChatServer(responder=model) as server:
        code, records = run_sloppy(server)
    result = records[-1]
    assert code == 0 and result["ok"] is True, result
    # The good call created the engineer; the broken one created nobody and was answered.
    assert result["states"] == {"Team Leader": "completed", ENG: "completed"}
    second = model.requests_of("Team Leader")[1]
    bad = next(e for e in second.fresh if e.get("tool_call_id") == "c-bad")
    assert '"reason": "bad_arguments"' in bad["content"]
    # The forgotten question was reminded, then answered: by the tool, or with the prose.
    reminders = [
        s
        for view in model.requests_of("Team Leader")
        for s in view.fresh_seen()
        if s.type == "notice" and "open question" in s.content
    ]
    assert len(reminders) == 1 and f"from {ENG}" in reminders[0].content
    assert model.requests_of(ENG)[-1].fresh_seen()[0].content == "Use PostgreSQL 16."
    assert result["final"] == "All done: Reset API built; told: Use PostgreSQL 16."
    answers = [r for r in records if r["event"] == "ledger" and r["detail"].get("type") == "answer"]
    assert [r["outcome"] for r in answers] == ["resolved"]
    assert result["expired_questions"] == [] and result["reason"] is None
    # A real model gets no pretend work tool.
    assert "do_work" not in model.requests_of(ENG)[0].tools
    assert "ask_master" in model.requests_of(ENG)[0].tools


def silent_lead(view: View) -> Reply:
    """A lead that, once asked, only ever replies with nothing at all."""
    if view.replies() == 0:
        good = {"role": "Full-Stack Engineer", "task": "Build the API."}
        return completion(None, [tool_call("c1", "create_sub_agent", good)])
    if view.replies() == 1 and not any(s.type == "ask" for s in view.fresh_seen()):
        return completion("Delegated.")
    return message_reply({"role": "assistant", "content": None})


def test_run_stops_with_the_reason_when_nothing_can_make_progress(tmp_path: Path) -> None:
    """Reminded, asked again, the silent lead still writes nothing, so there is no answer to
    deliver. The lead rests, the engineer waits: the run says so and stops instead of waiting
    out its timeout."""
    model = SloppyModel({"Team Leader": silent_lead, ENG: engineer})
    url = f"sqlite:///{tmp_path / 'run.db'}"
    with ChatServer(responder=model) as server:
        code, records = run_sloppy(server, "--database-url", url, "--timeout", "600")
    result = records[-1]
    assert code == 1 and result["ok"] is False and result["settled"] is False
    # The question's deadline is below the run's timeout (half of it), not the default hour.
    router = Router(Settings(database_url=url))
    [asked] = [e for e in router.ledger(result["team_id"]) if e.action is LedgerAction.ASK]
    question = router.question(asked.detail["question_id"])
    assert question.deadline - asked.created_at <= timedelta(seconds=300)
    router.close()
    assert result["reason"].startswith("nothing can make progress: ")
    [wait] = result["waiting_on"]
    assert wait.startswith(f"{ENG} waits on Team Leader for its answer to question")
    assert wait.endswith("(Team Leader is completed, 0 message(s) to read)")
    assert wait in result["reason"]
    assert result["states"] == {"Team Leader": "completed", ENG: "waiting"}


def test_run_timeline_says_what_the_team_waits_on() -> None:
    with ChatServer(responder=SloppyModel({"Team Leader": silent_lead, ENG: engineer})) as server:
        proc = run_sloppy_cli(server)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = " ".join(proc.stdout.split())  # the console wraps long lines
    assert f"blocked: {ENG} waits on Team Leader for its answer to question" in out
    assert "stopped: nothing can make progress:" in out
