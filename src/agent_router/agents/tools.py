"""The tools an agent's model can call: a name, a JSON schema, and a function.

The registry maps names to :class:`Tool` values; the loop asks it for the schemas an agent may
see (lead tools only for the lead) and calls a tool by name. A host registers its own tools
beside the built-in ones.

Every built-in tool answers with one JSON object the model can read: ``{"ok": true, ...ids}`` on
success, ``{"ok": false, "error": "...", "reason": "..."}`` on a refusal (``reason`` is a stable
word: ``unknown_agent``, ``question_closed``, ``cycle``, ...). The blocking tools
(``ask_master``, ``ask_other_agent``, ``wait_sub_agent_output``) are the exception: the router
itself writes their result (the answer, the awaited output, or an ``expired``/``cancelled``
note) into the transcript, so they return :data:`RESULT_RECORDED`, or raise
:class:`TurnSuspended` when the turn gave up its worker while waiting.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from agent_router import errors
from agent_router.agents import lookup
from agent_router.agents.llm import WORK_TOOL
from agent_router.agents.roles import RoleCatalogue, roles_from_env
from agent_router.domain import (
    Agent,
    MessageSubtype,
    MessageType,
    Question,
    WaitOutcome,
)
from agent_router.logfields import get_logger

if TYPE_CHECKING:
    pass

from agent_router.agents.toolkit import (
    _REASONS,
    RESULT_RECORDED,
    Audience,
    Tool,
    ToolContext,
    ToolError,
    ToolFunction,
    ToolOrigin,
    ToolRegistry,
    ToolResult,
    TurnSuspended,
    fail,
    ok,
    refusal_reason,
    tool_run,
)

logger = get_logger(__name__)


def _text(arguments: dict[str, Any], name: str) -> str:
    value = arguments.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ToolError(f"`{name}` must be a non-empty string")
    return value


def _name(arguments: dict[str, Any], name: str = "display_name") -> str:
    return _text(arguments, name).strip()


def _agent_named(ctx: ToolContext, name: str) -> Agent:
    return lookup.agent_named(ctx.router, ctx.turn.team_id, name, asking=ctx.turn.agent_id)


def _sub_agent(ctx: ToolContext, name: str) -> Agent:
    agent = _agent_named(ctx, name)
    if agent.is_lead:
        raise ToolError(f"{name!r} is the Team Leader, not a sub-agent", reason="not_a_sub_agent")
    return agent


def _listed(ctx: ToolContext) -> str:
    questions = lookup.open_questions_to(ctx.router, ctx.turn.team_id, ctx.turn.agent_id)
    return lookup.listed(ctx.router, questions)


def _status(agent: Agent) -> dict[str, Any]:
    return {
        "display_name": agent.display_name,
        "role": agent.role,
        "state": agent.state.value,
        "suspended": agent.suspended,
        "pending_messages": agent.mailbox_depth,
    }


def _lead_name(ctx: ToolContext) -> str:
    return ctx.router.team(ctx.turn.team_id).lead.display_name


def _block(ctx: ToolContext, question: Question) -> ToolResult:
    """Block on a wait; its result is written by the router (or the turn suspends)."""
    if ctx.turn.wait_for(question) is WaitOutcome.SUSPENDED:
        raise TurnSuspended(f"suspended waiting on question {question.id}")
    return RESULT_RECORDED


# ---------------------------------------------------------------------- the tools


def _do_work(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    step = arguments.get("step")
    if not isinstance(step, str) or not step.strip():
        raise ToolError("`step` must be a non-empty string")
    # Takes a little while so that the agent is visibly `running` while others message it.
    time.sleep(ctx.settings.work_seconds)
    return f"done: {step}"


def _dedup_key(ctx: ToolContext) -> str | None:
    """The same call of the same reply, run again (a continuation), sends nothing twice; a
    later reply reusing the call id is a new call."""
    if not ctx.call_id:
        return None
    key = f"tool:{ctx.turn.agent_id}:{ctx.reply_index}:{ctx.call_id}"
    return key[:200]


def _send(ctx: ToolContext, to: str, content: str, type_: MessageType, **kw: Any) -> str:
    delivery = ctx.router.send(
        ctx.turn.team_id,
        to=to,
        content=content,
        sender=ctx.turn.display_name,
        type=type_,
        # A continuation that re-runs this call sends nothing twice.
        dedup_key=_dedup_key(ctx),
        **kw,
    )
    return ok(to=delivery.target, message_id=delivery.message_id, outcome=delivery.outcome.value)


def _create_sub_agent(roles: RoleCatalogue) -> ToolFunction:
    def create_sub_agent(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        role_name = _name(arguments, "role")
        task = _text(arguments, "task")
        role = None
        if len(roles):  # an empty catalogue: any role, with the router's default prompt
            try:
                role = roles.sub_agent_role(role_name)
            except errors.UnknownRoleError as exc:
                # The host reads it too: a role its lead asks for that its roles file lacks.
                logger.warning(
                    "create_sub_agent refused: unknown role",
                    extra={"action": "unknown_role", "role": role_name, "roles": exc.roles},
                )
                return fail(str(exc), "unknown_role", roles=exc.roles)
        if len(task.encode("utf-8", "surrogatepass")) > ctx.settings.max_content_bytes:
            raise ToolError("`task` is larger than the message limit", reason="too_large")
        # The team's sub-agent budgets (created, active at once): a refusal is this result.
        ctx.router.charge_sub_agent(ctx.turn.team_id, role_name)
        # One transaction: a crash between the two cannot leave a sub-agent without its task.
        agent, delivery = ctx.router.create_agent_with_task(
            ctx.turn.team_id,
            role=role_name,
            task=task,
            sender=ctx.turn.display_name,
            system_prompt=role.system_prompt if role is not None else None,
            runner=role.runner if role is not None else None,
        )
        return ok(
            display_name=agent.display_name,
            agent_id=agent.id,
            role=agent.role,
            task_message_id=delivery.message_id,
            outcome=delivery.outcome.value,
        )

    return create_sub_agent


def _send_message_to_sub_agent(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    target = _sub_agent(ctx, _name(arguments))
    return _send(ctx, target.display_name, _text(arguments, "message"), MessageType.MESSAGE)


def _answer(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    answer = _text(arguments, "answer")
    question_id = lookup.question_id(
        ctx.router, ctx.turn.team_id, ctx.turn.agent_id, arguments.get("question_id")
    )
    try:
        question = ctx.router.question(question_id)
    except errors.UnknownQuestionError:
        question = None
    if question is None or question.team_id != ctx.turn.team_id:
        raise ToolError(
            f"no question {question_id}; {_listed(ctx)}",
            reason="unknown_question",
        )
    if question.target_agent_id != ctx.turn.agent_id:
        target = ctx.router.reads.agent_by_id(question.target_agent_id)
        raise ToolError(
            f"question {question_id} was asked of {target.display_name}, not of you; only it "
            f"can answer; {_listed(ctx)}",
            reason="wrong_question",
        )
    asker = ctx.router.reads.agent_by_id(question.asker_agent_id)
    result = json.loads(
        _send(ctx, asker.display_name, answer, MessageType.ANSWER, question_id=question_id)
    )
    return ok(
        question_id=question_id,
        answered=f"question {question_id} from {asker.display_name}",
        **{k: v for k, v in result.items() if k != "ok"},
    )


def _stop_sub_agent(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    target = _sub_agent(ctx, _name(arguments))
    state = ctx.router.stop(
        ctx.turn.team_id, target.display_name, reason=f"stopped by {ctx.turn.display_name}"
    )
    return ok(
        display_name=target.display_name,
        state=state.value,
        # A running turn finishes the tool call it is in, then stops.
        stopping=state.value != "idle",
    )


def _terminate_sub_agent(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    target = _sub_agent(ctx, _name(arguments))
    ctx.router.terminate(
        ctx.turn.team_id, target.display_name, reason=f"terminated by {ctx.turn.display_name}"
    )
    return ok(display_name=target.display_name, state="terminated")


def _get_sub_agent_status(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    names = arguments.get("display_names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ToolError("`display_names` must be a list of display names")
    agents = {a.display_name: a for a in ctx.router.agents(ctx.turn.team_id) if not a.is_lead}
    unknown = [n for n in names if n not in agents]
    wanted = [agents[n] for n in names if n in agents] if names else list(agents.values())
    return ok(agents=[_status(a) for a in wanted], unknown=unknown)


def _list_sub_agents(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    agents = [a for a in ctx.router.agents(ctx.turn.team_id) if not a.is_lead]
    return ok(agents=[_status(a) for a in agents])


def _wait_sub_agent_output(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    target = _sub_agent(ctx, _name(arguments))
    timeout = arguments.get("timeout_seconds")
    if timeout is not None and (
        not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0
    ):
        raise ToolError("`timeout_seconds` must be a positive number")
    question = ctx.turn.wait_output(
        target.display_name,
        tool_call_id=ctx.call_id,
        timeout_seconds=float(timeout) if timeout is not None else None,
    )
    return _block(ctx, question)


def _ask_master(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    question = ctx.turn.ask(
        _lead_name(ctx),
        _text(arguments, "question"),
        tool_call_id=ctx.call_id,
        subtype=MessageSubtype.ASK_MASTER,
    )
    return _block(ctx, question)


def _ask_other_agent(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    question = ctx.turn.ask(
        _agent_named(ctx, _name(arguments, "target")).display_name,
        _text(arguments, "question"),
        tool_call_id=ctx.call_id,
        subtype=MessageSubtype.ASK_OTHER,
    )
    return _block(ctx, question)


def _tell_user(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    said = ctx.turn.tell_user(_text(arguments, "text"), dedup_key=_dedup_key(ctx))
    return ok(message_id=said.id, kind=said.kind.value)


def _ask_user(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """The turn suspends at once: the user's reply is the call's result, written by the
    router, and a continuation turn carries on from it."""
    question, _said = ctx.turn.ask_user(_text(arguments, "question"), tool_call_id=ctx.call_id)
    raise TurnSuspended(f"suspended waiting on the user's answer to question {question.id}")


def _send_message_to_agent(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    target = _agent_named(ctx, _name(arguments, "target")).display_name
    return _send(ctx, target, _text(arguments, "message"), MessageType.MESSAGE)


def _list_agents(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
    return ok(
        agents=[
            {**_status(a), "is_lead": a.is_lead, "is_you": a.id == ctx.turn.agent_id}
            for a in ctx.router.agents(ctx.turn.team_id)
        ]
    )


def _schema(required: dict[str, dict[str, Any]], optional: dict[str, Any] | None = None) -> Any:
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": list(required),
        "additionalProperties": False,
    }


_STR = {"type": "string"}


def _s(description: str) -> dict[str, Any]:
    return {**_STR, "description": description}


_QUESTION_ID = {
    "type": ["integer", "string"],
    "description": "The question_id shown on the question (default: your only open question).",
}
_DISPLAY_NAME = _s("The sub-agent's display name, e.g. 'UI Operator_1'.")

DO_WORK = Tool(
    name=WORK_TOOL,
    description="Carry out one step of the current task and report when it is done.",
    parameters=_schema({"step": _s("What this step does.")}),
    function=_do_work,
    audience=Audience.SUB_AGENT,
)


def _create_sub_agent_tool(roles: RoleCatalogue) -> Tool:
    role_names = [r.name for r in roles.sub_agent_roles()]
    # The roles are named in the description, not as an enum: a role not in the catalogue then
    # reaches the tool, whose result lists the roles and whose log line tells the host.
    role_schema: dict[str, Any] = _s(
        f"The role of the new sub-agent: one of {', '.join(role_names)}."
        if role_names
        else "The role of the new sub-agent."
    )
    return Tool(
        name="create_sub_agent",
        description="Create a sub-agent of a role (display name '{Role}_{n}') and give it "
        "its first task. Returns its display_name.",
        parameters=_schema({"role": role_schema, "task": _s("The task, self-contained.")}),
        function=_create_sub_agent(roles),
        audience=Audience.LEAD,
    )


#: One tool of a group: its name, description, arguments' JSON schema and function.
_Row = tuple[str, str, dict[str, Any], ToolFunction]


def _tools(audience: Audience, rows: list[_Row]) -> list[Tool]:
    """The tools of ``rows``, all seen by ``audience``."""
    return [
        Tool(name=name, description=text, parameters=schema, function=fn, audience=audience)
        for name, text, schema, fn in rows
    ]


def _lead_steering_tools() -> list[Tool]:
    """The lead's tools that act on a sub-agent: message, answer, stop, terminate."""
    return _tools(
        Audience.LEAD,
        [
            (
                "send_message_to_sub_agent",
                "Send a message (guidance, a new task) to a sub-agent. A running sub-agent reads "
                "it before its next step; an idle one starts working on it.",
                _schema({"display_name": _DISPLAY_NAME, "message": _s("The message.")}),
                _send_message_to_sub_agent,
            ),
            (
                "answer_sub_agent_question",
                "Answer a question a sub-agent asked you (ask_master); the answer becomes the "
                "result of its waiting call.",
                _schema({"answer": _s("Your answer.")}, {"question_id": _QUESTION_ID}),
                _answer,
            ),
            (
                "stop_sub_agent",
                "Stop a sub-agent's current work: it finishes the step it is in, drops the rest "
                "and becomes idle (its unread messages are kept).",
                _schema({"display_name": _DISPLAY_NAME}),
                _stop_sub_agent,
            ),
            (
                "terminate_sub_agent",
                "Remove a sub-agent for good: its unread messages are dropped and nobody can "
                "message it any more.",
                _schema({"display_name": _DISPLAY_NAME}),
                _terminate_sub_agent,
            ),
        ],
    )


