"""The model an agent loop calls, and a deterministic stand-in for it.

A model is anything with ``complete(messages, tools) -> assistant message`` in the OpenAI chat
format. :class:`ScriptedModel` needs no network and no key: its reply is a pure function of the
transcript it is given (plus a configurable "writing" delay), so a turn that runs in another
process, or is retried, behaves the same. That is what the demo and the tests drive.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

from agent_router import formats
from agent_router.agents.context import count_tokens
from agent_router.agents.usage import Completion, ReportsUsage, Usage
from agent_router.domain import Agent, Delta, MessageType
from agent_router.logfields import get_logger

logger = get_logger(__name__)

#: The built-in work tool the scripted sub-agents call (registered in
#: :mod:`agent_router.agents.tools`).
WORK_TOOL = "do_work"

#: The model name (of a team, a role or ``AGENT_ROUTER_OPENAI_MODEL``) that runs
#: :class:`ScriptedModel`, whose agents get :data:`WORK_TOOL` (see ``agents.builder``).
SCRIPTED_MODEL = "scripted"


class Model(Protocol):
    """One model call: the transcript so far and the tool schemas in, one assistant message out
    (``{"role": "assistant", "content": str | None, "tool_calls": [...]}``)."""

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]: ...


#: Picks the model for an agent (a host may give the lead a bigger model than its sub-agents).
ModelFactory = Callable[[Agent], Model]


#: Takes the pieces of a reply's text as they are written.
DeltaSink = Callable[[Delta], None]


class StreamsReplies(Protocol):
    """A model that can stream a call, handing each piece of the reply's text to a sink."""

    def respond(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_delta: DeltaSink | None = None,
    ) -> Completion: ...


class Streamed:
    """``model`` whose every call streams into ``sink``; the replies are the model's own,
    exactly as without streaming."""

    def __init__(self, model: StreamsReplies, sink: DeltaSink) -> None:
        self.model = model
        self.sink = sink
        self.model_name: str | None = getattr(model, "model_name", None)
        self.context_window: int | None = getattr(model, "context_window", None)

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return self.respond(messages, tools).message

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        return self.model.respond(messages, tools, on_delta=self.sink)


def complete(
    model: Model,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    *,
    prompt_tokens: int | None = None,
) -> Completion:
    """One model call with its usage: the model's own report (:class:`ReportsUsage`), else an
    estimate from the request (``prompt_tokens`` when the caller counted it already) and the
    reply."""
    if isinstance(model, ReportsUsage):
        return model.respond(messages, tools)
    message = model.complete(messages, tools)
    usage = Usage(
        prompt_tokens=count_tokens(messages, tools) if prompt_tokens is None else prompt_tokens,
        completion_tokens=count_tokens([message]),
        estimated=True,
    )
    return Completion(message=message, usage=usage, model=getattr(model, "model_name", None))


@dataclass(frozen=True, kw_only=True)
class RoleScript:
    """How a scripted sub-agent of one role works a task.

    ``steps`` are ``do_work`` calls made one per model call. With ``await_guidance`` the agent
    keeps checking in (one ``do_work`` per model call, at most ``patience`` of them) until the
    lead steers it or tells it to wrap up: a task that deliberately runs long, so that a message
    can reach it while it is running. ``answer`` is what it says when asked.
    """

    opening: str
    steps: tuple[str, ...]
    await_guidance: bool = False
    patience: int = 40
    answer: str = "I have nothing to add beyond my task."


#: The demo's team: a UI Operator and a Full-Stack Engineer. Unknown roles get
#: :data:`DEFAULT_SCRIPT`.
ROLE_SCRIPTS: dict[str, RoleScript] = {
    "UI Operator": RoleScript(
        opening="Next I will create a new API for the login form.",
        steps=("survey the existing UI code",),
        await_guidance=True,
        answer="The login form posts to /api/session; reuse its validation.",
    ),
    "Full-Stack Engineer": RoleScript(
        opening="Next I will design the change and implement it.",
        steps=("design the change", "implement and test it"),
        answer="POST /api/password-reset sends the mail; it takes the user's email address.",
    ),
}
DEFAULT_SCRIPT = RoleScript(opening="Next I will work on the task.", steps=("work on the task",))

#: What the scripted lead answers to a question from a sub-agent.
LEAD_ANSWER = "Keep it simple: reuse what exists and report any blocker to me."

