"""What the loop does when a turn is about to end in a way a real model often gets wrong.

A reply without tool calls ends the turn. Before it does, the loop checks three things and, once
per kind and turn, sends the agent a ``notice`` from ``system`` (routed like any message, so it
is durable, ledgered and drained before the next model call) and calls the model again:

- a question addressed to the agent is still open: the notice names each one, its asker and how
  to answer it;
- the text holds a tool call written out as text (``create_sub_agent({...})``, a JSON object
  naming a tool, a ``<tool_call>`` block): nothing happened, the notice says how to call it;
- the text announces an action ("I'll create a UI Operator ...") but called no tool.

If the turn still ends in text while exactly one question is open (one the model has read), that
text is delivered to the asker as the answer (an ``answer`` message with the dedup key
``prose-answer:<turn>:<question>`` in the ledger), so that a model that answers in prose never
leaves its asker waiting: a NUL in it becomes U+FFFD, and one larger than a message arrives in
parts, the first the answer, the others messages that follow it.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Collection
from typing import Any

from agent_router import errors, formats
from agent_router import validation as check
from agent_router.agents import lookup
from agent_router.domain import Agent, MessageType, Question
from agent_router.logfields import get_logger
from agent_router.router import Router
from agent_router.turn import Turn

logger = get_logger(__name__)


class Nudge(enum.StrEnum):
    """Why a turn that was about to end got one more model call."""

    OPEN_QUESTIONS = "open_questions"
    WRITTEN_TOOL_CALL = "written_tool_call"
    ANNOUNCED_ACTION = "announced_action"


def open_questions(router: Router, agent: Agent) -> list[Question]:
    """Open questions addressed to ``agent``, with their askers' display names (``asker``)."""
    return lookup.open_questions_to(router, agent.team_id, agent.id)


_ANNOUNCED = re.compile(
    r"\b(?:I'll|I will|I am going to|I'm going to|let me|I shall|next,? I)\s+(?:now\s+|first\s+)?"
    r"(?:create|spin up|set up|start|send|ask|answer|wait|delegate|assign|message|stop|"
    r"terminate|call|use|hand)\b",
    re.IGNORECASE,
)
_TOOL_BLOCK = re.compile(r"<\s*/?\s*(?:tool_call|function_call|tool_use)\b", re.IGNORECASE)


def written_tool_calls(text: str, tool_names: Collection[str]) -> list[str]:
    """The tools ``text`` writes out as calls instead of calling them, in order."""
    found = []
    for name in tool_names:
        escaped = re.escape(name)
        as_call = re.search(rf"\b{escaped}\s*\(", text)
        as_json = re.search(rf"""["']{escaped}["']""", text) and re.search(r"[{:]", text)
        if as_call or as_json:
            found.append(name)
    if not found and _TOOL_BLOCK.search(text):
        found.append("a <tool_call> block")
    return found


def announces_action(text: str) -> bool:
    return bool(_ANNOUNCED.search(text))


def nudge_for(
    text: str, questions: list[Question], tool_names: Collection[str], given: set[Nudge]
) -> tuple[Nudge, str] | None:
    """The reminder a turn ending with ``text`` gets, if any (one per kind and turn)."""
    if questions and Nudge.OPEN_QUESTIONS not in given:
        return Nudge.OPEN_QUESTIONS, _questions_text(questions, tool_names)
    written = written_tool_calls(text, tool_names)
    if written and Nudge.WRITTEN_TOOL_CALL not in given:
        return Nudge.WRITTEN_TOOL_CALL, (
            f"Your last reply wrote a tool call as text ({', '.join(written)}) and called no "
            "tool, so nothing happened. Call the tool through the tools interface, not in your "
            "text. If you are done, reply with your final answer and call no tool."
        )
    if announces_action(text) and Nudge.ANNOUNCED_ACTION not in given:
        return Nudge.ANNOUNCED_ACTION, (
            "Your last reply says what you will do next but called no tool, so nothing "
            "happened and your turn was about to end. If you meant to act, call the tool now. "
            "If you are done, reply with your final answer and call no tool."
        )
    return None


def _questions_text(questions: list[Question], tool_names: Collection[str]) -> str:
    tool = next(
        (t for t in ("answer_sub_agent_question", "answer_other_agent") if t in tool_names),
        "the answer tool",
    )
    listed = "; ".join(f"question {q.id} from {q.asker}" for q in questions)
    example = json.dumps({"question_id": questions[0].id, "answer": "..."})
    return (
        f"Your turn was about to end with {len(questions)} open question(s) addressed to you: "
        f"{listed}. The asker waits until you answer; text you write does not reach it. Answer "
        f"each with {tool}({example}), using the question_id of the question (not its "
        "message_id)."
    )


def _has_read(transcript: list[dict[str, Any]], question_id: int) -> bool:
    # Newest first, and only entries that name the question are parsed: the question is most
    # often recent, and a long transcript is not read whole at every turn's end.
    named = f'question_id="{question_id}"'
    for entry in reversed(transcript):
        if entry.get("role") != "user" or named not in str(entry.get("content") or ""):
            continue
        try:
            env = formats.parse(str(entry.get("content") or ""))
        except ValueError:
            continue
        if env.type is MessageType.ASK and env.question_id == question_id:
            return True
    return False


def remind(router: Router, turn: Turn, nudge: Nudge, text: str, step: int) -> None:
    """Send the reminder; the loop drains it before its next model call."""
    logger.info(
        "turn reminded",
        extra={"action": "turn_reminded", "nudge": nudge.value, "turn_id": turn.id},
    )
    notice(router, turn, text, f"reminder:{turn.id}:{step}")


def notice(
    router: Router, turn: Turn, text: str, key: str, *, to: str | None = None, wake: bool = True
) -> None:
    """A ``notice`` from ``system`` to ``to`` (default: the turn's own agent), routed like any
    message; its dedup ``key`` keeps a retried turn from sending it twice."""
    router.send(
        turn.team_id,
        to=to or turn.display_name,
        content=text,
        sender="system",
        type=MessageType.NOTICE,
        wake=wake,
        dedup_key=key,
    )


def answer_in_prose(
    router: Router,
    turn: Turn,
    question: Question,
    text: str,
    read: list[dict[str, Any]],
) -> None:
    """Deliver a turn's final text as the answer to the one question left open, if the model
    had read that question (``read``: the transcript its last request was built from): text
    written before a question arrived answers nothing."""
    if not text.strip() or not _has_read(read, question.id):
        return
    key = f"prose-answer:{turn.id}:{question.id}"
    # Whatever the model wrote arrives: a NUL becomes U+FFFD, and an answer larger than a
    # message is its first part; the other parts follow it, as messages to the asker.
    first, *rest = formats.report_parts(check.scrub(text), router.settings.max_content_bytes)
    try:
        router.send(
            turn.team_id,
            to=question.asker,
            content=first,
            sender=turn.display_name,
            type=MessageType.ANSWER,
            question_id=question.id,
            dedup_key=key if not rest else f"{key}:1",
        )
    except errors.RefusedError as exc:  # closed meanwhile (answered, expired, cancelled)
        logger.info(
            "prose answer not delivered", extra={"action": "prose_answer", "error": str(exc)}
        )
        return
    for number, part in enumerate(rest, 2):
        router.send(
            turn.team_id,
            to=question.asker,
            content=part,
            sender=turn.display_name,
            type=MessageType.MESSAGE,
            dedup_key=f"{key}:{number}",
        )
    logger.info(
        "final text delivered as the answer",
        extra={"action": "prose_answer", "question_id": question.id, "turn_id": turn.id},
    )
