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
    if text.isascii():
        return (len(text) + 3) // 4
    ascii_chars = len(text.encode("ascii", "ignore"))
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


#: A request kept near its target is cut down to this share of it, so that it then grows for a
#: while before the next cut: what is left out changes in steps, not at every model call.
LOW_WATER = 0.6

#: The note that stands for what a request near its target leaves out.
WINDOW_NOTE = (
    "[{n} earlier messages of this conversation are left out of this request to keep it near "
    "{target} tokens; the transcript keeps them all. Still here: your instructions, your first "
    "task, the questions asked of you that are still open, and the latest messages.]"
)


@dataclass(frozen=True, kw_only=True)
class WindowRequest:
    """The transcript's part of one request (:meth:`ContextWindow.request`)."""

    messages: list[dict[str, Any]]  # assistant replies quoted as the model reads them back
    tokens: int  # their estimated tokens (:func:`message_tokens`)
    left_out: int  # transcript entries not in it
    moved: bool  # what is left out changed since the window's last request


class ContextWindow:
    """An agent's request kept near a target size, built from its transcript one entry at a
    time: a model call costs the entries appended since the last one, not the whole history.

    Each entry is counted (:func:`estimate_tokens`) and quoted as the model reads it back
    (:func:`agent_router.formats.quote_reply`) once, when it arrives. After each entry, when
    the request it would make passes ``budget`` tokens (the target less the protocol section
    and the tool schemas), the cut moves forward over whole units (an assistant message with
    its tool results, or one message alone) until the request is at most :data:`LOW_WATER`
    of the budget, never past the newest ``keep_recent`` units. A request is then: the
    leading system prompt and the first task, one note saying how many earlier messages are
    left out (:data:`WINDOW_NOTE`), every question asked of the agent that it has not
    answered, and everything from the cut on. The cut only moves forward, and it is a
    function of the transcript, so another process that builds the window from the same
    entries reaches the same one. ``budget`` ``None``: nothing is left out.
    """

    def __init__(self, *, target: int | None, budget: int | None, keep_recent: int = 8) -> None:
        self.target = target
        self.budget = budget
        self.keep_recent = keep_recent
        self.quoted: list[dict[str, Any]] = []
        self.tokens: list[int] = []
        self._prefix = [0]  # tokens of the entries before each index
        self._starts: list[int] = []  # where each unit starts
        self._head: list[int] = []  # the leading system entries and the first user message
        self._leading = True
        self._tool_unit = False  # the last unit is an assistant's tool calls: results join it
        self._open: dict[int, int] = {}  # open question id -> index of its ask
        self._answered: set[int] = set()
        self.call_ids: set[str] = set()  # every tool call id of the transcript
        self.cut = 0  # the first entry of the transcript's tail
        self._cut_unit = 0
        self._reported = 0  # the cut of the last request
        self._note = message_tokens({"content": WINDOW_NOTE.format(n=10**6, target=target)})

    def __len__(self) -> int:
        return len(self.quoted)

    def extend(self, entries: Sequence[dict[str, Any]], *, quiet: bool = False) -> None:
        """Take in the entries past those it holds (``entries``: the whole transcript).
        ``quiet``: what the cut does now was already reported (a window built again from
        a transcript other requests were made of)."""
        for entry in entries[len(self.quoted) :]:
            self._add(entry)
            self._fit()
        if quiet:
            self._reported = self.cut

    def continue_from(self, other: ContextWindow) -> None:
        """Report this window's cut against the one ``other`` (the window it replaces) last
        reported."""
        self._reported = other._reported

    def request(self) -> WindowRequest:
        """The transcript's part of the next request, and whether its cut moved."""
        pinned = self._pinned()
        left_out = self.cut - len(pinned)
        head = [i for i in pinned if i in self._head]
        asked = [i for i in pinned if i not in self._head]
        messages = [self.quoted[i] for i in head]
        if left_out:
            note = WINDOW_NOTE.format(n=left_out, target=self.target)
            messages.append({"role": "user", "content": note})
        messages += [self.quoted[i] for i in asked]
        messages += self.quoted[self.cut :]
        moved, self._reported = self.cut != self._reported, self.cut
        return WindowRequest(
            messages=messages, tokens=self._size(pinned), left_out=left_out, moved=moved
        )

    def _add(self, entry: dict[str, Any]) -> None:
        index = len(self.quoted)
        role = entry.get("role")
        quoted = formats.quote_reply(entry) if role == "assistant" else entry
        self.quoted.append(quoted)
        self.tokens.append(message_tokens(quoted))
        self._prefix.append(self._prefix[-1] + self.tokens[-1])
        if role != "tool" or not self._tool_unit:
            self._starts.append(index)
            self._tool_unit = role == "assistant" and bool(entry.get("tool_calls"))
        if self._leading and role in ("system", "developer"):
            self._head.append(index)
        else:
            self._leading = False
        if role == "user":
            if not any(self.quoted[i].get("role") == "user" for i in self._head):
                self._head.append(index)
            env = _envelope(entry)
            question = env.question_id if env is not None and env.type is MessageType.ASK else None
            if question is not None and question not in self._answered:
                self._open[question] = index
        for call in entry.get("tool_calls") or () if role == "assistant" else ():
            if not isinstance(call, dict):
                continue
            self.call_ids.add(str(call.get("id")))
            question = _answered_question(call)
            if question is not None:
                self._answered.add(question)
                self._open.pop(question, None)

    def _pinned(self) -> list[int]:
        """Entries before the cut that every request keeps, in transcript order."""
        kept = {*self._head, *self._open.values()}
        return sorted(i for i in kept if i < self.cut)

    def _size(self, pinned: list[int]) -> int:
        tail = self._prefix[-1] - self._prefix[self.cut]
        note = self._note if self.cut > len(pinned) else 0
        return tail + note + sum(self.tokens[i] for i in pinned)

    def _fit(self) -> None:
        if self.budget is None or self._size(self._pinned()) <= self.budget:
            return
        low = self.budget * LOW_WATER
        while len(self._starts) - (self._cut_unit + 1) >= self.keep_recent:
            self._cut_unit += 1
            self.cut = self._starts[self._cut_unit]
            if self._size(self._pinned()) <= low:
                break


def _answered_question(call: dict[str, Any]) -> int | None:
    """The question a call of an answer tool closes."""
    function = call.get("function")
    if not isinstance(function, dict) or function.get("name") not in _ANSWER_TOOLS:
        return None
    try:
        return int(json.loads(function.get("arguments") or "{}")["question_id"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


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
    "LOW_WATER",
    "NORMAL",
    "TIGHT",
    "WINDOW_NOTE",
    "Compaction",
    "ContextWindow",
    "TokenCounter",
    "WindowRequest",
    "compact",
    "count_tokens",
    "estimate_tokens",
    "message_tokens",
    "pairing_holds",
    "token_counter",
]
