"""What a model is sent when the transcript outgrows its window: token counts and compaction.

**Counting.** With ``tiktoken`` installed (the ``tokens`` extra) and an encoding it knows for the
model, texts are counted with the model's own tokenizer. Otherwise the count is an estimate: one
token per 4 ASCII characters plus one per other character (CJK text runs near one token per
character), and 4 tokens of framing per message. The estimate errs high on plain English, which
keeps a compacted request under the window.

**Compaction** (:func:`compact`) is a pure function from the OpenAI message list to a shorter one;
the stored transcript never changes, only the request does. Messages are grouped into units: an
assistant message with tool calls together with exactly its tool results (they are kept or left
out together, so every ``tool_calls`` message is still followed by exactly its results), any other
message alone. Kept verbatim: the system prompt, the first task, the newest ``keep_recent`` units
and every question asked of the agent that it has not answered yet. Older units are shortened
first (long tool results, progress outputs and assistant texts cut to a head with a note saying
how much was left out), oldest first, until the request fits; if it still does not fit, whole
older units are left out, oldest first, and one note says how many.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from agent_router import formats
from agent_router.domain import MessageSubtype, MessageType

logger = logging.getLogger(__name__)

#: Counts the tokens of one text.
TokenCounter = Callable[[str], int]

#: Framing tokens per message (role, separators), as the Chat Completions format adds them.
MESSAGE_OVERHEAD = 4

#: The tools that answer a question asked of the agent: their calls close it.
_ANSWER_TOOLS = frozenset({"answer_other_agent", "answer_sub_agent_question"})


def estimate_tokens(text: str) -> int:
    """The documented estimate: one token per 4 ASCII characters, one per other character."""
    ascii_chars = sum(1 for c in text if c < "\x80")
    return (ascii_chars + 3) // 4 + (len(text) - ascii_chars)


@lru_cache(maxsize=32)
def token_counter(model: str | None) -> TokenCounter:
    """The model's tokenizer when ``tiktoken`` has one for it, else :func:`estimate_tokens`."""
    if model:
        try:
            import tiktoken

            encoding = tiktoken.encoding_for_model(model)
        except Exception:  # not installed, unknown model, or its encoding cannot be loaded
            logger.debug("no tokenizer for %s: estimating", model)
        else:
            return lambda text: len(encoding.encode(text, disallowed_special=()))
    return estimate_tokens


def message_tokens(message: dict[str, Any], count: TokenCounter = estimate_tokens) -> int:
    tokens = MESSAGE_OVERHEAD + count(str(message.get("content") or ""))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        arguments = function.get("arguments") or ""
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        tokens += MESSAGE_OVERHEAD + count(str(function.get("name") or "")) + count(arguments)
    return tokens


def count_tokens(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] = (),
    count: TokenCounter = estimate_tokens,
) -> int:
    """Tokens of a request: its messages and its tool schemas."""
    total = sum(message_tokens(m, count) for m in messages)
    if tools:
        total += count(json.dumps(list(tools), ensure_ascii=False))
    return total


@dataclass(frozen=True, kw_only=True)
class Compaction:
    """How hard :func:`compact` works. :data:`TIGHT` is the retry after a server said the
    request was too long."""

    keep_recent: int = 8  # newest units kept verbatim
    shorten_to: int = 600  # characters an older long text keeps


NORMAL = Compaction()
TIGHT = Compaction(keep_recent=3, shorten_to=160)


def compact(
    messages: Sequence[dict[str, Any]],
    *,
    limit: int,
    count: TokenCounter = estimate_tokens,
    how: Compaction = NORMAL,
) -> list[dict[str, Any]]:
    """``messages`` shortened to at most ``limit`` tokens where the rules allow (see the module
    docstring); the input is not modified. A request that fits is returned unchanged (a copy)."""
    sizes = [message_tokens(m, count) for m in messages]
    total = sum(sizes)
    out = [dict(m) for m in messages]
    if total <= limit:
        return out
    units = _units(out)
    pinned = _pinned(out, units, how.keep_recent)
    older = [u for i, u in enumerate(units) if i not in pinned]
    for unit in older:
        for index in unit:
            shorter = _shortened(out[index], how.shorten_to)
            if shorter is not None:
                out[index] = shorter
                new_size = message_tokens(shorter, count)
                total += new_size - sizes[index]
                sizes[index] = new_size
        if total <= limit:
            return out
    left_out: set[int] = set()
    for unit in older:
        left_out.update(unit)
        total -= sum(sizes[i] for i in unit)
        if total + MESSAGE_OVERHEAD + 40 <= limit:
            break
    fewer = _without(out, left_out)
    # The notes cost tokens too: leaving out only short messages may not pay for them.
    return fewer if sum(message_tokens(m, count) for m in fewer) < sum(sizes) else out


