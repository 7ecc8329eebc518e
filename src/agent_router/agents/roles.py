"""The roles a lead can staff its team with: name, description, system prompt, model settings.

A catalogue is a TOML file (stdlib :mod:`tomllib`) with one ``[[roles]]`` table per role::

    [[roles]]
    name = "Full-Stack Engineer"
    description = "Designs, implements and tests changes across API and UI."
    system_prompt = "You are ..."
    model = "gpt-4o-mini"      # optional: overrides the default model for this role
    temperature = 0.2          # optional
    context_window = 32000     # optional: tokens the role's model reads (else the settings')
    context_target_tokens = 16000  # optional: tokens its requests are kept near (else settings')
    mcp_servers = ["time"]     # optional: the MCP servers this role gets (docs/tools.md)
    mcp_tools = { time = ["get_current_time"] }  # optional: only these tools of a server
    host_tools = ["*"]         # optional: host functions by name, "*" for all

    [mcp_servers.time]         # optional: MCP servers roles may list (docs/tools.md)
    command = ["mcp-server-time", "--local-timezone", "UTC"]

Two catalogues ship with the package. ``roles.toml``, the default: a lead and general-purpose
roles for a chat product (Researcher, Writer, Assistant); a product with roles of its own names
its file in ``AGENT_ROUTER_ROLES_FILE``. ``demo_roles.toml``: the demo's software team (UI
Operator, Full-Stack Engineer), which ``agent-router demo`` uses and
``AGENT_ROUTER_ROLES_FILE=demo`` names. A sub-agent's system prompt
is snapshotted into its transcript when it is created: editing the catalogue later changes new
agents only.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from agent_router.agents.tool_config import McpServerSpec, ToolDeclaration, servers_from_mapping
from agent_router.domain import LEAD_ROLE
from agent_router.errors import ConfigurationError, UnknownRoleError

#: The catalogue that ships with the package, used when no roles file is given.
DEFAULT_ROLES_RESOURCE = "roles.toml"
#: The demo's software team, shipped beside it.
DEMO_ROLES_RESOURCE = "demo_roles.toml"
#: What ``AGENT_ROUTER_ROLES_FILE`` (or ``--roles``) says for the demo's team.
DEMO_ROLES = "demo"


@dataclass(frozen=True, kw_only=True)
class Role:
    name: str
    description: str
    system_prompt: str
    model: str | None = None  # None: the runner's default model
    temperature: float | None = None
    tools: ToolDeclaration = field(default_factory=ToolDeclaration)  # beside the router's own tools
    runner: str | None = None  # the host's Celery task for this role's turns; None: built-in loop
    context_window: int | None = None  # None: the model's row of the price table, or settings
    context_target_tokens: int | None = None  # None: the settings' context_target_tokens
    talks_to_user: bool = False  # a sub-agent of the role may tell the user things (tell_user)

    def __post_init__(self) -> None:
        if not self.name.strip() or any(c in self.name for c in '"\n\r<>'):
            raise ConfigurationError(f"invalid role name {self.name!r}")
        if not self.system_prompt.strip():
            raise ConfigurationError(f"role {self.name!r} has an empty system prompt")
        if self.temperature is not None and not 0 <= self.temperature <= 2:
            raise ConfigurationError(f"role {self.name!r}: temperature must be in [0, 2]")
        if self.context_window is not None and self.context_window <= 0:
            raise ConfigurationError(f"role {self.name!r}: context_window must be positive")
        if self.context_target_tokens is not None and self.context_target_tokens <= 0:
            raise ConfigurationError(f"role {self.name!r}: context_target_tokens must be positive")


class RoleCatalogue:
    """Roles by name. The lead's role (``Team Leader``) may be listed; it is never a sub-agent
    role."""

    def __init__(
        self, roles: list[Role], mcp_servers: dict[str, McpServerSpec] | None = None
    ) -> None:
        self.mcp_servers = dict(mcp_servers or {})
        self._roles: dict[str, Role] = {}
        for role in roles:
            if role.name in self._roles:
                raise ConfigurationError(f"role {role.name!r} is listed twice")
            self._roles[role.name] = role

    @classmethod
    def from_toml(cls, text: str, *, source: str = "<string>") -> RoleCatalogue:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigurationError(f"{source}: not valid TOML: {exc}") from exc
        entries = data.get("roles")
        if not isinstance(entries, list) or not entries:
            raise ConfigurationError(f"{source}: expected one or more [[roles]] tables")
        servers = servers_from_mapping(data.get("mcp_servers", {}), source=source)
        return cls([_role(entry, source) for entry in entries], servers)

    @classmethod
    def load(cls, path: str | Path) -> RoleCatalogue:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"cannot read roles file {path}: {exc}") from exc
        return cls.from_toml(text, source=str(path))

    @classmethod
    def default(cls) -> RoleCatalogue:
        """The roles shipped with the package for a chat product (``roles.toml``)."""
        return cls._shipped(DEFAULT_ROLES_RESOURCE)

    @classmethod
    def demo(cls) -> RoleCatalogue:
        """The demo's software team, shipped with the package (``demo_roles.toml``)."""
        return cls._shipped(DEMO_ROLES_RESOURCE)

    @classmethod
    def _shipped(cls, resource: str) -> RoleCatalogue:
        text = resources.files("agent_router.agents").joinpath(resource).read_text("utf-8")
        return cls.from_toml(text, source=resource)

    @classmethod
    def from_file_or_default(cls, path: str | Path | None) -> RoleCatalogue:
        """The roles file at ``path``; :data:`DEMO_ROLES` names the demo's team; none: the
        default catalogue."""
        if not path:
            return cls.default()
        return cls.demo() if str(path) == DEMO_ROLES else cls.load(path)

    def get(self, name: str) -> Role | None:
        return self._roles.get(name)

    def sub_agent_role(self, name: str) -> Role:
        """The sub-agent role ``name``; raises :class:`UnknownRoleError` naming the roles there
        are when the catalogue has no such role (or ``name`` is the lead's)."""
        role = self._roles.get(name)
        if role is None or name == LEAD_ROLE:
            known = [r.name for r in self.sub_agent_roles()]
            raise UnknownRoleError(
                f"unknown role {name!r}; roles: {', '.join(known) or 'none'} (a role of your "
                f"own goes in the roles file {ROLES_FILE_ENV} names)",
                roles=known,
            )
        return role

    @property
    def lead(self) -> Role | None:
        return self._roles.get(LEAD_ROLE)

    def sub_agent_roles(self) -> list[Role]:
        return [r for r in self._roles.values() if r.name != LEAD_ROLE]

    def names(self) -> list[str]:
        return list(self._roles)

    def __len__(self) -> int:
        return len(self._roles)


