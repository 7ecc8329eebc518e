"""What every tool is made of: the context a call runs in, the ``Tool`` value, the JSON
result forms (``ok`` / ``fail``) and the registry that maps names to tools.

A call is as strict as the tool's schema: its arguments are checked against ``parameters``
(JSON Schema, with :mod:`jsonschema`) before the tool runs, and every problem is reported in one
``bad_arguments`` result. An argument the schema does not name is refused: a schema that lists
its properties without saying ``additionalProperties`` is read as closed (MCP servers often
leave it out). A host function checks its own arguments, with the pydantic model of its
signature (lax: ``"4"`` is the integer 4), refusing unknown ones and reporting all problems
too.

What reaches the transcript is neutralised (:mod:`agent_router.formats`): the result of a tool
an MCP server or a host function ran is fenced with the tool's and the server's names; the
router's own answers (``ok`` / ``fail`` JSON, refusals) are neutralised value by value.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from agent_router import errors, formats
from agent_router import validation as check
from agent_router.agents import lookup
from agent_router.agents.roles import RoleCatalogue
from agent_router.domain import (
    Agent,
    ToolOutcome,
    ToolRun,
)
from agent_router.logfields import get_logger
from agent_router.settings import Settings

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

    from agent_router.router import Router
    from agent_router.turn import Turn


logger = get_logger(__name__)


class Audience(enum.StrEnum):
    """Which agents see a tool."""

    ALL = "all"
    LEAD = "lead"
    SUB_AGENT = "sub_agent"
    #: The lead, and the sub-agents whose role says ``talks_to_user``.
    USER_FACING = "user_facing"


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
class ToolOrigin:
    """Who runs a tool that is not the router's own, named in the fence around its output: an
    MCP server (its name in the configuration) or the host (``server="host"``), and the tool's
    own name there."""

    server: str
    tool: str


#: The most argument problems one result lists.
MAX_PROBLEMS = 20


@dataclass(frozen=True, kw_only=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    function: ToolFunction
    audience: Audience = Audience.ALL
    #: ``None``: the router's own tool. Else who runs it: its output is fenced with that name.
    origin: ToolOrigin | None = None
    #: Whether a call's arguments are checked against ``parameters`` before ``function`` runs
    #: (a host function checks its own).
    checks_arguments: bool = True
    _validator: list[Validator] = field(default_factory=list, init=False, repr=False, compare=False)

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

    def visible_to(self, agent: Agent, roles: RoleCatalogue | None = None) -> bool:
        """Whether ``agent`` sees the tool (``roles``: where its role's flags are read)."""
        if self.audience is Audience.ALL:
            return True
        if self.audience is Audience.USER_FACING:
            role = roles.get(agent.role) if roles is not None else None
            return agent.is_lead or (role is not None and role.talks_to_user)
        return (self.audience is Audience.LEAD) == agent.is_lead

    def argument_problems(self, arguments: dict[str, Any]) -> list[str]:
        """Every way ``arguments`` break ``parameters`` (none: the call may run), each as a
        line naming where, then what; at most :data:`MAX_PROBLEMS` and a count of the rest."""
        if not self.checks_arguments:
            return []
        if not self._validator:  # compiled once per tool, on its first call
            self._validator.append(_validator(self.name, self.parameters))
        found = sorted(
            (p for error in self._validator[0].iter_errors(arguments) for p in _problems(error)),
        )
        if len(found) > MAX_PROBLEMS:
            found[MAX_PROBLEMS:] = [f"and {len(found) - MAX_PROBLEMS} more"]
        return found

    def neutral(self, result: str) -> str:
        """What a call's result looks like in the transcript: fenced when someone else ran the
        tool, else the router's answer neutralised (:mod:`agent_router.formats`)."""
        if self.origin is None:
            return formats.escape_json(result)
        output = formats.ToolOutput(
            tool=self.origin.tool, server=self.origin.server, content=result
        )
        return formats.fence(output)


def ok(**fields: Any) -> str:
    return json.dumps({"ok": True, **fields}, ensure_ascii=False)


def fail(error: str, reason: str, **fields: Any) -> str:
    return json.dumps({"ok": False, "error": error, "reason": reason, **fields}, ensure_ascii=False)


#: Between an MCP server's name and its tool's in the name the model calls (``files__read``).
SERVER_SEPARATOR: Final = "__"


def tool_run(name: str, result: str, seconds: float) -> ToolRun:
    """How the call of the tool ``name`` ran, from its result: an error when the result is
    one :func:`fail` wrote (a failing tool, a bad call, a server that did not answer)."""
    server, separator, _ = name.partition(SERVER_SEPARATOR)
    failed = False
    if result.startswith("{"):
        try:
            value = json.loads(result)
        except ValueError:
            value = None
        failed = isinstance(value, dict) and value.get("ok") is False
    return ToolRun(
        tool=name,
        server=server if separator and server else None,
        outcome=ToolOutcome.ERROR if failed else ToolOutcome.OK,
        seconds=seconds,
    )


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
        return [t.schema() for t in self._tools.values() if t.visible_to(agent, self.roles)]

    def visible_names(self, agent: Agent) -> list[str]:
        return [t.name for t in self._tools.values() if t.visible_to(agent, self.roles)]

    def call(self, name: str, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Run a tool. A bad call (unknown tool, arguments its schema refuses) and a refusal of
        the router are answered in the result, as a model expects; anything else the tool
        raises propagates (a fenced turn stops, other errors fail the turn). What the tool
        returned is written as text whatever its type (:func:`check.tool_output`) and
        neutralised for the transcript (:meth:`Tool.neutral`)."""
        tool = self._tools.get(name)
        if tool is None or not tool.visible_to(ctx.agent, self.roles):
            names = self.visible_names(ctx.agent)
            return formats.escape_json(
                fail(
                    f"no tool named {name!r}; your tools are: {', '.join(names)}",
                    "unknown_tool",
                    tools=names,
                )
            )
        problems = tool.argument_problems(arguments)
        if problems:
            return formats.escape_json(
                fail(
                    f"invalid arguments for {name}, so it did not run: {'; '.join(problems)}",
                    "bad_arguments",
                    problems=problems,
                )
            )
        try:
            result = tool.function(arguments, ctx)
        except ToolError as exc:
            return formats.escape_json(fail(str(exc), exc.reason))
        except errors.AskRefusedError as exc:
            advice = lookup.cycle_advice(exc, ctx.turn.display_name)
            return formats.escape_json(fail(advice, refusal_reason(exc), cycle=exc.cycle))
        except errors.RefusedError as exc:
            return formats.escape_json(fail(str(exc), refusal_reason(exc)))
        if result is RESULT_RECORDED:
            return result
        # Whatever the function returned (bytes, a number of 5,000 digits, any object): text.
        return tool.neutral(check.tool_output(result))


# ---------------------------------------------------------------------- argument checks


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema a call is checked against: an object schema that lists its properties and
    says nothing about others takes no others."""
    open_ended = ("additionalProperties", "patternProperties", "unevaluatedProperties")
    combined = ("allOf", "anyOf", "oneOf", "$ref", "if", "dependentSchemas")
    if (
        schema.get("type") == "object"
        and isinstance(schema.get("properties"), dict)
        and not any(k in schema for k in open_ended + combined)
    ):
        return {**schema, "additionalProperties": False}
    return schema


def _validator(name: str, schema: dict[str, Any]) -> Validator:
    """A validator of the dialect the schema names (default: 2020-12). A schema that is not
    valid JSON Schema checks only that the arguments are an object (and says so in the log)."""
    from jsonschema import exceptions, validators

    checked = closed(schema) if isinstance(schema, dict) else {}
    cls = validators.validator_for(checked, default=validators.Draft202012Validator)
    try:
        cls.check_schema(checked)
    except exceptions.SchemaError as exc:
        logger.warning(
            "tool schema is not valid JSON Schema; only an object is required",
            extra={"action": "tool_schema_invalid", "tool": name, "error": exc.message},
        )
        return validators.Draft202012Validator({"type": "object"})
    return cls(checked)


def _problems(error: Any) -> list[str]:
    """One validation error as the lines a model reads: where, then what."""
    path = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = set((error.schema or {}).get("properties") or {})
        takes = ", ".join(sorted(known)) or "none"
        return [
            f"`{_join(path, extra)}`: unknown argument (this tool takes: {takes})"
            for extra in error.instance
            if extra not in known
        ]
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [r for r in error.validator_value if r not in error.instance]
        if len(missing) == 1 and repr(missing[0]) in error.message:
            return [f"`{_join(path, missing[0])}`: required, missing"]
    return [f"`{path or 'arguments'}`: {_short(error.message)}"]


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