def _lead_watching_tools() -> list[Tool]:
    """The lead's tools that look at its sub-agents: status, list, wait for output."""
    timeout = {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": "Give up after this long (default: the question timeout).",
    }
    return _tools(
        Audience.LEAD,
        [
            (
                "get_sub_agent_status",
                "State of the named sub-agents (all of them for an empty list).",
                _schema(
                    {"display_names": {"type": "array", "items": _STR, "description": "Names."}}
                ),
                _get_sub_agent_status,
            ),
            (
                "list_sub_agents",
                "List your sub-agents with their roles and states.",
                _schema({}),
                _list_sub_agents,
            ),
            (
                "wait_sub_agent_output",
                "Wait until the named sub-agent reports the end of its work (its completion "
                "report); the report becomes this call's result. Its progress notes do not end "
                "the wait. Do not use it to poll.",
                _schema({"display_name": _DISPLAY_NAME}, {"timeout_seconds": timeout}),
                _wait_sub_agent_output,
            ),
        ],
    )


def _sub_agent_tools() -> list[Tool]:
    """A sub-agent's tools: ask, answer, message and list the team."""
    target = _s("The agent's display name.")
    return _tools(
        Audience.SUB_AGENT,
        [
            (
                "ask_master",
                "Ask the Team Leader a question and wait for the answer (it becomes this call's "
                "result).",
                _schema({"question": _s("The question, self-contained.")}),
                _ask_master,
            ),
            (
                "ask_other_agent",
                "Ask another agent of the team a question and wait for the answer.",
                _schema({"target": target, "question": _s("The question.")}),
                _ask_other_agent,
            ),
            (
                "answer_other_agent",
                "Answer a question another agent asked you (use its question_id).",
                _schema({"answer": _s("Your answer.")}, {"question_id": _QUESTION_ID}),
                _answer,
            ),
            (
                "send_message_to_agent",
                "Send a message to another agent of the team (no answer awaited).",
                _schema({"target": target, "message": _s("The message.")}),
                _send_message_to_agent,
            ),
            (
                "list_agents",
                "List the agents of your team with their roles and states.",
                _schema({}),
                _list_agents,
            ),
        ],
    )


