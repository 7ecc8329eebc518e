"""The model an agent loop calls, and a deterministic stand-in for it.

A model is anything with ``complete(messages, tools) -> assistant message`` in the OpenAI chat
format. :class:`ScriptedModel` needs no network and no key: its reply is a pure function of the
transcript it is given (plus a configurable "writing" delay), so a turn that runs in another
process, or is retried, behaves the same. That is what the demo and the tests drive.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent_router import formats
from agent_router.domain import Agent, MessageType

logger = logging.getLogger(__name__)

#: The built-in work tool the scripted sub-agents call (registered in :mod:`agent_router.tools`).
WORK_TOOL = "do_work"


class Model(Protocol):
    """One model call: the transcript so far and the tool schemas in, one assistant message out
    (``{"role": "assistant", "content": str | None, "tool_calls": [...]}``)."""

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]: ...


#: Picks the model for an agent (a host may give the lead a bigger model than its sub-agents).
ModelFactory = Callable[[Agent], Model]


@dataclass(frozen=True, kw_only=True)
class RoleScript:
    """How a scripted sub-agent of one role works a task.

    ``steps`` are ``do_work`` calls made one per model call. With ``await_guidance`` the agent
    keeps checking in (one ``do_work`` per model call, at most ``patience`` of them) until the
    lead steers it or tells it to wrap up: a task that deliberately runs long, so that a message
    can reach it while it is running (seed 3.1).
    """

    opening: str
    steps: tuple[str, ...]
    await_guidance: bool = False
    patience: int = 40


#: The seed's team. Unknown roles get :data:`DEFAULT_SCRIPT`.
ROLE_SCRIPTS: dict[str, RoleScript] = {
    "UI Operator": RoleScript(
        opening="Next I will create a new API for the login form.",
        steps=("survey the existing UI code",),
        await_guidance=True,
    ),
    "Full-Stack Engineer": RoleScript(
        opening="Next I will design the change and implement it.",
        steps=("design the change", "implement and test it"),
    ),
}
DEFAULT_SCRIPT = RoleScript(opening="Next I will work on the task.", steps=("work on the task",))


@dataclass(kw_only=True)
class _Job:
    """What a sub-agent is working on, rebuilt from its transcript on every call."""

    task: str
    planned: int  # do_work calls the plan needs (before steering)
    from_task: bool  # a `task` started it (only those await guidance)
    done: int = 0
    guidance: list[str] = field(default_factory=list)
    wrap_up: bool = False


def _first_line(text: str, limit: int = 80) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _envelope(entry: dict[str, Any]) -> formats.Envelope | None:
    try:
        return formats.parse(str(entry.get("content") or ""))
    except ValueError:
        return None


class ScriptedModel:
    """A deterministic model for one agent.

    Sub-agent script (reacting to what was drained since its last reply):

    - a ``task`` starts a job (or extends the running one) worked through ``do_work`` calls; the
      first reply carries text (sent to the lead as progress output) along with its tool call;
    - a ``message``/``answer`` while a job runs is guidance: acknowledged in text with one more
      step that acts on it (several drained at once: one step);
      with no job running it is a small job of one step;
    - a ``notice`` from the lead while a job runs means "wrap up": the next reply is final;
    - when the plan is done the final reply (no tool calls) takes ``write_seconds`` to "write",
      like a streamed answer; it becomes the completion report.

    Lead script: acknowledge what was drained, never call a tool (issue 5 gives the lead tools).
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
        fresh = self._fresh(messages)
        if self.script is None:
            return self._lead_reply(fresh)
        return self._sub_agent_reply(self.script, messages, fresh, tools)

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _fresh(messages: list[dict[str, Any]]) -> list[formats.Envelope]:
        """Routed messages that arrived after the last assistant reply."""
        fresh: list[formats.Envelope] = []
        for entry in reversed(messages):
            if entry.get("role") == "assistant":
                break
            if entry.get("role") == "user" and (env := _envelope(entry)) is not None:
                fresh.append(env)
        fresh.reverse()
        return fresh

    @staticmethod
    def _lead_reply(fresh: list[formats.Envelope]) -> dict[str, Any]:
        if not fresh:
            return {"role": "assistant", "content": "Standing by."}
        senders = sorted({env.sender for env in fresh})
        return {
            "role": "assistant",
            "content": f"Noted {len(fresh)} update(s) from {', '.join(senders)}.",
        }

    @staticmethod
    def _job(script: RoleScript, messages: list[dict[str, Any]]) -> _Job | None:
        job: _Job | None = None
        for entry in messages:
            role = entry.get("role")
            if role == "assistant":
                calls = entry.get("tool_calls") or []
                if job is not None:
                    if calls:
                        job.done += len(calls)
                    else:
                        job = None  # a reply without tool calls ends the job
                continue
            if role != "user":
                continue
            env = _envelope(entry)
            kind = env.type if env is not None else MessageType.TASK  # plain user text: a task
            content = env.content if env is not None else str(entry.get("content") or "")
            if kind is MessageType.TASK:
                if job is None:
                    job = _Job(task=content, planned=len(script.steps), from_task=True)
                else:
                    job.planned += len(script.steps)
            elif kind in (MessageType.MESSAGE, MessageType.ANSWER):
                if job is None:
                    job = _Job(task=content, planned=1, from_task=False)
                else:
                    job.guidance.append(content)
            elif kind is MessageType.NOTICE and job is not None:
                job.wrap_up = True
        return job

    def _sub_agent_reply(
        self,
        script: RoleScript,
        messages: list[dict[str, Any]],
        fresh: list[formats.Envelope],
        tools: list[dict[str, Any]],
    ) -> dict[str, Any]:
        job = self._job(script, messages)
        if job is None:
            return {"role": "assistant", "content": "Nothing new to work on; standing by."}
        can_work = any(t.get("function", {}).get("name") == WORK_TOOL for t in tools)
        fresh_guidance = [
            e.content for e in fresh if e.type in (MessageType.MESSAGE, MessageType.ANSWER)
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
            return self._work_step(script, job, fresh_guidance, waiting, len(messages))
        return self._final(job)

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
        elif n == 0:
            step = script.steps[0] if script.steps else "work on the task"
            text = script.opening
        else:
            step = script.steps[n % len(script.steps)] if script.steps else "work on the task"
            if waiting:
                step = f"{step} (waiting for the lead's review, check {n})"
            text = None  # plain tool calls between the milestones: no progress chatter
        call = {
            # The transcript only grows, so its length makes the id unique within it.
            "id": f"call_{position}_{n}",
            "type": "function",
            "function": {"name": WORK_TOOL, "arguments": json.dumps({"step": step})},
        }
        return {"role": "assistant", "content": text, "tool_calls": [call]}

    def _final(self, job: _Job) -> dict[str, Any]:
        # Writing the final answer takes a while, as a streamed answer does: a message that
        # arrives now lands after the last drain and must be picked up by a follow-up turn.
        if self.write_seconds:
            time.sleep(self.write_seconds)
        text = f"Done: {_first_line(job.task)}"
        if job.guidance:
            text += f" (following the guidance: {_first_line(job.guidance[-1])})"
        if job.wrap_up:
            text += " Wrapped up early as asked."
        return {"role": "assistant", "content": text}
