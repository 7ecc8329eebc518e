"""What every tool is made of: the context a call runs in, the ``Tool`` value, the JSON
result forms (``ok`` / ``fail``) and the registry that maps names to tools."""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from agent_router import errors
from agent_router.agents import lookup
from agent_router.agents.roles import RoleCatalogue
from agent_router.domain import (
    Agent,
)
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
    """What a tool may use: the claimed turn (fenced writes), the router, and the id of the
    tool call being run (blocking tools tie their wait to it)."""

    router: Router
    turn: Turn
    agent: Agent
    settings: Settings
    call_id: str = ""
    # Where the assistant message holding the call sits in the transcript: model servers reuse
    # call ids (``call_0``) across replies, so a call is named by both.
    reply_index: int = 0


class _Recorded:
    """The router already wrote this call's result into the transcript."""

    def __repr__(self) -> str:
        return "RESULT_RECORDED"


#: Returned by a tool whose result the router wrote itself (a resolved wait).
RESULT_RECORDED: Final = _Recorded()

ToolResult = str | _Recorded
ToolFunction = Callable[[dict[str, Any], ToolContext], ToolResult]


class TurnSuspended(Exception):  # noqa: N818 - a signal to the loop, not a failure
    """Raised by a blocking tool when its turn suspended: the loop must return without ending
    the turn (the answer will schedule a continuation)."""


class ToolError(Exception):
    """Raised by a tool for a bad call; it becomes an ``{"ok": false}`` result the model sees."""

    def __init__(self, message: str, *, reason: str = "bad_arguments") -> None:
        super().__init__(message)
        self.reason = reason


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


def ok(**fields: Any) -> str:
    return json.dumps({"ok": True, **fields}, ensure_ascii=False)


def fail(error: str, reason: str, **fields: Any) -> str:
    return json.dumps({"ok": False, "error": error, "reason": reason, **fields}, ensure_ascii=False)


def refusal_reason(exc: errors.RefusedError) -> str:
    """A stable word for a refusal, for the model (and for tests)."""
    if isinstance(exc, errors.AskRefusedError):
        return "cycle" if exc.cycle else "ask_refused"
    for cls, reason in _REASONS:
        if isinstance(exc, cls):
            return reason
    return "refused"


_REASONS: tuple[tuple[type[errors.RefusedError], str], ...] = (
    (errors.UnknownQuestionError, "unknown_question"),
    (errors.QuestionClosedError, "question_closed"),
    (errors.WrongQuestionError, "wrong_question"),
    (errors.AgentTerminatedError, "terminated"),
    (errors.UnknownAgentError, "unknown_agent"),
    (errors.ContentTooLargeError, "too_large"),
    (errors.DuplicateDisplayNameError, "duplicate_name"),
    (errors.DedupConflictError, "dedup_conflict"),
    (errors.BudgetExhaustedError, "budget_exhausted"),
    (errors.InvalidMessageError, "invalid"),
)


class ToolRegistry:
    """Tools by name. ``roles``: the catalogue the team is staffed from (its role descriptions go
    into every agent's protocol section)."""

    def __init__(self, tools: Iterable[Tool] = (), *, roles: RoleCatalogue | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        self.roles = roles
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> Tool:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        return tool

    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def schemas(self, agent: Agent) -> list[dict[str, Any]]:
        return [t.schema() for t in self._tools.values() if t.visible_to(agent)]

    def visible_names(self, agent: Agent) -> list[str]:
        return [t.name for t in self._tools.values() if t.visible_to(agent)]

    def call(self, name: str, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Run a tool. A bad call (unknown tool, wrong arguments) and a refusal of the router are
        answered in the result, as a model expects; anything else the tool raises propagates
        (a fenced turn stops, other errors fail the turn)."""
        tool = self._tools.get(name)
        if tool is None or not tool.visible_to(ctx.agent):
            names = self.visible_names(ctx.agent)
            return fail(
                f"no tool named {name!r}; your tools are: {', '.join(names)}",
                "unknown_tool",
                tools=names,
            )
        try:
            return tool.function(arguments, ctx)
        except ToolError as exc:
            return fail(str(exc), exc.reason)
        except errors.AskRefusedError as exc:
            advice = lookup.cycle_advice(exc, ctx.turn.display_name)
            return fail(advice, refusal_reason(exc), cycle=exc.cycle)
        except errors.RefusedError as exc:
            return fail(str(exc), refusal_reason(exc))


# ---------------------------------------------------------------------- argument checks
