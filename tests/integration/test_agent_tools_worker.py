"""``agent-router worker`` in its own process, configured only by environment variables, gives a
sub-agent the tools of its role: ``mcp-server-time`` (stdio, a child of the worker process)
from the roles file and a host function from ``AGENT_ROUTER_HOST_TOOLS``. The model is the
scripted one, which calls the tools its task names."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from agent_router import AgentState, MessageType, formats
from agent_router.agents.llm import directive
from agent_router.worker.runtime import Runtime

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 120.0

ROLES = f"""
[mcp_servers.time]
command = ["{sys.executable}", "-m", "mcp_server_time", "--local-timezone", "UTC"]

[[roles]]
name = "Clock Reader"
system_prompt = "You are a Clock Reader."
mcp_servers = ["time"]
"""


@pytest.fixture
def worker_env_extra(tmp_path: Path) -> dict[str, str]:
    roles = tmp_path / "roles.toml"
    roles.write_text(ROLES, encoding="utf-8")
    return {
        "AGENT_ROUTER_ROLES_FILE": str(roles),
        "AGENT_ROUTER_HOST_TOOLS": "tests.support.host_tools_example",
        "PYTHONPATH": str(REPO),
    }


def test_a_worker_process_runs_mcp_and_host_tools_for_a_sub_agent(
    subprocess_worker: Runtime,
) -> None:
    router = subprocess_worker.router
    team = router.create_team()
    agent = router.create_agent(team.id, role="Clock Reader")
    task = "\n".join(
        [
            "Read the clock.",
            directive("time__get_current_time", timezone="Europe/Paris"),
            directive("shout", text="tick"),
        ]
    )
    router.send(team.id, to=agent.display_name, content=task, sender=team.lead.display_name,
                type=MessageType.TASK)  # fmt: skip
    deadline = time.monotonic() + TIMEOUT
    while router.agent(team.id, agent.display_name).state is not AgentState.COMPLETED:
        assert time.monotonic() < deadline, router.transcript(team.id, agent.display_name)
        time.sleep(0.2)

    transcript = router.transcript(team.id, agent.display_name)
    names = {
        call["id"]: call["function"]["name"]
        for entry in transcript
        if entry["role"] == "assistant"
        for call in entry.get("tool_calls") or []
    }
    results = {names[e["tool_call_id"]]: e["content"] for e in transcript if e["role"] == "tool"}
    clock = formats.parse_fence(results["time__get_current_time"])
    assert (clock.tool, clock.server) == ("get_current_time", "time")
    assert json.loads(clock.content).get("timezone") == "Europe/Paris", results
    assert formats.parse_fence(results["shout"]) == formats.ToolOutput(
        tool="shout", server="host", content="TICK"
    )
