"""A team that would never stop, under two real ``agent-router worker`` processes on PostgreSQL
and Redis, driven through the openai SDK by a scripted Chat Completions server: two sub-agents
thank each other forever. The team's model-call budget, shared by both workers, stops it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from agent_router import Router, Settings
from agent_router.agents.roles import RoleCatalogue
from agent_router.domain import AgentState, BudgetName, LedgerAction, MessageType
from agent_router.ops.checks import check_team
from agent_router.ops.team_run import SETTLED_STATES
from agent_router.worker import runtime
from tests.support.chat_server import ChatServer, RecordedRequest, Reply, completion, tool_call

from .conftest import _wait_for_worker, _worker_env

MODEL = "pingpong-model"
PRICES = {MODEL: {"input": 2.5, "cached_input": 1.25, "output": 10.0}}
LIMIT = 40
PARTNER = {"UI Operator": "Full-Stack Engineer_1", "Full-Stack Engineer": "UI Operator_1"}


class PingPong:
    """The scripted model: the lead creates two sub-agents that thank each other; each thank-you
    is answered with one. Every reply carries a ``usage`` the test sums afterwards."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: list[tuple[str, dict[str, int]]] = []  # (role, usage) of every reply

    def __call__(self, request: RecordedRequest) -> Reply:
        messages: list[dict[str, Any]] = request.body["messages"]
        system = str(messages[0].get("content")) if messages[0]["role"] == "system" else ""
        roles = ("UI Operator", "Full-Stack Engineer", "Team Leader")
        role = next((r for r in roles if f" {r} " in system.split(".")[0] + " "), "?")
        last = messages[-1]
        n = len(messages)
        if role == "Team Leader":
            if n <= 2:
                calls = [
                    tool_call(
                        f"lead_{n}_{i}", "create_sub_agent", {"role": r, "task": f"Thank {p}."}
                    )
                    for i, (r, p) in enumerate(PARTNER.items())
                ]
                reply = completion(None, calls, model=MODEL, usage=self._usage(role, n))
            else:
                reply = completion("Noted.", model=MODEL, usage=self._usage(role, n))
        elif last["role"] == "tool":
            reply = completion("Thanked.", model=MODEL, usage=self._usage(role, n))
        else:
            thanks = {"target": PARTNER[role], "message": "Thank you so much!"}
            call = tool_call(f"t_{n}", "send_message_to_agent", thanks)
            reply = completion(None, [call], model=MODEL, usage=self._usage(role, n))
        return reply

    def _usage(self, role: str, n: int) -> dict[str, Any]:
        prompt, completion_tokens, cached = 200 + 37 * n, 11 + n % 5, 128 if n > 4 else 0
        with self.lock:
            self.sent.append(
                (role, {"prompt": prompt, "completion": completion_tokens, "cached": cached})
            )
        return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip


@pytest.fixture
def two_workers(
    celery_settings: Settings, celery_app: Celery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Router, PingPong, list[Path]]]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    model = PingPong()
    with ChatServer(responder=model) as server:
        env = _worker_env(celery_settings)
        env.update(
            NO_PROXY="127.0.0.1",
            AGENT_ROUTER_RUNTIME_FACTORY="agent_router.ops.team_run:openai_runtime",
            AGENT_ROUTER_OPENAI_MODEL=MODEL,
            AGENT_ROUTER_OPENAI_BASE_URL=server.base_url,
            AGENT_ROUTER_OPENAI_API_KEY="sk-test",
            AGENT_ROUTER_MODELS=json.dumps(PRICES),
        )
        procs: list[subprocess.Popen[bytes]] = []
        logs: list[Any] = []
        hostnames = [f"ar-budget-{i}-{uuid.uuid4().hex[:6]}@localhost" for i in range(2)]
        for hostname in hostnames:
            log = tmp_path / f"{hostname}.log"
            logs.append(log.open("w"))
            procs.append(subprocess.Popen(
                [str(Path(sys.executable).parent / "agent-router"), "worker",
                 "--concurrency=3", "--loglevel=INFO", f"--hostname={hostname}"],
                env=env, stdout=logs[-1], stderr=subprocess.STDOUT,
            ))  # fmt: skip
        rt = runtime.configure(
            celery_settings.model_copy(update={"models": PRICES}), app=celery_app
        )
        try:
            for hostname, proc in zip(hostnames, procs, strict=True):
                _wait_for_worker(celery_app, hostname, proc, tmp_path / f"{hostname}.log")
            yield rt.router, model, [tmp_path / f"{h}.log" for h in hostnames]
        finally:
            runtime.reset()
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            for handle in logs:
                handle.close()
        assert server.requests  # the workers did reach the scripted server


