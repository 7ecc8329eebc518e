"""``agent-router run``: give a task to a new team's lead and run the team with an
OpenAI-compatible model until every agent rests.

The lead gets the ``Team Leader`` role's system prompt and the lead tools; sub-agents are created
by the lead (``create_sub_agent``) from the roles catalogue, each with its role's prompt and, if
the role names one, its own model and temperature.

Separate worker processes (``agent-router worker`` on a real broker) build the same runtime with
``AGENT_ROUTER_RUNTIME_FACTORY=agent_router.ops.team_run:openai_runtime`` and the ``openai_*``
settings (``AGENT_ROUTER_OPENAI_MODEL``, ``AGENT_ROUTER_OPENAI_BASE_URL``, the API key); their
tools come from the roles file, ``AGENT_ROUTER_MCP_SERVERS`` and ``AGENT_ROUTER_HOST_TOOLS``.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent_router.agents.llm import Model, ModelFactory
from agent_router.agents.roles import RoleCatalogue, roles_from_env
from agent_router.domain import (
    RESTING_STATES,
    AgentState,
    LedgerAction,
    MessageType,
)
from agent_router.ops.checks import TeamReport, check_team
from agent_router.router import Router
from agent_router.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

    from agent_router.agents.toolbox import AgentTools
    from agent_router.domain import Agent
    from agent_router.worker.runtime import Runtime

#: Agents in these states are done for now: nothing runs and nothing is scheduled for them.
SETTLED_STATES = RESTING_STATES | {AgentState.TERMINATED}


def openai_models(settings: Settings, roles: RoleCatalogue) -> ModelFactory:
    """One :class:`~agent_router.agents.openai_model.OpenAIModel` per (model, temperature), shared
    between threads; a role may override the default model and temperature."""
    from agent_router.agents.openai_model import OpenAIModel

    cache: dict[tuple[str | None, float | None], Model] = {}
    lock = threading.Lock()

    def factory(agent: Agent) -> Model:
        role = roles.get(agent.role)
        name = role.model if role and role.model else settings.openai_model
        temperature = settings.openai_temperature
        if role is not None and role.temperature is not None:
            temperature = role.temperature
        with lock:
            model = cache.get((name, temperature))
            if model is None:
                model = cache[(name, temperature)] = OpenAIModel(
                    settings.model_copy(
                        update={"openai_model": name, "openai_temperature": temperature}
                    )
                )
            return model

    return factory


def openai_runtime(settings: Settings, app: Celery) -> Runtime:
    """``AGENT_ROUTER_RUNTIME_FACTORY`` target: a worker runtime that runs every agent with the
    OpenAI-compatible model of the ``openai_*`` settings and the catalogue's roles."""
    from agent_router.agents.toolbox import agent_tools
    from agent_router.worker.publisher import CeleryPublisher
    from agent_router.worker.runtime import Runtime

    roles = roles_from_env()
    return Runtime(
        router=Router(settings, publisher=CeleryPublisher(app)),
        models=openai_models(settings, roles),
        tools=agent_tools(settings, roles),
        app=app,
    )


def print_tool_listing(tools: AgentTools, roles: RoleCatalogue, *, as_json: bool) -> bool:
    """Print what each role of the catalogue gets (``run --list-tools``); false when an MCP
    server could not be listed."""
    listings = [tools.listing(name) for name in roles.names()]
    for listing in listings:
        if as_json:
            print(json.dumps({"event": "tools", "role": listing.role, "tools": listing.tools,
                              "unavailable": listing.unavailable}))  # fmt: skip
            continue
        print(f"{listing.role}:")
        for name, source in listing.tools.items():
            print(f"  {name:<40} {source}")
        for server, error in listing.unavailable.items():
            print(f"  mcp:{server} unavailable: {error}")
    return not any(listing.unavailable for listing in listings)


@dataclass(kw_only=True)
class RunResult:
    team_id: int
    settled: bool
    states: dict[str, str] = field(default_factory=dict)
    failed_turns: list[str] = field(default_factory=list)
    final: str | None = None  # the lead's last reply
    report: TeamReport | None = None

    @property
    def ok(self) -> bool:
        return self.settled and not self.failed_turns and (self.report is None or self.report.ok)


def start_team(router: Router, task: str, roles: RoleCatalogue) -> int:
    """A new team whose lead has the catalogue's lead prompt and ``task`` from the user."""
    lead = roles.lead
    team = router.create_team(lead_system_prompt=lead.system_prompt if lead else None)
    router.send(
        team.id, to=team.lead.display_name, content=task, sender="user", type=MessageType.TASK
    )
    return team.id


def settled(router: Router, team_id: int) -> bool:
    return all(a.state in SETTLED_STATES for a in router.agents(team_id))


def wait_settled(router: Router, team_id: int, *, timeout: float, poll: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while not settled(router, team_id):
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def result_of(router: Router, team_id: int, *, is_settled: bool) -> RunResult:
    agents = router.agents(team_id)
    failed = [
        f"{e.agent_name} turn {e.turn_id}: {e.detail.get('error')}"
        for e in router.ledger(team_id)
        if e.action is LedgerAction.TURN_ENDED and e.detail.get("failed")
    ]
    lead = next(a for a in agents if a.is_lead)
    replies = [
        e.get("content")
        for e in router.store.reads.transcript(lead.id)
        if e.get("role") == "assistant" and e.get("content")
    ]
    return RunResult(
        team_id=team_id,
        settled=is_settled,
        states={a.display_name: a.state.value for a in agents},
        failed_turns=failed,
        final=str(replies[-1]) if replies else None,
        report=check_team(router, team_id, quiescent=True) if is_settled else None,
    )
