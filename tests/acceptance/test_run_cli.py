"""``agent-router run`` as a user runs it (a subprocess) against a local server that speaks Chat
Completions with tool calls over real HTTP. Behind the server, a scripted "LLM" (the
ScriptedModel, chosen by the system prompt of each request) decides the replies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent_router.agents.llm import DEFAULT_SCRIPT, ROLE_SCRIPTS, ScriptedModel, directive
from tests.support.chat_server import ChatServer, RecordedRequest, Reply, completion

CLI = str(Path(sys.executable).parent / "agent-router")
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


def run_cli(server: ChatServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OURS)}
    env.update(OPENAI_API_KEY="sk-test", AGENT_ROUTER_WORK_SECONDS="0")
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


def test_run_stops_at_its_budget_and_an_operator_raises_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'run.db'}"
    with ChatServer(responder=scripted_llm) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_OURS)}
        env.update(OPENAI_API_KEY="sk-test", AGENT_ROUTER_WORK_SECONDS="0",
                   AGENT_ROUTER_BUDGET_MODEL_CALLS="3")  # fmt: skip
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