def _user_tools() -> list[Tool]:
    """Talking to the user: progress (the lead, and sub-agents whose role allows it) and a
    question the lead waits on."""
    return [
        Tool(
            name="tell_user",
            description="Tell the user something while the work goes on (progress, a finding). "
            "Your final reply of a turn reaches the user as your answer on its own.",
            parameters=_schema({"text": _s("What to tell the user.")}),
            function=_tell_user,
            audience=Audience.USER_FACING,
        ),
        Tool(
            name="ask_user",
            description="Ask the user a question and wait for the reply (it becomes this "
            "call's result). Ask only what you cannot decide yourself.",
            parameters=_schema({"question": _s("The question, self-contained.")}),
            function=_ask_user,
            audience=Audience.LEAD,
        ),
    ]


def multi_agent_tools(roles: RoleCatalogue | None = None) -> list[Tool]:
    """The multi-agent tools (docs/design.md lists them). ``roles``: what ``create_sub_agent``
    may create (default: the roles file ``AGENT_ROUTER_ROLES_FILE`` names, else the shipped
    catalogue)."""
    roles = roles if roles is not None else roles_from_env()
    return [
        _create_sub_agent_tool(roles),
        *_lead_steering_tools(),
        *_lead_watching_tools(),
        *_sub_agent_tools(),
        *_user_tools(),
    ]


def team_registry(roles: RoleCatalogue | None = None) -> ToolRegistry:
    """A fresh registry with the multi-agent tools only (what ``agent-router run`` gives a real
    model: no pretend work tool)."""
    roles = roles if roles is not None else roles_from_env()
    return ToolRegistry(multi_agent_tools(roles), roles=roles)


def default_registry(roles: RoleCatalogue | None = None) -> ToolRegistry:
    """A fresh registry with the built-in tools: the multi-agent suite and the scripted agents'
    ``do_work`` (the demo's sub-agents work through it)."""
    registry = team_registry(roles)
    registry.register(DO_WORK)
    return registry


__all__ = [
    "DO_WORK",
    "RESULT_RECORDED",
    "_REASONS",
    "Audience",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolFunction",
    "ToolOrigin",
    "ToolRegistry",
    "ToolResult",
    "TurnSuspended",
    "default_registry",
    "fail",
    "multi_agent_tools",
    "ok",
    "refusal_reason",
    "team_registry",
    "tool_run",
]