def settle(router: Router, team_id: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agents = router.agents(team_id)
        if len(agents) == 3 and all(a.state in SETTLED_STATES for a in agents):
            return
        time.sleep(0.2)
    pytest.fail(f"team did not settle: {[(a.display_name, a.state) for a in agents]}")


def test_ping_pong_stops_at_its_budget_across_two_workers(
    two_workers: tuple[Router, PingPong, list[Path]],
) -> None:
    router, model, logs = two_workers
    lead_prompt = RoleCatalogue.demo().lead
    assert lead_prompt is not None
    team = router.create_team(
        lead_system_prompt=lead_prompt.system_prompt, budget={BudgetName.MODEL_CALLS: LIMIT}
    )
    router.send(team.id, to="Team Leader", content="Get the two of them to thank each other.",
                sender="user", type=MessageType.TASK)  # fmt: skip

    settle(router, team.id)
    time.sleep(1.0)  # nothing may move once settled: a late call would show below
    settle(router, team.id)

    ledger = router.ledger(team.id)
    budget = router.store.budget(team.id)
    calls = [e for e in ledger if e.action is LedgerAction.MODEL_CALL]
    spent = [e.detail for e in ledger if e.action is LedgerAction.BUDGET_EXHAUSTED]
    warnings = [e.detail for e in ledger if e.action is LedgerAction.BUDGET_WARNING]
    # Turn tasks each worker process ran (its log names every task it received).
    per_worker = [
        sum("agent_router.run_agent_turn[" in line and "received" in line
            for line in log.read_text().splitlines())
        for log in logs
    ]  # fmt: skip
    print(
        f"\nping-pong: limit {LIMIT} model calls; granted {budget.usage.model_calls}, "
        f"served {len(model.sent)}, recorded {len(calls)}; turns {budget.used[BudgetName.TURNS]}; "
        f"tokens {budget.usage.total_tokens}; cost ${budget.usage.cost_usd:.6f}; "
        f"budget_exhausted {spent}; warnings {len(warnings)}; turn tasks per worker {per_worker}"
    )
    assert all(n > 0 for n in per_worker)  # both workers ran turns of the team
    assert budget.exhausted is BudgetName.MODEL_CALLS
    assert spent == [spent[0]] and spent[0]["budget"] == "model_calls"
    assert spent[0]["limit"] == LIMIT
    assert len(warnings) == 1
    # The one warning reached every agent as a wrap-up notice (context only).
    notices = [m for m in router.messages(team.id) if m.type is MessageType.NOTICE]
    wrap_up = sorted(m.target_name for m in notices if "Wrap up" in m.content)
    assert wrap_up == sorted(a.display_name for a in router.agents(team.id))
    # Within the limit: every call the server answered was granted and recorded, no more.
    assert budget.usage.model_calls == LIMIT
    assert len(model.sent) == len(calls) == LIMIT
    # Usage summed per agent and per team is what the server reported, priced by the table.
    by_agent = router.store.reads.usage_by_agent(team.id)
    names = {a.id: a.role for a in router.agents(team.id)}
    for agent_id, got in by_agent.items():
        mine = [u for role, u in model.sent if role == names[agent_id]]
        assert got.model_calls == len(mine)
        assert got.prompt_tokens == sum(u["prompt"] for u in mine)
        assert got.completion_tokens == sum(u["completion"] for u in mine)
        assert got.cached_tokens == sum(u["cached"] for u in mine)
    assert sum(u.model_calls for u in by_agent.values()) == LIMIT
    expected = sum(
        ((u["prompt"] - u["cached"]) * 2.5 + u["cached"] * 1.25 + u["completion"] * 10.0) / 1e6
        for _, u in model.sent
    )
    assert budget.usage.cost_usd == pytest.approx(expected, abs=1e-9 * LIMIT)
    # A clean stop: everyone rests, nothing dangles, no question is left open.
    assert all(a.state in (AgentState.IDLE, AgentState.COMPLETED) for a in router.agents(team.id))
    report = check_team(router, team.id, quiescent=True)
    assert report.ok, report
