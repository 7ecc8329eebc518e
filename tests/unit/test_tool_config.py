"""Declaring tools: MCP servers in the roles file, the environment and options; what each role
gets by default; names that never collide; bad declarations refused with one typed error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_router import Agent, Router, Settings
from agent_router.agents.host_tools import HostToolset
from agent_router.agents.mcp_client import namespaced, result_text
from agent_router.agents.roles import RoleCatalogue
from agent_router.agents.tool_config import (
    McpServerSpec,
    ToolDeclaration,
    ToolFilter,
    server_from_option,
    servers_from_mapping,
)
from agent_router.agents.toolbox import agent_tools
from agent_router.errors import ConfigurationError
from agent_router.outbox import RecordingPublisher

ROLES = """
[mcp_servers.time]
command = "mcp-server-time --local-timezone UTC"

[mcp_servers.notes]
url = "http://127.0.0.1:8000/mcp"
headers = { Authorization = "Bearer ${NOTES_TOKEN}" }
call_timeout_seconds = 5

[[roles]]
name = "Team Leader"
system_prompt = "Lead."

[[roles]]
name = "Clock Reader"
system_prompt = "Read clocks."
mcp_servers = ["time"]
host_tools = []

[[roles]]
name = "Writer"
system_prompt = "Write."
"""


def test_the_roles_file_declares_servers_and_per_role_lists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    roles = RoleCatalogue.from_toml(ROLES)
    time, notes = roles.mcp_servers["time"], roles.mcp_servers["notes"]
    assert time.command == ("mcp-server-time", "--local-timezone", "UTC")
    assert time.transport == "stdio"
    assert notes.transport == "streamable-http" and notes.call_timeout_seconds == 5
    monkeypatch.setenv("NOTES_TOKEN", "s3cret")
    assert notes.resolved_headers() == {"Authorization": "Bearer s3cret"}
    clock, writer = roles.get("Clock Reader"), roles.get("Writer")
    assert clock is not None and writer is not None
    assert clock.tools == ToolDeclaration(mcp_servers=("time",), host_tools=())
    assert writer.tools == ToolDeclaration()  # the defaults


def test_defaults_servers_from_settings_and_options_and_host_functions() -> None:
    host = HostToolset()

    @host.tool
    def shout(text: str) -> str:
        """Upper-cases a text."""
        return text.upper()

    settings = Settings(mcp_servers={"search": "http://127.0.0.1:9/mcp"})
    tools = agent_tools(
        settings, RoleCatalogue.from_toml(ROLES), server_options=["files=files-server /srv"],
        host=host,
    )  # fmt: skip
    # Sub-agent roles without a list get every server given outside the file and every host
    # function; the lead gets neither; a list is taken as it is.
    assert tools.declared("Writer") == ToolDeclaration(
        mcp_servers=("search", "files"), host_tools=("shout",)
    )
    assert tools.declared("Team Leader") == ToolDeclaration(mcp_servers=(), host_tools=())
    assert tools.declared("Clock Reader") == ToolDeclaration(mcp_servers=("time",), host_tools=())
    assert tools.servers["files"].command == ("files-server", "/srv")
    # Servers that cannot be reached are reported, not fatal.
    listing = tools.listing("Writer")
    assert listing.tools["ask_master"] == "router" and "create_sub_agent" not in listing.tools
    assert listing.tools["shout"] == "host"
    assert set(listing.unavailable) == {"search", "files"}


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        ('mcp_servers = ["nope"]', "unknown MCP servers ['nope']"),
        ('host_tools = ["nope"]', "unknown host tools ['nope']"),
        ('host_tools = ["ask_master"]', "name of a router tool"),
        ("mcp_servers = 3", "must be a list of names"),
        ('mcp_servers = []\nmcp_tools = { time = ["now"] }', "servers it does not get: ['time']"),
        ("mcp_tools = 3", "mcp_tools must be a table"),
        ("mcp_tools = { time = 3 }", "a list of tool names or a table"),
        ("mcp_tools = { time = { allow = 3 } }", "must be lists of tool names"),
        ('mcp_tools = { time = { only = ["x"] } }', "a list of tool names or a table"),
    ],
)
def test_bad_role_declarations_are_refused(roles: str, message: str) -> None:
    host = HostToolset()

    @host.tool(name="ask_master")
    def clash() -> str:
        return ""

    text = f'[[roles]]\nname = "R"\nsystem_prompt = "p"\n{roles}\n'
    with pytest.raises(ConfigurationError, match=message.replace("[", r"\[")):
        agent_tools(
            Settings(mcp_servers={"time": "mcp-server-time"}), RoleCatalogue.from_toml(text),
            host=host,
        )  # fmt: skip


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({}, "exactly one of command, url"),
        ({"command": "x", "url": "http://h/mcp"}, "exactly one of command, url"),
        ({"url": "ftp://h"}, "url must be http"),
        ({"command": "x", "headers": {"A": "b"}}, "headers need a url"),
        ({"command": ["x", 1]}, "must be strings"),
        ({"command": "x", "oops": 1}, "unknown keys"),
        ({"url": "http://h/mcp", "call_timeout_seconds": 0}, "must be > 0"),
    ],
)
def test_bad_server_declarations_are_refused(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        servers_from_mapping({"s": table}, source="test")


def test_no_server_takes_the_name_host_functions_are_fenced_with() -> None:
    with pytest.raises(ConfigurationError, match="'host' is reserved"):
        McpServerSpec(name="host", url="http://h/mcp")


def test_a_filter_allows_then_denies_by_name_or_pattern() -> None:
    roles = RoleCatalogue.from_toml(
        ROLES + 'mcp_tools = { notes = { allow = ["read_*", "list"], deny = ["read_secret"] } }\n'
    )
    writer = roles.get("Writer")
    assert writer is not None
    kept = writer.tools.tool_filter("notes")
    assert kept == ToolFilter(allow=("read_*", "list"), deny=("read_secret",))
    tools = ["read_note", "read_secret", "list", "write_note", "delete"]
    assert [t for t in tools if kept.admits(t)] == ["read_note", "list"]
    assert kept.unmatched(tools) == [] and kept.unmatched(["list"]) == ["read_*", "read_secret"]
    # A list is an allow-list; a server without a filter gives every tool.
    assert ToolFilter.from_value(["a"], source="t") == ToolFilter(allow=("a",))
    assert writer.tools.tool_filter("time").admits("anything")


def test_an_agent_of_a_role_missing_from_the_roles_file_gets_no_host_function() -> None:
    host = HostToolset()

    @host.tool
    def shout(text: str) -> str:
        """Upper-cases a text."""
        return text.upper()

    settings = Settings(mcp_servers={"search": "http://127.0.0.1:9/mcp"})
    tools = agent_tools(settings, RoleCatalogue.from_toml(ROLES), host=host)
    # A listed role without a host_tools list gets them all; a role nobody listed, none (the
    # default servers, given for every sub-agent role that lists none, it still gets).
    assert tools.declared("Writer").host_tools == ("shout",)
    assert tools.declared("Stranger") == ToolDeclaration(mcp_servers=("search",), host_tools=())


@pytest.mark.parametrize("name", ["", "a b", "a__b", "x" * 25, "a.b"])
def test_server_names_stay_usable_in_tool_names(name: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid MCP server name"):
        McpServerSpec(name=name, url="http://h/mcp")


def test_options_name_a_command_line_or_a_url() -> None:
    assert server_from_option("n=http://h:1/mcp").url == "http://h:1/mcp"
    assert server_from_option("t = python -m mcp_server_time").command == (
        "python", "-m", "mcp_server_time",
    )  # fmt: skip
    for bad in ("no-equals", "x=", "x='unclosed"):
        with pytest.raises(ConfigurationError):
            server_from_option(bad)


def test_the_environment_variable_holds_json(monkeypatch: pytest.MonkeyPatch) -> None:
    servers = {"time": "mcp-server-time", "notes": {"url": "http://h/mcp"}}
    monkeypatch.setenv("AGENT_ROUTER_MCP_SERVERS", json.dumps(servers))
    parsed = servers_from_mapping(Settings().mcp_servers, source="env")
    assert parsed["time"].command == ("mcp-server-time",) and parsed["notes"].url == "http://h/mcp"


def test_tool_names_are_namespaced_and_never_collide() -> None:
    names = namespaced("docs", ["search", "search.v2", "search_v2", "x" * 80, "y" * 80])
    assert list(names.values()) == ["search", "search.v2", "search_v2", "x" * 80, "y" * 80]
    exposed = list(names)
    assert exposed[:2] == ["docs__search", "docs__search_v2"]
    assert len(set(exposed)) == 5
    assert all(len(n) <= 64 and n.startswith("docs__") for n in exposed)
    assert all(set(n) <= set("abcdefghijklmnopqrstuvwxyz_0123456789-") for n in exposed)
    # Two servers with a tool of the same name: two names.
    assert set(namespaced("a", ["get"])).isdisjoint(namespaced("b", ["get"]))


def test_a_roles_file_in_a_directory_loads(tmp_path: Path) -> None:
    path = tmp_path / "roles.toml"
    path.write_text(ROLES, encoding="utf-8")
    assert set(RoleCatalogue.load(path).mcp_servers) == {"time", "notes"}


def test_results_map_text_structured_content_and_errors() -> None:
    from mcp import types

    text = types.CallToolResult(content=[types.TextContent(type="text", text="hello")])
    assert result_text(text) == "hello"
    structured = types.CallToolResult(content=[], structured_content={"n": 1})
    assert json.loads(result_text(structured)) == {"n": 1}
    error = types.CallToolResult(
        content=[types.TextContent(type="text", text="disk full")], is_error=True
    )
    assert json.loads(result_text(error)) == {
        "ok": False, "error": "disk full", "reason": "tool_error",
    }  # fmt: skip


def test_an_agent_can_differ_from_its_role(tmp_path: Path) -> None:
    host = HostToolset()

    @host.tool
    def secret() -> str:
        """Only for the auditor."""
        return "s"

    def declare(agent: Agent) -> ToolDeclaration | None:
        if agent.display_name == "Auditor":
            return ToolDeclaration(host_tools=("secret",))
        return ToolDeclaration(host_tools=())

    roles = RoleCatalogue.from_toml('[[roles]]\nname = "Writer"\nsystem_prompt = "p"\n')
    tools = agent_tools(Settings(), roles, host=host, declare=declare)
    router = Router(Settings(database_url=f"sqlite:///{tmp_path / 'r.db'}"),
                    publisher=RecordingPublisher())  # fmt: skip
    router.create_schema()
    try:
        team = router.create_team()
        auditor = router.create_agent(team.id, role="Writer", display_name="Auditor")
        writer = router.create_agent(team.id, role="Writer")
        names = {a.display_name: {s["function"]["name"] for s in tools.schemas(a)}
                 for a in (auditor, writer)}  # fmt: skip
    finally:
        router.close()
    assert "secret" in names["Auditor"] and "secret" not in names["Writer_1"]
    assert "ask_master" in names["Auditor"] and "ask_master" in names["Writer_1"]


@pytest.mark.parametrize("name", ["", "a.b", "with space", "x" * 65])
def test_host_tool_names_are_ones_models_accept(name: str) -> None:
    host = HostToolset()
    with pytest.raises(ConfigurationError, match="invalid host tool name"):
        host.tool(name=name)(lambda: "")
    assert host.names() == []


def test_a_host_tool_name_is_registered_once() -> None:
    host = HostToolset()
    host.tool(name="once")(lambda: "")
    with pytest.raises(ConfigurationError, match="already registered"):
        host.tool(name="once")(lambda: "")


def test_an_agents_own_declaration_filters_a_servers_tools_too() -> None:
    roles = RoleCatalogue.from_toml(ROLES)
    own = ToolDeclaration(
        mcp_servers=("notes",), host_tools=(), mcp_tools=(("notes", ToolFilter(deny=("delete",))),)
    )
    tools = agent_tools(Settings(), roles, declare=lambda agent: own)
    assert tools.declared("Writer", own) == own
    assert not tools.declared("Writer", own).tool_filter("notes").admits("delete")