def _role(entry: Any, source: str) -> Role:
    if not isinstance(entry, dict):
        raise ConfigurationError(f"{source}: each [[roles]] entry must be a table")
    unknown = set(entry) - {
        *("name", "description", "system_prompt", "model", "temperature", "runner"),
        *("mcp_servers", "mcp_tools", "host_tools", "context_window", "context_target_tokens"),
        "talks_to_user",
    }
    if unknown:
        raise ConfigurationError(f"{source}: unknown role keys {sorted(unknown)}")
    try:
        name, prompt = entry["name"], entry["system_prompt"]
    except KeyError as exc:
        raise ConfigurationError(f"{source}: a role needs {exc.args[0]!r}") from exc
    description = entry.get("description", "")
    model = entry.get("model")
    temperature = entry.get("temperature")
    if not all(isinstance(v, str) for v in (name, prompt, description)) or (
        model is not None and not isinstance(model, str)
    ):
        raise ConfigurationError(f"{source}: role {name!r}: name, texts and model are strings")
    if temperature is not None and not isinstance(temperature, int | float):
        raise ConfigurationError(f"{source}: role {name!r}: temperature must be a number")
    runner = entry.get("runner")
    if runner is not None and not isinstance(runner, str):
        raise ConfigurationError(f"{source}: role {name!r}: runner must be a task name")
    window = entry.get("context_window")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool)):
        raise ConfigurationError(f"{source}: role {name!r}: context_window must be an integer")
    target = entry.get("context_target_tokens")
    if target is not None and (not isinstance(target, int) or isinstance(target, bool)):
        raise ConfigurationError(
            f"{source}: role {name!r}: context_target_tokens must be an integer"
        )
    talks = entry.get("talks_to_user", False)
    if not isinstance(talks, bool):
        raise ConfigurationError(f"{source}: role {name!r}: talks_to_user must be true or false")
    return Role(
        name=name.strip(),
        description=description.strip(),
        system_prompt=prompt.strip(),
        model=model,
        temperature=float(temperature) if temperature is not None else None,
        tools=ToolDeclaration.from_table(entry, source=f"{source}: role {name!r}"),
        runner=runner,
        context_window=window,
        context_target_tokens=target,
        talks_to_user=talks,
    )


#: The variable naming a roles file for worker processes (the CLI's ``--roles`` sets it too).
ROLES_FILE_ENV = "AGENT_ROUTER_ROLES_FILE"


def roles_from_env() -> RoleCatalogue:
    """The roles file ``AGENT_ROUTER_ROLES_FILE`` names (``demo``: the demo's team), or the
    default catalogue."""
    return RoleCatalogue.from_file_or_default(os.environ.get(ROLES_FILE_ENV))