def _units(messages: list[dict[str, Any]]) -> list[list[int]]:
    """Indices grouped: an assistant message with tool calls and the tool results that follow
    it form one unit; every other message is its own."""
    units: list[list[int]] = []
    i = 0
    while i < len(messages):
        unit = [i]
        if messages[i].get("role") == "assistant" and messages[i].get("tool_calls"):
            while i + 1 < len(messages) and messages[i + 1].get("role") == "tool":
                i += 1
                unit.append(i)
        units.append(unit)
        i += 1
    return units


def _pinned(messages: list[dict[str, Any]], units: list[list[int]], keep_recent: int) -> set[int]:
    """Units never shortened: system prompts, the first task, the newest, open questions."""
    pinned = set(range(max(0, len(units) - keep_recent), len(units)))
    first_user = True
    open_questions = _open_question_ids(messages)
    for n, unit in enumerate(units):
        message = messages[unit[0]]
        role = message.get("role")
        if role in ("system", "developer"):
            pinned.add(n)
        elif role == "user":
            if first_user:
                pinned.add(n)
                first_user = False
            env = _envelope(message)
            if env is not None and env.question_id in open_questions:
                pinned.add(n)
    return pinned


def _open_question_ids(messages: list[dict[str, Any]]) -> set[int]:
    """Questions asked of this agent (``ask`` envelopes) that none of its answer calls closed."""
    asked: set[int] = set()
    answered: set[int] = set()
    for message in messages:
        if message.get("role") == "user":
            env = _envelope(message)
            if env is not None and env.type is MessageType.ASK and env.question_id is not None:
                asked.add(env.question_id)
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            if function.get("name") in _ANSWER_TOOLS:
                try:
                    answered.add(int(json.loads(function.get("arguments") or "{}")["question_id"]))
                except (ValueError, KeyError, TypeError, RecursionError):
                    continue
    return asked - answered


def _envelope(message: dict[str, Any]) -> formats.Envelope | None:
    try:
        return formats.parse(str(message.get("content") or ""))
    except ValueError:
        return None


def _cut(text: str, keep: int) -> str | None:
    if len(text) <= keep + 80:  # cutting would save less than the note costs
        return None
    return (
        f"{text[:keep]}\n[{len(text) - keep} more characters left out of this request to fit "
        "the context window]"
    )


def _shortened(message: dict[str, Any], keep: int) -> dict[str, Any] | None:
    """A shorter copy of an older message, or ``None`` when it is short or must stay whole."""
    content = message.get("content")
    if not isinstance(content, str):
        return None
    role = message.get("role")
    env = _envelope(message) if role in ("user", "tool") else None
    if env is not None:
        progress = env.subtype is MessageSubtype.PROGRESS_OUTPUT
        if role == "user" and not progress:
            return None  # whole messages of others are left out whole, never cut
        cut = _cut(env.content, keep)
        if cut is None:
            return None
        return message | {"content": formats.render(replace(env, content=cut))}
    if role not in ("tool", "assistant"):
        return None
    output = _tool_output(content) if role == "tool" else None
    if output is not None:  # the fence stays whole around what is kept of the output
        cut = _cut(output.content, keep)
        return (
            None
            if cut is None
            else message | {"content": formats.fence(replace(output, content=cut))}
        )
    cut = _cut(content, keep)
    return None if cut is None else message | {"content": cut}


def _tool_output(content: str) -> formats.ToolOutput | None:
    try:
        return formats.parse_fence(content)
    except ValueError:
        return None


def _without(messages: list[dict[str, Any]], left_out: set[int]) -> list[dict[str, Any]]:
    """``messages`` less ``left_out``; each run of left-out messages becomes one note."""
    out: list[dict[str, Any]] = []
    run = 0
    for i, message in enumerate([*messages, None]):
        if i in left_out:
            run += 1
            continue
        if run:
            out.append(
                {
                    "role": "user",
                    "content": f"[{run} earlier messages of this conversation are left out of "
                    "this request to fit the context window]",
                }
            )
            run = 0
        if message is not None:
            out.append(message)
    return out


def pairing_holds(messages: Sequence[dict[str, Any]]) -> bool:
    """Every assistant ``tool_calls`` message is followed by exactly its tool results, and every
    tool result follows the call it answers."""
    i = 0
    while i < len(messages):
        message = messages[i]
        if message.get("role") == "tool":
            return False
        calls = message.get("tool_calls") or () if message.get("role") == "assistant" else ()
        expected = [c.get("id") for c in calls]
        results = []
        while i + 1 < len(messages) and messages[i + 1].get("role") == "tool":
            i += 1
            results.append(messages[i].get("tool_call_id"))
        if sorted(map(str, results)) != sorted(map(str, expected)):
            return False
        i += 1
    return True


__all__ = [
    "NORMAL",
    "TIGHT",
    "Compaction",
    "TokenCounter",
    "compact",
    "count_tokens",
    "estimate_tokens",
    "message_tokens",
    "pairing_holds",
    "token_counter",
]
