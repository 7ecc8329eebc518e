"""Where an agent's tools come from, as configuration: MCP servers and what a role declares.

An MCP server is a command line (spoken to over stdio, one process per worker process) or a URL
(streamable HTTP, with headers). Servers are declared by name in the roles file
(``[mcp_servers.NAME]`` tables), in ``AGENT_ROUTER_MCP_SERVERS`` (a JSON object of the same
tables) or with ``agent-router run --mcp-server NAME=COMMAND_OR_URL``. A role lists the servers
and host functions it gets; without a list it gets the defaults (every server and host function
given outside the roles file, for sub-agents; none for the lead). Of a server it gets, a role
may take only some tools: an allow-list and a deny-list of the server's tool names
(``mcp_tools``, :class:`ToolFilter`).

Nothing here imports the MCP SDK: a deployment without servers does not need it.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_router.errors import ConfigurationError
from agent_router.formats import HOST_SERVER

#: What a server name may be: it prefixes its tools' names, which models require to match
#: ``[A-Za-z0-9_-]{1,64}``.
SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,23}$")

#: Joins a server's name and its tool's name into the name the model sees: ``time__now``.
NAMESPACE_SEPARATOR = "__"

_SERVER_KEYS = {"command", "url", "headers", "env", "cwd", "call_timeout_seconds"}


@dataclass(frozen=True, kw_only=True)
class McpServerSpec:
    """One MCP server: exactly one of ``command`` (stdio) and ``url`` (streamable HTTP).

    ``headers`` and ``env`` values may name environment variables of the worker (``${TOKEN}``),
    so that a roles file holds no secret. ``call_timeout_seconds`` overrides the
    ``mcp_call_timeout_seconds`` setting for this server."""

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    call_timeout_seconds: float | None = None

    def __post_init__(self) -> None:
        if not SERVER_NAME.match(self.name) or NAMESPACE_SEPARATOR in self.name:
            raise ConfigurationError(
                f"invalid MCP server name {self.name!r}: letters, digits, '-' and single '_', "
                "at most 24 characters"
            )
        if self.name == HOST_SERVER:
            raise ConfigurationError(
                f"MCP server name {HOST_SERVER!r} is reserved: host functions' output is "
                "fenced with it"
            )
        if bool(self.command) == bool(self.url):
            raise ConfigurationError(f"MCP server {self.name!r}: give exactly one of command, url")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ConfigurationError(f"MCP server {self.name!r}: url must be http(s)://...")
        if self.headers and self.url is None:
            raise ConfigurationError(f"MCP server {self.name!r}: headers need a url")
        if self.call_timeout_seconds is not None and self.call_timeout_seconds <= 0:
            raise ConfigurationError(f"MCP server {self.name!r}: call_timeout_seconds must be > 0")

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "streamable-http"

    def resolved_headers(self) -> dict[str, str]:
        return {k: os.path.expandvars(v) for k, v in self.headers.items()}

    def resolved_env(self) -> dict[str, str]:
        return {k: os.path.expandvars(v) for k, v in self.env.items()}

    def describe(self) -> str:
        return shlex.join(self.command) if self.command else str(self.url)


def server_from_table(name: str, table: Any, *, source: str) -> McpServerSpec:
    """A server from a ``[mcp_servers.NAME]`` table (or its JSON equivalent). ``command`` is a
    list of arguments or one string split like a shell would."""
    if isinstance(table, str):
        return server_from_text(name, table)
    if not isinstance(table, dict):
        raise ConfigurationError(f"{source}: MCP server {name!r} must be a table")
    unknown = set(table) - _SERVER_KEYS
    if unknown:
        raise ConfigurationError(f"{source}: MCP server {name!r}: unknown keys {sorted(unknown)}")
    command = table.get("command", ())
    if isinstance(command, str):
        command = shlex.split(command)
    url, cwd, timeout = table.get("url"), table.get("cwd"), table.get("call_timeout_seconds")
    if not _strings(command) or not _str_map(table.get("headers", {})):
        raise ConfigurationError(f"{source}: MCP server {name!r}: command/headers must be strings")
    if not _str_map(table.get("env", {})) or not all(
        v is None or isinstance(v, str) for v in (url, cwd)
    ):
        raise ConfigurationError(f"{source}: MCP server {name!r}: url, cwd, env must be strings")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
        raise ConfigurationError(f"{source}: MCP server {name!r}: timeout must be a number")
    return McpServerSpec(
        name=name,
        command=tuple(command),
        url=url,
        headers=dict(table.get("headers", {})),
        env=dict(table.get("env", {})),
        cwd=cwd,
        call_timeout_seconds=float(timeout) if timeout is not None else None,
    )


def server_from_text(name: str, text: str) -> McpServerSpec:
    """A server from one string: a URL (streamable HTTP) or a command line (stdio)."""
    text = text.strip()
    if text.startswith(("http://", "https://")):
        return McpServerSpec(name=name, url=text)
    try:
        command = tuple(shlex.split(text))
    except ValueError as exc:
        raise ConfigurationError(f"MCP server {name!r}: bad command line: {exc}") from None
    return McpServerSpec(name=name, command=command)


def server_from_option(value: str) -> McpServerSpec:
    """``NAME=COMMAND_OR_URL``, as ``--mcp-server`` takes it."""
    name, sep, rest = value.partition("=")
    if not sep or not rest.strip():
        raise ConfigurationError(f"expected NAME=COMMAND_OR_URL, got {value!r}")
    return server_from_text(name.strip(), rest)


def servers_from_mapping(data: Any, *, source: str) -> dict[str, McpServerSpec]:
    if not isinstance(data, dict):
        raise ConfigurationError(f"{source}: MCP servers must be a table of named servers")
    return {
        str(name): server_from_table(str(name), table, source=source)
        for name, table in data.items()
    }


@dataclass(frozen=True, kw_only=True)
class ToolFilter:
    """Which tools of one MCP server an agent gets, by the server's own tool names: those
    ``allow`` matches (``None``: all), less those ``deny`` matches. Entries are names or
    shell-style patterns (``git_diff*``)."""

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()

    def admits(self, tool: str) -> bool:
        def matches(patterns: tuple[str, ...]) -> bool:
            return any(fnmatch.fnmatchcase(tool, p) for p in patterns)

        return (self.allow is None or matches(self.allow)) and not matches(self.deny)

    def unmatched(self, tools: list[str]) -> list[str]:
        """The entries that name none of ``tools`` (a misspelt name grants or denies nothing)."""
        entries = (*(self.allow or ()), *self.deny)
        return [p for p in entries if not any(fnmatch.fnmatchcase(t, p) for t in tools)]

    @classmethod
    def from_value(cls, value: Any, *, source: str) -> ToolFilter:
        """A list (the allow-list) or a table with ``allow`` and/or ``deny`` lists."""
        if _strings(value):
            return cls(allow=tuple(value))
        if not isinstance(value, dict) or not value or set(value) - {"allow", "deny"}:
            raise ConfigurationError(
                f"{source}: expected a list of tool names or a table with allow and/or deny"
            )
        allow, deny = value.get("allow"), value.get("deny", [])
        if (allow is not None and not _strings(allow)) or not _strings(deny):
            raise ConfigurationError(f"{source}: allow and deny must be lists of tool names")
        return cls(allow=tuple(allow) if allow is not None else None, deny=tuple(deny))


#: The filter of a server a declaration says nothing about: every tool.
EVERY_TOOL = ToolFilter()


@dataclass(frozen=True, kw_only=True)
class ToolDeclaration:
    """The tools a role (or one agent) gets beside the router's own: MCP servers by name and
    host functions by name (``"*"``: all of them). ``None``: the defaults. ``mcp_tools``: per
    server (by name), which of its tools (a server without a filter gives all of them)."""

    mcp_servers: tuple[str, ...] | None = None
    host_tools: tuple[str, ...] | None = None
    mcp_tools: tuple[tuple[str, ToolFilter], ...] = ()

    def tool_filter(self, server: str) -> ToolFilter:
        return dict(self.mcp_tools).get(server, EVERY_TOOL)

    @classmethod
    def from_table(cls, entry: Mapping[str, Any], *, source: str) -> ToolDeclaration:
        lists: dict[str, tuple[str, ...] | None] = {}
        for key in ("mcp_servers", "host_tools"):
            value = entry.get(key)
            if value is not None and not _strings(value):
                raise ConfigurationError(f"{source}: {key} must be a list of names")
            lists[key] = tuple(value) if value is not None else None
        filters = entry.get("mcp_tools", {})
        if not isinstance(filters, dict):
            raise ConfigurationError(f"{source}: mcp_tools must be a table of servers")
        return cls(
            mcp_servers=lists["mcp_servers"],
            host_tools=lists["host_tools"],
            mcp_tools=tuple(
                sorted(
                    (str(server), ToolFilter.from_value(value, source=f"{source}: {server}"))
                    for server, value in filters.items()
                )
            ),
        )


def _strings(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)


def _str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )
