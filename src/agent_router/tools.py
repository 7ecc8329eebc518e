"""The tools an agent's model can call: a name, a JSON schema, and a function.

Small on purpose: the registry maps names to :class:`Tool` values; the loop asks it for the
schemas an agent may see and calls a tool by name. The multi-agent tools (DESIGN section 5) are
registered here by a later issue; for now there is one harmless work tool.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_router.domain import Agent
from agent_router.model import WORK_TOOL
from agent_router.settings import Settings

if TYPE_CHECKING:
    from agent_router.router import Router
    from agent_router.turn import Turn

logger = logging.getLogger(__name__)


class Audience(enum.StrEnum):
    """Which agents see a tool."""

    ALL = "all"
    LEAD = "lead"
    SUB_AGENT = "sub_agent"


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a tool may use: the claimed turn (fenced writes) and the router."""

    router: Router
    turn: Turn
    agent: Agent
    settings: Settings


ToolFunction = Callable[[dict[str, Any], ToolContext], str]


@dataclass(frozen=True, kw_only=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    function: ToolFunction
    audience: Audience = Audience.ALL

    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def visible_to(self, agent: Agent) -> bool:
        if self.audience is Audience.ALL:
            return True
        return (self.audience is Audience.LEAD) == agent.is_lead


class ToolError(Exception):
    """Raised by a tool for a bad call; its text becomes the tool result the model sees."""


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> Tool:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        return tool

    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self, agent: Agent) -> list[dict[str, Any]]:
        return [t.schema() for t in self._tools.values() if t.visible_to(agent)]

    def call(self, name: str, arguments: dict[str, Any], ctx: ToolContext) -> str:
        """Run a tool. A bad call (unknown tool, wrong arguments) is answered in the result, as
        a model expects; anything else the tool raises propagates and fails the turn."""
        tool = self._tools.get(name)
        if tool is None or not tool.visible_to(ctx.agent):
            return f"error: no tool named {name!r}"
        try:
            return tool.function(arguments, ctx)
        except ToolError as exc:
            return f"error: {exc}"


def _do_work(arguments: dict[str, Any], ctx: ToolContext) -> str:
    step = arguments.get("step")
    if not isinstance(step, str) or not step.strip():
        raise ToolError("`step` must be a non-empty string")
    # Takes a little while so that the agent is visibly `running` while others message it.
    time.sleep(ctx.settings.work_seconds)
    return f"done: {step}"


DO_WORK = Tool(
    name=WORK_TOOL,
    description="Carry out one step of the current task and report when it is done.",
    parameters={
        "type": "object",
        "properties": {"step": {"type": "string", "description": "What this step does."}},
        "required": ["step"],
        "additionalProperties": False,
    },
    function=_do_work,
    audience=Audience.SUB_AGENT,
)


def default_registry() -> ToolRegistry:
    """A fresh registry with the built-in tools."""
    return ToolRegistry([DO_WORK])
