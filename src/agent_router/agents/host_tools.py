"""Python functions a host gives its agents as tools, registered with a decorator.

    from agent_router.agents.host_tools import host_tool

    @host_tool
    def lookup_ticket(ticket_id: int, with_comments: bool = False) -> dict[str, object]:
        \"\"\"Look up a ticket of the tracker by its number.\"\"\"
        ...

The tool's name is the function's, its description the docstring's first paragraph, and the
JSON schema of its arguments is derived by pydantic from the signature and type hints
(``Annotated[int, Field(description=...)]`` describes a parameter); each may be overridden:
``@host_tool(name=..., description=..., parameters=...)``. Arguments are validated by the same
pydantic model before the function runs: a bad call, or an exception of the function, is a
result the model reads (``{"ok": false, ...}``), never a failed turn; every problem of a bad
call is in that one result, and an argument the signature does not take is refused. What the
function returns reaches the model fenced as ``<tool-output tool="NAME" server="host">``
(:mod:`agent_router.formats`). A parameter annotated
:class:`~agent_router.agents.tools.ToolContext` receives the call's context instead of an
argument. A ``str`` return is the result as it is; ``bytes`` are decoded (a byte that is not
UTF-8 becomes U+FFFD); anything else is sent as JSON, and what JSON cannot hold (an integer of
thousands of digits, an object pydantic cannot convert) as a short readable text
(:func:`agent_router.validation.tool_output`): whatever the function returns, the model reads
it as the call's result. An ``async`` function runs to its end on an event loop of its own, on
the turn's thread.

Importing a module registers its functions in :data:`default_host_tools`; workers import the
module named by ``AGENT_ROUTER_HOST_TOOLS`` (``agent-router run --host-tools``).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar, get_type_hints, overload

import pydantic

from agent_router import errors, formats
from agent_router import validation as check
from agent_router.agents.tools import (
    Audience,
    Tool,
    ToolContext,
    ToolError,
    ToolOrigin,
    ToolResult,
    TurnSuspended,
    fail,
)
from agent_router.errors import ConfigurationError
from agent_router.logfields import get_logger

logger = get_logger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

#: The tool names models accept.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class HostToolset:
    """Host functions by name. Thread-safe: workers read it while a module may register."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._lock = threading.Lock()

    @overload
    def tool(self, function: F) -> F: ...

    @overload
    def tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        function: F | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> F | Callable[[F], F]:
        """Register a function as a tool (as ``@tool`` or ``@tool(name=...)``); returns the
        function unchanged."""

        def register(fn: F) -> F:
            self.add(
                host_function_tool(fn, name=name, description=description, parameters=parameters)
            )
            return fn

        return register(function) if function is not None else register

    def add(self, tool: Tool) -> Tool:
        if not TOOL_NAME.match(tool.name):
            raise ConfigurationError(
                f"invalid host tool name {tool.name!r}: letters, digits, '_' and '-', at most 64"
            )
        with self._lock:
            if tool.name in self._tools:
                raise ConfigurationError(f"host tool {tool.name!r} is already registered")
            self._tools[tool.name] = tool
        return tool

    def names(self) -> list[str]:
        with self._lock:
            return list(self._tools)

    def get(self, name: str) -> Tool | None:
        with self._lock:
            return self._tools.get(name)

    def select(self, names: tuple[str, ...] | None) -> list[Tool]:
        """The tools named (``None`` or ``"*"``: all); an unknown name is a configuration
        error."""
        with self._lock:
            if names is None or "*" in names:
                return list(self._tools.values())
            missing = [n for n in names if n not in self._tools]
            if missing:
                known = ", ".join(self._tools) or "none"
                raise ConfigurationError(f"unknown host tools {missing}; registered: {known}")
            return [self._tools[n] for n in names]

    def clear(self) -> None:
        with self._lock:
            self._tools.clear()


#: Where :func:`host_tool` registers.
default_host_tools = HostToolset()

#: Register a function in :data:`default_host_tools` (``@host_tool`` or ``@host_tool(...)``).
host_tool = default_host_tools.tool


def import_host_modules(spec: str | None) -> None:
    """Import the comma-separated modules of ``spec`` (their decorators register the tools)."""
    for module in filter(None, (m.strip() for m in (spec or "").split(","))):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigurationError(f"cannot import host tools module {module!r}: {exc}") from exc


def host_function_tool(
    function: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
) -> Tool:
    """A :class:`Tool` that validates its arguments with a pydantic model of ``function``'s
    signature and calls it."""
    model, context_param = _arguments_model(function)
    doc = inspect.getdoc(function) or ""
    name = name or function.__name__
    return Tool(
        name=name,
        description=description if description is not None else doc.split("\n\n")[0].strip(),
        parameters=parameters if parameters is not None else _schema(model),
        function=_caller(function, model, context_param),
        audience=Audience.ALL,
        origin=ToolOrigin(server=formats.HOST_SERVER, tool=name),
        checks_arguments=False,  # the pydantic model of the signature checks them
    )


def _arguments_model(function: Callable[..., Any]) -> tuple[type[pydantic.BaseModel], str | None]:
    signature = inspect.signature(function)
    hints = get_type_hints(function, include_extras=True)
    fields: dict[str, Any] = {}
    context_param = None
    for param in signature.parameters.values():
        hint = hints.get(param.name, Any)
        if hint is ToolContext:
            context_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ConfigurationError(
                f"host tool {function.__name__!r}: parameter {param.name!r} must be passable "
                "by keyword"
            )
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (hint, default)
    model = pydantic.create_model(
        f"{function.__name__}_arguments",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **fields,
    )
    return model, context_param


def _schema(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("properties", {})
    return schema


def _caller(
    function: Callable[..., Any], model: type[pydantic.BaseModel], context_param: str | None
) -> Callable[[dict[str, Any], ToolContext], ToolResult]:
    def call(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            validated = model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            raise ToolError(_problems(exc)) from None
        kwargs = {name: getattr(validated, name) for name in type(validated).model_fields}
        if context_param is not None:
            kwargs[context_param] = ctx
        try:
            result = function(**kwargs)
            if inspect.iscoroutine(result):  # an async function runs on a loop of its own
                result = asyncio.run(result)
        except (TurnSuspended, errors.StaleTurnError, ToolError, errors.RefusedError):
            raise
        except Exception as exc:
            logger.warning(
                "host tool failed",
                exc_info=True,
                extra={"action": "host_tool_failed", "tool": function.__name__},
            )
            return fail(_raised(exc), "tool_failed")
        return check.tool_output(result)

    return call


def _raised(exc: Exception) -> str:
    """What a function raised, as its result says it: the type and the message (the type alone
    when even the message cannot be made)."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # a broken __str__, a number too long to write
        text = type(exc).__name__
    return check.scrub(text[:2000])


def _problems(exc: pydantic.ValidationError) -> str:
    """The validation errors in a line a model can act on."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "arguments"
        parts.append(f"`{where}`: {error['msg']}")
    return "invalid arguments: " + "; ".join(parts)