#: A directive line in a task or in a message to the scripted lead: ``@tool_name {json args}``.
#: The scripted models turn each into one tool call, so the demo and the tests can script
#: exactly which tools an agent calls (a real model reads the same text as plain instructions).
_DIRECTIVE = re.compile(r"^@([a-z_]+)\s*(\{.*\})?\s*$")
#: A directive with no tool behind it: keep checking in until a question arrived and was answered.
AWAIT_QUESTION = "await_question"
#: Words in a message that ask a scripted sub-agent to wrap up (as a ``notice`` does).
_WRAP_UP = "wrap up"


def directives(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The ``@tool {json}`` lines of a text, in order (malformed ones are ignored)."""
    found: list[tuple[str, dict[str, Any]]] = []
    for line in text.splitlines():
        match = _DIRECTIVE.match(line.strip())
        if match is None:
            continue
        try:
            args = json.loads(match.group(2)) if match.group(2) else {}
        except (ValueError, RecursionError):
            continue
        if isinstance(args, dict):
            found.append((match.group(1), args))
    return found


def directive(tool: str, **arguments: Any) -> str:
    """One directive line (the inverse of :func:`directives` for one call)."""
    return f"@{tool} {json.dumps(arguments, ensure_ascii=False)}"


@dataclass(kw_only=True)
class _Job:
    """What a sub-agent is working on, rebuilt from its transcript on every call."""

    task: str
    planned: int  # do_work calls the plan needs (before steering)
    from_task: bool  # a task (or a first message) started it: only those await guidance
    directives: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    directives_done: set[int] = field(default_factory=set)
    done: int = 0  # do_work calls made
    answered_in_job: int = 0  # questions of others answered during this job
    guidance: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)  # answers received to its own asks
    wrap_up: bool = False


def _first_line(text: str, limit: int = 80) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _envelope(entry: dict[str, Any]) -> formats.Envelope | None:
    return _parsed(str(entry.get("content") or ""))


@lru_cache(maxsize=8192)
def _parsed(content: str) -> formats.Envelope | None:
    """A scripted model reads its whole request at every call; the entries it reads again are
    the same texts (a string keeps its hash), so each is parsed once."""
    try:
        return formats.parse(content)
    except ValueError:
        return None


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _tool_names(tools: list[dict[str, Any]]) -> set[str]:
    return {str(t.get("function", {}).get("name")) for t in tools}


class ScriptedModel:
    """A deterministic model for one agent.

    Sub-agent script (reacting to what was drained since its last reply):

    - a question asked of it (``ask``) is answered first, with ``answer_other_agent`` (the
      answer takes ``write_seconds`` to write);
    - a ``task`` (or a message when it has no job) starts a job: first the task's directive
      lines (``@tool {json}``, one tool call each, e.g. ``@ask_master {...}``), then the role's
      ``do_work`` steps; the first reply carries text (sent to the lead as progress output);
    - a ``message``/``answer`` while a job runs is guidance: acknowledged in text with one more
      step that acts on it (several drained at once: one step);
    - a ``notice``, or a message saying "wrap up", while a job runs means "wrap up": the next
      reply is final;
    - when the plan is done the final reply (no tool calls) takes ``write_seconds`` to "write",
      like a streamed answer; it becomes the completion report.

    Lead script: the directive lines of the messages it was sent become tool calls (a batch);
    questions from sub-agents are answered with ``answer_sub_agent_question``; otherwise it
    acknowledges what it read and calls no tool.
    """

    def __init__(
        self, *, script: RoleScript | None, name: str = "agent", write_seconds: float = 0.0
    ) -> None:
        self.script = script  # None: the lead
        self.name = name
        self.write_seconds = write_seconds
        self.calls = 0

    @classmethod
    def for_agent(cls, agent: Agent, *, write_seconds: float = 0.0) -> ScriptedModel:
        script = None if agent.is_lead else ROLE_SCRIPTS.get(agent.role, DEFAULT_SCRIPT)
        return cls(script=script, name=agent.display_name, write_seconds=write_seconds)

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.calls += 1
        if self.script is None:
            return self._lead_reply(messages, tools)
        return self._sub_agent_reply(self.script, messages, tools)

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _fresh(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Entries after the last assistant reply (tool results and drained messages)."""
        fresh: list[dict[str, Any]] = []
        for entry in reversed(messages):
            if entry.get("role") == "assistant":
                break
            fresh.append(entry)
        fresh.reverse()
        return fresh

    @staticmethod
    def _open_questions(messages: list[dict[str, Any]]) -> list[formats.Envelope]:
        """Questions asked of this agent that it has not answered yet, in arrival order."""
        asked: list[formats.Envelope] = []
        answered: set[int] = set()
        for entry in messages:
            if entry.get("role") == "user":
                env = _envelope(entry)
                if env is not None and env.type is MessageType.ASK and env.question_id:
                    asked.append(env)
            elif entry.get("role") == "assistant":
                for call in entry.get("tool_calls") or []:
                    if call["function"]["name"] in ANSWER_TOOLS:
                        try:
                            answered.add(
                                int(json.loads(call["function"]["arguments"])["question_id"])
                            )
                        except (ValueError, KeyError, TypeError, RecursionError):
                            continue
        return [q for q in asked if q.question_id not in answered]

    def _lead_reply(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        fresh = self._fresh(messages)
        available = _tool_names(tools)
        position = len(messages)
        calls: list[dict[str, Any]] = []
        read: list[formats.Envelope] = []
        for entry in fresh:
            env = _envelope(entry) if entry.get("role") == "user" else None
            if env is None:
                continue
            read.append(env)
            if env.type in (MessageType.TASK, MessageType.MESSAGE):
                for name, args in directives(env.content):
                    calls.append(_call(f"lead_{position}_{len(calls)}", name, args))
        if "answer_sub_agent_question" in available:
            for question in self._open_questions(messages):
                calls.append(
                    _call(
                        f"lead_{position}_{len(calls)}",
                        "answer_sub_agent_question",
                        {"question_id": question.question_id, "answer": LEAD_ANSWER},
                    )
                )
        if calls:
            return {"role": "assistant", "content": None, "tool_calls": calls}
        results = [e for e in fresh if e.get("role") == "tool"]
        if results:
            failed = sum('"ok": false' in str(e.get("content")) for e in results)
            return {
                "role": "assistant",
                "content": f"Done: {len(results)} tool call(s), {failed} refused.",
            }
        if not read:
            return {"role": "assistant", "content": "Standing by."}
        senders = sorted({env.sender for env in read})
        return {
            "role": "assistant",
            "content": f"Noted {len(read)} update(s) from {', '.join(senders)}.",
        }

    @staticmethod
    def _job(script: RoleScript, messages: list[dict[str, Any]]) -> _Job | None:
        job: _Job | None = None
        for entry in messages:
            role = entry.get("role")
            if role == "assistant":
                calls = entry.get("tool_calls") or []
                if job is None:
                    continue
                if not calls:
                    job = None  # a reply without tool calls ends the job
                    continue
                for call in calls:
                    kind, _, index = str(call["id"]).rpartition("_")[2].partition(":")
                    if kind == "w":
                        job.done += 1
                    elif kind == "d":
                        job.directives_done.add(int(index))
                    elif kind == "a":
                        job.answered_in_job += 1
                continue
            if role == "tool":
                env = _envelope(entry)
                if job is not None and env is not None and env.type is not MessageType.ASK:
                    job.answers.append(f"{env.sender}: {_first_line(env.content)}")
                continue
            if role != "user":
                continue
            env = _envelope(entry)
            kind = env.type if env is not None else MessageType.TASK  # plain user text: a task
            content = env.content if env is not None else str(entry.get("content") or "")
            starts = kind is MessageType.TASK or (kind is MessageType.MESSAGE and job is None)
            if starts:
                if job is None:
                    job = _Job(task=content, planned=len(script.steps), from_task=True)
                else:
                    job.planned += len(script.steps)
                job.directives.extend(directives(content))
            elif kind is MessageType.ASK and job is None:
                job = _Job(task=f"answer {content}", planned=0, from_task=False)
            elif kind in (MessageType.MESSAGE, MessageType.ANSWER) and job is not None:
                if _WRAP_UP in content.lower():
                    job.wrap_up = True
                else:
                    job.guidance.append(content)
            elif kind is MessageType.NOTICE and job is not None:
                job.wrap_up = True
        return job

    def _sub_agent_reply(
        self, script: RoleScript, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        position = len(messages)
        available = _tool_names(tools)
        questions = self._open_questions(messages)
        job = self._job(script, messages)
        if questions and "answer_other_agent" in available:
            q = questions[0]
            # Writing an answer takes a while too: the asker stays waiting on a running agent
            # for at least that long, long enough to be seen by `agent-router status`.
            time.sleep(self.write_seconds)
            return {
                "role": "assistant",
                "content": f"Answering {q.sender}'s question {q.question_id}.",
                "tool_calls": [
                    _call(
                        f"call_{position}_a:{q.question_id}",
                        "answer_other_agent",
                        {"question_id": q.question_id, "answer": script.answer},
                    )
                ],
            }
        if job is None:
            return {"role": "assistant", "content": "Nothing new to work on; standing by."}
        fresh = [
            env for e in self._fresh(messages) if e.get("role") == "user" and (env := _envelope(e))
        ]
        if not job.wrap_up:
            step = self._directive_step(script, job, position, first=not job.done)
            if step is not None:
                return step
        can_work = WORK_TOOL in available
        fresh_guidance = [
            e.content
            for e in fresh
            if e.type in (MessageType.MESSAGE, MessageType.ANSWER)
            and _WRAP_UP not in e.content.lower()
            and e.content in job.guidance
        ]
        waiting = (
            script.await_guidance
            and job.from_task
            and not job.guidance
            and job.done < script.patience
        )
        # Fresh guidance always gets one step that acts on it, however far the plan got.
        more = waiting or job.done < job.planned or bool(fresh_guidance)
        if can_work and not job.wrap_up and more:
            return self._work_step(script, job, fresh_guidance, waiting, position)
        return self._final(job)

    def _directive_step(
        self, script: RoleScript, job: _Job, position: int, *, first: bool
    ) -> dict[str, Any] | None:
        """The next directive of the task as a tool call (``await_question``: a check-in)."""
        for i, (name, args) in enumerate(job.directives):
            if i in job.directives_done:
                continue
            if name == AWAIT_QUESTION:
                if job.answered_in_job or job.done >= script.patience:
                    continue  # satisfied (or gave up waiting)
                call = _call(
                    f"call_{position}_w:{job.done}",
                    WORK_TOOL,
                    {"step": f"check in (waiting for a question, check {job.done})"},
                )
            else:
                call = _call(f"call_{position}_d:{i}", name, args)
            text = script.opening if first and not job.directives_done else None
            return {"role": "assistant", "content": text, "tool_calls": [call]}
        return None

    def _work_step(
        self,
        script: RoleScript,
        job: _Job,
        fresh_guidance: list[str],
        waiting: bool,
        position: int,
    ) -> dict[str, Any]:
        n = job.done
        if fresh_guidance:
            step = f"adjust the plan: {_first_line(fresh_guidance[-1], 60)}"
            text: str | None = f"Understood: {_first_line(fresh_guidance[-1])}. Adjusting the plan."
        elif n == 0 and not job.directives_done:
            step = script.steps[0] if script.steps else "work on the task"
            text = script.opening
        else:
            step = script.steps[n % len(script.steps)] if script.steps else "work on the task"
            if waiting:
                step = f"{step} (waiting for the lead's review, check {n})"
            text = None  # plain tool calls between the milestones: no progress chatter
        # The transcript only grows, so its length makes the id unique within it; the suffix
        # tells the script what kind of call it was when it reads the transcript again.
        call = _call(f"call_{position}_w:{n}", WORK_TOOL, {"step": step})
        return {"role": "assistant", "content": text, "tool_calls": [call]}

    def _final(self, job: _Job) -> dict[str, Any]:
        # Writing the final answer takes a while, as a streamed answer does: a message that
        # arrives now lands after the last drain and must be picked up by a follow-up turn.
        time.sleep(self.write_seconds)
        text = f"Done: {_first_line(job.task)}"
        if job.answers:
            text += f" (told by {job.answers[-1]})"
        if job.guidance:
            text += f" (following the guidance: {_first_line(job.guidance[-1])})"
        if job.wrap_up:
            text += " Wrapped up early as asked."
        return {"role": "assistant", "content": text}


#: The tools with which an agent answers a question (scripted agents track them).
ANSWER_TOOLS = frozenset({"answer_other_agent", "answer_sub_agent_question"})
