"""The model and the tools an agent's turns run with, built from the settings: the one place every
process that runs turns (``agent-router worker``, a host's worker after ``install(app)``,
``agent-router run``) gets them from.

Which model an agent runs on, first match wins:

1. its team's model, kept with the team when it was created
   (``Router.create_team(model="gpt-4o-mini")``): a chat product serves each team on its own;
2. its role's ``model`` in the roles file (``AGENT_ROUTER_ROLES_FILE``);
3. ``AGENT_ROUTER_OPENAI_MODEL``.

Every name is a model of the OpenAI-compatible endpoint of the ``openai_*`` settings (base URL,
API key, timeout), with the role's ``temperature`` and ``context_window`` when it gives them.
The name ``scripted`` (:data:`SCRIPTED_MODEL`) is the built-in scripted model instead, and only
its agents get the pretend ``do_work`` tool: the demo, the load tools and the tests name it. An
agent with no model at all fails its turn with
:class:`~agent_router.errors.ModelNotConfiguredError`, which names what to set; it never gets a
canned reply.

The tools: the router's multi-agent tools for every agent, and for a sub-agent the MCP servers
and host functions its role declares (``AGENT_ROUTER_MCP_SERVERS``, ``AGENT_ROUTER_HOST_TOOLS``,
the roles file), as :func:`~agent_router.agents.toolbox.agent_tools` assembles them.

The worker layer registers its runtime here (:func:`serve_from`), so that the turn API of a
host's task (:func:`agent_router.agents.hosted.claim`) finds the worker's router and tools
without importing the worker.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from agent_router.agents.llm import (
    SCRIPTED_MODEL,
    DeltaSink,
    Model,
    ModelFactory,
    ScriptedModel,
    Streamed,
    StreamsReplies,
)
from agent_router.agents.roles import RoleCatalogue, roles_from_env
from agent_router.agents.toolbox import AgentTools, agent_tools
from agent_router.agents.tools import ToolRegistry, team_registry
from agent_router.domain import Agent
from agent_router.errors import ConfigurationError, ModelNotConfiguredError
from agent_router.settings import ModelSpec, Settings

if TYPE_CHECKING:
    from agent_router.router import Router

#: Teams whose model a process keeps in memory (it is read again after that many teams).
TEAMS_KEPT = 10_000

#: A team's model by team id (``None``: the team names none).
TeamModel = Callable[[int], str | None]
#: The sink of a team's agent (team id, display name) for its streamed model calls.
DeltaSinks = Callable[[int, str], DeltaSink]


@dataclass(frozen=True, kw_only=True)
class ModelChoice:
    """The model an agent runs on and where its name comes from."""

    name: str | None
    #: ``team N``, ``role 'NAME'`` or ``AGENT_ROUTER_OPENAI_MODEL``; ``None`` when no name.
    source: str | None
    temperature: float | None
    context_window: int | None

    @property
    def scripted(self) -> bool:
        return self.name == SCRIPTED_MODEL


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """A model a process may call: its name and the server's base URL (never the API key)."""

    model: str
    base_url: str
    source: str


def default_base_url(settings: Settings) -> str:
    return settings.openai_base_url or "https://api.openai.com/v1"


@dataclass(frozen=True)
class NoModel:
    """The model of an agent that has none: its turn drains its messages as any turn does, then
    fails at the first model call with :class:`~agent_router.errors.ModelNotConfiguredError`.
    (Failing before the drain would leave the messages in the mailbox, and their wake would
    start the next failing turn, again and again.)"""

    reason: str

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        raise ModelNotConfiguredError(self.reason)


class AgentModels:
    """A :data:`~agent_router.agents.llm.ModelFactory`: each agent's model by the precedence of
    the module docstring. One OpenAI client per (name, temperature, context window), shared
    between threads; a team's model is read once per team (it never changes)."""

    def __init__(
        self,
        settings: Settings,
        roles: RoleCatalogue,
        team_model: TeamModel | None = None,
        deltas: DeltaSinks | None = None,
    ) -> None:
        self.settings = settings
        self.roles = roles
        self.team_model = team_model
        self.deltas = deltas
        self._teams: dict[int, str | None] = {}
        self._models: dict[tuple[str, float | None, int | None], Model] = {}
        self._lock = threading.Lock()

    def choice(self, agent: Agent) -> ModelChoice:
        role = self.roles.get(agent.role)
        temperature = self.settings.openai_temperature
        if role is not None and role.temperature is not None:
            temperature = role.temperature
        window = role.context_window if role is not None else None
        team = self._team(agent.team_id)
        name: str | None
        source: str | None
        if team is not None:
            name, source = team, f"team {agent.team_id}"
        elif role is not None and role.model:
            name, source = role.model, f"role {role.name!r}"
        elif self.settings.openai_model:
            name, source = self.settings.openai_model, "AGENT_ROUTER_OPENAI_MODEL"
        else:
            name = source = None
        return ModelChoice(name=name, source=source, temperature=temperature, context_window=window)

    def __call__(self, agent: Agent) -> Model:
        chosen = self.choice(agent)
        if chosen.name is None:
            return NoModel(
                f"no model for {agent.display_name} (team {agent.team_id}, role "
                f"{agent.role!r}) in this worker: set AGENT_ROUTER_OPENAI_MODEL, the role's "
                "`model` in the roles file, or the team's model (create_team(model=...))"
            )
        if chosen.scripted:
            return ScriptedModel.for_agent(
                agent, write_seconds=self.settings.scripted_write_seconds
            )
        key = (chosen.name, chosen.temperature, chosen.context_window)
        with self._lock:
            model = self._models.get(key)
            if model is None:
                model = self._models[key] = self._openai(*key)
        if self.settings.stream_to_user and agent.is_lead and self.deltas is not None:
            # The shared client; the sink is this agent's, the stream each call's own.
            return Streamed(
                cast(StreamsReplies, model), self.deltas(agent.team_id, agent.display_name)
            )
        return model

    def _team(self, team_id: int) -> str | None:
        if self.team_model is None:
            return None
        with self._lock:
            if team_id in self._teams:
                return self._teams[team_id]
        name = self.team_model(team_id)
        with self._lock:
            if len(self._teams) >= TEAMS_KEPT:  # a long-lived worker meets ever new teams
                self._teams.clear()
            self._teams[team_id] = name
        return name

    def _openai(self, name: str, temperature: float | None, window: int | None) -> Model:
        try:
            from agent_router.agents.openai_model import OpenAIModel
        except ImportError as exc:
            raise ConfigurationError(
                f"model {name!r} needs the openai package: pip install 'agent-router[openai]'"
            ) from exc
        update: dict[str, object] = {"openai_model": name, "openai_temperature": temperature}
        if window is not None:
            spec = self.settings.models.get(name, ModelSpec())
            update["models"] = self.settings.models | {
                name: spec.model_copy(update={"context_window": window})
            }
        return OpenAIModel(self.settings.model_copy(update=update))

    def endpoints(self) -> list[Endpoint]:
        """The models this process may call whatever team asks: the setting's and each role's
        (a team's own model is known only when its turn runs)."""
        named = [(self.settings.openai_model, "AGENT_ROUTER_OPENAI_MODEL")]
        named += [(r.model, f"role {r.name!r}") for r in map(self.roles.get, self.roles.names())
                  if r is not None]  # fmt: skip
        found: dict[str, Endpoint] = {}
        for name, source in named:
            if name and name != SCRIPTED_MODEL and name not in found:
                found[name] = Endpoint(
                    model=name, base_url=default_base_url(self.settings), source=source
                )
        return list(found.values())


