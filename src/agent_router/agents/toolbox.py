"""Each agent's tools: the router's own, plus what its role declares (MCP servers, host
functions).

:class:`AgentTools` is a :class:`~agent_router.agents.tools.ToolRegistry` the loop uses as it
uses the built-in one: ``schemas(agent)`` and ``call(name, arguments, ctx)`` answer for the
agent at hand. The tools of a declaration are assembled once per process (MCP tool lists are
fetched from the servers then) and reused by every turn; a server that cannot be listed is left
out of that turn and asked again at the next one.

Which declaration an agent gets: ``declare(agent)`` when the host gives that function (tools per
agent, e.g. by display name), else its role's (the roles file). A role that does not list
``mcp_servers`` gets the default servers (those given outside the roles file) and one that does
not list ``host_tools`` gets every host function; the lead gets neither by default, and an
agent whose role the roles file does not have gets no host function. Of each server, a
declaration's ``mcp_tools`` filter keeps only the tools it allows and does not deny: a tool
filtered out is not in the agent's schemas, and a call to it is an unknown tool.

An MCP tool's description (and the descriptions in its schema) are the server's words: they
reach the model neutralised (:func:`agent_router.formats.escape`), and so does its output,
fenced with the tool's and the server's names.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_router import formats
from agent_router.agents.host_tools import HostToolset, default_host_tools, import_host_modules
from agent_router.agents.roles import RoleCatalogue
from agent_router.agents.tool_config import (
    NAMESPACE_SEPARATOR,
    McpServerSpec,
    ToolDeclaration,
    server_from_option,
    servers_from_mapping,
)
from agent_router.agents.tools import (
    DO_WORK,
    Audience,
    Tool,
    ToolContext,
    ToolOrigin,
    ToolRegistry,
    ToolResult,
    default_registry,
    fail,
)
from agent_router.domain import LEAD_ROLE, Agent
from agent_router.errors import ConfigurationError
from agent_router.logfields import get_logger
from agent_router.settings import Settings

if TYPE_CHECKING:
    from agent_router.agents.mcp_client import McpHub

logger = get_logger(__name__)

#: Decides an agent's own declaration (``None``: its role's).
DeclareTools = Callable[[Agent], ToolDeclaration | None]


@dataclass(frozen=True, kw_only=True)
class ToolListing:
    """What a role gets: tool name -> where it comes from; servers that could not be listed
    (server -> why); entries of its tool filters that name no tool of their server (server ->
    the entries)."""

    role: str
    tools: dict[str, str]
    unavailable: dict[str, str]
    unmatched: dict[str, list[str]]

    @property
    def complete(self) -> bool:
        """Every server was listed and every filter entry names a tool."""
        return not self.unavailable and not self.unmatched


@dataclass(frozen=True, kw_only=True)
class _Assembled:
    """The tools of one declaration in this process: the registry, the servers that could not
    be listed and the filter entries that matched nothing."""

    registry: ToolRegistry
    sources: dict[str, str]
    unavailable: dict[str, str]
    unmatched: dict[str, list[str]]


class AgentTools(ToolRegistry):
    """The router's own tools (``builtin``) for everyone, and per agent what it declares.
    ``servers``: every server a declaration may name; ``default_servers``: those of a sub-agent
    role that lists none; ``hub``: the MCP client (default: this process's); ``works``: the
    agents that also get the pretend ``do_work`` tool (those on the scripted model)."""

    roles: RoleCatalogue

    def __init__(
        self,
        builtin: ToolRegistry,
        *,
        roles: RoleCatalogue,
        servers: Mapping[str, McpServerSpec] | None = None,
        default_servers: Iterable[str] = (),
        host: HostToolset = default_host_tools,
        declare: DeclareTools | None = None,
        call_timeout: float = 60.0,
        hub: Callable[[], McpHub] | None = None,
        works: Callable[[Agent], bool] | None = None,
    ) -> None:
        super().__init__(t for t in map(builtin.get, builtin.names()) if t is not None)
        self.works = works
        self._work = ToolRegistry([DO_WORK])
        self.roles = roles
        self.servers = dict(servers or {})
        self.default_servers = tuple(default_servers)
        self.host = host
        self.declare = declare
        self.call_timeout = call_timeout
        self._hub = hub
        self._assembled: dict[ToolDeclaration, _Assembled] = {}
        self._lock = threading.Lock()
        for role in roles.names():
            self.declared(role)  # an unknown server or host function fails here, not in a turn

    def schemas(self, agent: Agent) -> list[dict[str, Any]]:
        schemas = self._assemble(self._declaration(agent)).registry.schemas(agent)
        if self.works is not None and self.works(agent):
            schemas += self._work.schemas(agent)
        return schemas

    def call(self, name: str, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if name == DO_WORK.name and self.works is not None and self.works(ctx.agent):
            return self._work.call(name, arguments, ctx)
        assembled = self._assemble(self._declaration(ctx.agent))
        server, separator, _ = name.partition(NAMESPACE_SEPARATOR)
        if assembled.registry.get(name) is None and separator and server in assembled.unavailable:
            # A tool of a server that could not be listed for this turn (the model saw it in an
            # earlier one): say why it is missing.
            return formats.escape_json(
                fail(
                    f"MCP server {server!r} is unavailable: its tools are missing from this turn",
                    "server_unavailable",
                )
            )
        return assembled.registry.call(name, arguments, ctx)

    def declared(self, role: str, declaration: ToolDeclaration | None = None) -> ToolDeclaration:
        """The declaration with its defaults filled in: the servers and host functions named,
        and the filters of those servers."""
        if declaration is None:
            found = self.roles.get(role)
            # An agent of a role the roles file does not have gets no host function: which ones
            # it should get was never said.
            declaration = found.tools if found is not None else ToolDeclaration(host_tools=())
        lead = role == LEAD_ROLE
        servers = declaration.mcp_servers
        if servers is None:
            servers = () if lead else self.default_servers
        unknown = [s for s in servers if s not in self.servers]
        if unknown:
            known = ", ".join(self.servers) or "none"
            raise ConfigurationError(
                f"role {role!r}: unknown MCP servers {unknown}; known: {known}"
            )
        stray = [s for s, _ in declaration.mcp_tools if s not in servers]
        if stray:
            raise ConfigurationError(
                f"role {role!r}: mcp_tools names servers it does not get: {stray}; it gets: "
                f"{', '.join(servers) or 'none'}"
            )
        host_names = declaration.host_tools
        if host_names is None:
            host_names = () if lead else ("*",)
        if "*" in host_names:
            host_names = tuple(self.host.names())
        self.host.select(host_names)  # unknown names are a configuration error
        for name in host_names:
            if name in self.names():
                raise ConfigurationError(f"host tool {name!r} has the name of a router tool")
        return ToolDeclaration(
            mcp_servers=tuple(servers), host_tools=host_names, mcp_tools=declaration.mcp_tools
        )

    def listing(self, role: str) -> ToolListing:
        """The tools ``role`` gets, fetching MCP tool lists (``agent-router run --list-tools``)."""
        lead = role == LEAD_ROLE
        tools = {
            name: "router"
            for name in self.names()
            if (tool := self.get(name)) is not None
            and tool.audience in (Audience.ALL, Audience.LEAD if lead else Audience.SUB_AGENT)
        }
        assembled = self._assemble(self.declared(role))
        tools.update(assembled.sources)
        return ToolListing(
            role=role,
            tools=tools,
            unavailable=assembled.unavailable,
            unmatched=assembled.unmatched,
        )

    def unlisted(self) -> dict[str, str]:
        """What is missing now of the tools declared for the catalogue's roles and as
        defaults: each server that cannot be listed (server -> why; each is asked once), and
        each tool filter entry that names no tool of its server (a misspelt name grants
        nothing)."""
        declarations = {role: self.declared(role) for role in self.roles.names()}
        servers = dict.fromkeys(self.default_servers)
        for declaration in declarations.values():
            servers.update(dict.fromkeys(declaration.mcp_servers or ()))
        listed: dict[str, list[str]] = {}
        problems: dict[str, str] = {}
        for server in servers:
            try:
                tools = self._mcp_tools(self.servers[server])
            except Exception as exc:
                problems[server] = str(exc)
                continue
            listed[server] = [t.origin.tool for t in tools if t.origin is not None]
        for role, declaration in declarations.items():
            for server, kept in declaration.mcp_tools:
                if server in listed and (missed := kept.unmatched(listed[server])):
                    problems[f"{server} (tool filter of role {role!r})"] = (
                        f"{', '.join(missed)} name no tool of it; it lists "
                        f"{', '.join(listed[server]) or 'none'}"
                    )
        return problems

    def _declaration(self, agent: Agent) -> ToolDeclaration:
        own = self.declare(agent) if self.declare is not None else None
        return self.declared(agent.role, own)

    def _assemble(self, declaration: ToolDeclaration) -> _Assembled:
        with self._lock:
            cached = self._assembled.get(declaration)
        if cached is not None:
            return cached
        registry = ToolRegistry(t for t in map(self.get, self.names()) if t is not None)
        extra, unavailable, unmatched = self._extra_tools(declaration)
        sources: dict[str, str] = {}
        for tool, source in extra:
            try:
                registry.register(tool)
            except ValueError:
                logger.warning(
                    "tool name taken",
                    extra={"action": "tool_skipped", "tool": tool.name, "source": source},
                )
                continue
            sources[tool.name] = source
        assembled = _Assembled(
            registry=registry, sources=sources, unavailable=unavailable, unmatched=unmatched
        )
        if not unavailable:  # keep asking servers that could not be listed
            with self._lock:
                self._assembled[declaration] = assembled
        return assembled

    def _extra_tools(
        self, declaration: ToolDeclaration
    ) -> tuple[list[tuple[Tool, str]], dict[str, str], dict[str, list[str]]]:
        tools = [(t, "host") for t in self.host.select(declaration.host_tools)]
        unavailable: dict[str, str] = {}
        unmatched: dict[str, list[str]] = {}
        for name in declaration.mcp_servers or ():
            try:
                listed = self._mcp_tools(self.servers[name])
            except Exception as exc:  # a server down: its tools are missing, the turn goes on
                logger.warning(
                    "MCP server %s not listed: %s",
                    name,
                    exc,
                    extra={"action": "mcp_list_failed", "server": name, "error": str(exc)},
                )
                unavailable[name] = str(exc)
                continue
            kept = declaration.tool_filter(name)
            names = [t.origin.tool for t in listed if t.origin is not None]
            if missed := kept.unmatched(names):
                logger.warning(
                    "MCP tool filter names no tool of %s: %s",
                    name,
                    missed,
                    extra={"action": "mcp_filter_unmatched", "server": name, "entries": missed},
                )
                unmatched[name] = missed
            tools.extend(
                (t, f"mcp:{name}")
                for t in listed
                if t.origin is not None and kept.admits(t.origin.tool)
            )
        return tools, unavailable, unmatched

    def _mcp_tools(self, spec: McpServerSpec) -> list[Tool]:
        hub = self._hub() if self._hub is not None else _default_hub()
        timeout = spec.call_timeout_seconds or self.call_timeout
        return [
            Tool(
                name=remote.exposed_name,
                description=formats.escape(
                    f"(MCP server {spec.name}) {remote.description}".strip()
                ),
                parameters=_neutral_descriptions(remote.input_schema),
                function=_mcp_call(hub, spec, remote.name, timeout),
                origin=ToolOrigin(server=spec.name, tool=remote.name),
            )
            for remote in hub.tools(spec)
        ]


def _neutral_descriptions(schema: Any) -> Any:
    """``schema`` with its ``description`` and ``title`` texts neutralised (the server's
    words, which the model reads); names and values stay as the server gave them."""
    if isinstance(schema, list):
        return [_neutral_descriptions(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        key: formats.escape(value)
        if key in ("description", "title") and isinstance(value, str)
        else _neutral_descriptions(value)
        for key, value in schema.items()
    }


def _mcp_call(
    hub: McpHub, spec: McpServerSpec, name: str, timeout: float
) -> Callable[[dict[str, Any], ToolContext], ToolResult]:
    def call(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return hub.call(spec, name, arguments, timeout)

    return call


def _default_hub(connect_timeout: float = 20.0) -> McpHub:
    try:
        from agent_router.agents.mcp_client import process_hub
    except ImportError as exc:
        raise ConfigurationError(
            f"MCP servers need the mcp package: pip install 'agent-router[mcp]' ({exc})"
        ) from exc
    return process_hub(connect_timeout)


def agent_tools(
    settings: Settings,
    roles: RoleCatalogue,
    *,
    builtin: ToolRegistry | None = None,
    server_options: Iterable[str] = (),
    host: HostToolset = default_host_tools,
    declare: DeclareTools | None = None,
    works: Callable[[Agent], bool] | None = None,
) -> AgentTools:
    """The tools of ``agent-router run`` and of its workers: the router's own, the roles file's
    servers, ``settings.mcp_servers`` and ``server_options`` (``NAME=COMMAND_OR_URL``) as the
    default servers, and the functions of the ``settings.host_tools`` modules."""
    import_host_modules(settings.host_tools)
    defaults = servers_from_mapping(settings.mcp_servers, source="AGENT_ROUTER_MCP_SERVERS")
    for option in server_options:
        spec = server_from_option(option)
        defaults[spec.name] = spec

    return AgentTools(
        builtin or default_registry(roles),
        roles=roles,
        servers={**roles.mcp_servers, **defaults},
        default_servers=defaults,
        host=host,
        declare=declare,
        call_timeout=settings.mcp_call_timeout_seconds,
        hub=lambda: _default_hub(settings.mcp_connect_timeout_seconds),
        works=works,
    )