@dataclass(frozen=True, kw_only=True)
class Built:
    """What :func:`build` returns: the model factory and the tools of one process."""

    models: AgentModels
    tools: AgentTools

    def describe(self) -> list[dict[str, str]]:
        """What this process serves, one record per model endpoint and per tool source (no API
        key, no other secret): what a worker logs when it starts."""
        records = [
            {"kind": "model", "model": e.model, "base_url": e.base_url, "source": e.source}
            for e in self.models.endpoints()
        ]
        if self.models.settings.openai_model == SCRIPTED_MODEL:
            records.append({"kind": "model", "model": SCRIPTED_MODEL, "base_url": "built-in",
                            "source": "AGENT_ROUTER_OPENAI_MODEL"})  # fmt: skip
        for name, spec in self.tools.servers.items():
            records.append({"kind": "mcp_server", "server": name, "transport": spec.transport})
        records += [
            {"kind": "host_tools", "host_module": module}
            for module in _modules(self.models.settings.host_tools)
        ]
        return records


def build(
    settings: Settings,
    roles: RoleCatalogue | None = None,
    *,
    team_model: TeamModel | None = None,
    server_options: Iterable[str] = (),
    deltas: DeltaSinks | None = None,
) -> Built:
    """The models and tools of a process that runs turns, from ``settings`` and ``roles``
    (default: the roles file of ``AGENT_ROUTER_ROLES_FILE``, else the built-in catalogue).
    ``team_model`` reads a team's model (``lambda team_id: router.team(team_id).model``);
    ``server_options``: more default MCP servers (``NAME=COMMAND_OR_URL``); ``deltas``: the
    sink of a team's agent for its streamed model calls (with ``stream_to_user``, the lead's)."""
    roles = roles if roles is not None else roles_from_env()
    models = AgentModels(settings, roles, team_model, deltas)
    tools = agent_tools(
        settings,
        roles,
        builtin=team_registry(roles),
        server_options=server_options,
        works=lambda agent: models.choice(agent).scripted,
    )
    return Built(models=models, tools=tools)


def for_router(router: Router, roles: RoleCatalogue | None = None) -> Built:
    """:func:`build` for a process whose turns ``router`` claims: team models read from it,
    streamed replies told to its teams' feeds (:meth:`Router.delta_sink`)."""
    return build(
        router.settings,
        roles,
        team_model=lambda team_id: router.team(team_id).model,
        deltas=router.delta_sink,
    )


def scripted_models(settings: Settings) -> ModelFactory:
    """A :class:`~agent_router.agents.llm.ScriptedModel` per agent, by role, whatever its team
    or role names: for tests and tools that run every agent on the scripted model."""

    def factory(agent: Agent) -> Model:
        return ScriptedModel.for_agent(agent, write_seconds=settings.scripted_write_seconds)

    return factory


def _modules(spec: str | None) -> list[str]:
    return [m.strip() for m in (spec or "").split(",") if m.strip()]


class _Process:
    """The router and tools of this process's turn runtime, as the worker layer provides them."""

    lock = threading.Lock()
    provider: Callable[[], tuple[Router, ToolRegistry]] | None = None


def serve_from(provider: Callable[[], tuple[Router, ToolRegistry]]) -> None:
    """Make ``provider`` the source of this process's router and tools (the worker's runtime
    registers itself on import)."""
    with _Process.lock:
        _Process.provider = provider


def process_runtime() -> tuple[Router, ToolRegistry]:
    """The router and tools of this process's worker runtime (built on first use)."""
    with _Process.lock:
        provider = _Process.provider
    if provider is None:
        raise ConfigurationError(
            "no worker runtime in this process: pass router= (and tools=), or run the task in "
            "a worker of an app the router is installed in (agent_router.worker.install(app))"
        )
    return provider()
