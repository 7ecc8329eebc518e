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

**The window is a hard limit** (:func:`fit`): what compaction leaves over it (an oversize tool
result or message, the newest included, which compaction never touches) is cut in the middle,
head and tail kept, with a note saying exactly how many characters were left out; the
transcript keeps every text whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from agent_router import formats
from agent_router.domain import MessageSubtype, MessageType
from agent_router.errors import ContextLengthExceededError
from agent_router.logfields import get_logger
from agent_router.store.transcripts import entry_bytes

logger = get_logger(__name__)

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
    sizes: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """``messages`` shortened to at most ``limit`` tokens where the rules allow (see the module
    docstring); ``sizes``: their tokens when the caller counted them already. The input is not
    modified (a message shortened is a new one). A request that fits is returned unchanged
    (a copy of the list)."""
    sizes = [message_tokens(m, count) for m in messages] if sizes is None else list(sizes)
    total = sum(sizes)
    out = list(messages)
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


#: What stands in a message for the middle of its text that a request leaves out (:func:`fit`).
CUT_NOTE = (
    "\n[{n} of {total} characters of this message left out of this request to fit the "
    "model's context window; the transcript keeps it whole]\n"
)

#: Characters of a text :func:`fit` cuts before it gives up on that text: what is left of it
#: then (a head and a tail) is about the size of the note.
_MIN_KEEP = 200
#: Tokens :data:`CUT_NOTE` is counted in when :func:`fit` plans its cuts.
_NOTE_TOKENS = 40


def fit(
    messages: Sequence[dict[str, Any]],
    *,
    limit: int,
    count: TokenCounter = estimate_tokens,
    sizes: Sequence[int] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """``messages`` cut to at most ``limit`` tokens, and their tokens: a hard limit, where
    :func:`compact` only leaves out and shortens older messages.

    While the request is over ``limit``, its largest texts (a tool result, a message, the
    newest included) are cut to one size, as large as lets the request fit, each in the
    middle: its head and its tail stay, and :data:`CUT_NOTE` between them says exactly how
    many of its characters were left out. An envelope or a tool output fence stays whole
    around what is kept of its content. System prompts are cut only when the rest cannot
    make room. ``sizes``: the messages' tokens when the caller counted them already. Raises
    :class:`~agent_router.errors.ContextLengthExceededError` when even the messages cut to
    their notes do not fit (the system prompt alone is over ``limit``). The input is not
    modified; a request that fits is returned as it is (a copy of the list)."""
    out = list(messages)
    sized = list(sizes) if sizes is not None else [message_tokens(m, count) for m in out]
    total = sum(sized)
    for system in (False, True):
        for _round in range(4):  # token counts of cut texts are near their targets, not exact
            if total <= limit:
                return out, total
            cuttable = [
                i
                for i, m in enumerate(out)
                if (m.get("role") in ("system", "developer")) == system
                and isinstance(m.get("content"), str)
                and len(m["content"]) > _MIN_KEEP
            ]
            cap = _cap([sized[i] for i in cuttable], total - limit)
            for i in cuttable:
                if sized[i] <= cap:
                    continue
                smaller = _cut_to(out[i], cap, count)
                new_size = message_tokens(smaller, count) if smaller is not None else sized[i]
                if smaller is not None and new_size < sized[i]:
                    out[i] = smaller
                    total += new_size - sized[i]
                    sized[i] = new_size
    if total > limit:
        raise ContextLengthExceededError(
            f"the request takes {total} tokens with every message cut, over its limit of "
            f"{limit}: shorten the system prompt or the tool schemas, or use a model with a "
            "larger context window"
        )
    return out, total


def _cap(sizes: list[int], excess: int) -> int:
    """The largest size that texts of ``sizes`` cut to it (those larger, each with its note)
    free at least ``excess`` tokens; 0 when none does."""
    low, high = 0, max(sizes, default=0)
    while low < high:
        cap = (low + high + 1) // 2
        freed = sum(size - cap - _NOTE_TOKENS for size in sizes if size > cap + _NOTE_TOKENS)
        if freed >= excess:
            low = cap
        else:
            high = cap - 1
    return low


def _cut_to(message: dict[str, Any], tokens: int, count: TokenCounter) -> dict[str, Any] | None:
    """A copy of ``message`` whose text is cut in the middle to about ``tokens`` tokens (at
    least to its note), or ``None`` when it has no text to cut."""
    content = message.get("content")
    if not isinstance(content, str) or len(content) <= _MIN_KEEP:
        return None
    inner, wrap = _inner_text(message, content)
    size = message_tokens(message, count)
    keep = len(inner)
    for _attempt in range(8):
        # Characters scale with tokens closely enough: a few rounds reach the target.
        keep = int(keep * max(0.0, tokens - MESSAGE_OVERHEAD - _NOTE_TOKENS) / max(1, size)) - 1
        keep = max(0, min(keep, len(inner) - _MIN_KEEP))
        cut = message | {"content": wrap(_middle_cut(inner, keep))}
        size = message_tokens(cut, count)
        if size <= tokens or keep == 0:
            return cut
    return cut


def _middle_cut(text: str, keep: int) -> str:
    """``text`` less its middle: ``keep`` characters kept (its head and its tail, 2 to 1) and
    a note saying exactly how many were left out."""
    head = keep * 2 // 3
    tail = keep - head
    note = CUT_NOTE.format(n=f"{len(text) - keep:,}", total=f"{len(text):,}")
    return f"{text[:head]}{note}{text[len(text) - tail :] if tail else ''}"


def _inner_text(message: dict[str, Any], content: str) -> tuple[str, Callable[[str], str]]:
    """The text of a message that may be cut, and how to put a cut one back: inside its
    envelope or tool output fence, when it has one."""
    role = message.get("role")
    if role in ("user", "tool"):
        env = _envelope(message)
        if env is not None:
            return env.content, lambda text: formats.render(replace(env, content=text))
    if role == "tool":
        output = _tool_output(content)
        if output is not None:
            return output.content, lambda text: formats.fence(replace(output, content=text))
    return content, lambda text: text


#: A request kept near its target is cut down to this share of it, so that it then grows for a
#: while before the next cut: what is left out changes in steps, not at every model call.
LOW_WATER = 0.6

#: The open questions a request keeps from before its cut, the newest: a question answered in
#: prose, expired or cancelled has no answer call to close it in the transcript, and must not
#: stay in every request for ever.
OPEN_QUESTIONS_KEPT = 8

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


#: One transcript entry with its position (0, 1, 2, ... in the agent's transcript).
Row = tuple[int, dict[str, Any]]


class ContextWindow:
    """An agent's request kept near a target size, built from its transcript one entry at a
    time: a model call costs the entries appended since the last one, not the whole history,
    and the window holds only what its requests hold.

    Each entry is counted (:func:`estimate_tokens`) and quoted as the model reads it back
    (:func:`agent_router.formats.quote_reply`) once, when it arrives. After each entry, when
    the request it would make passes ``budget`` tokens (the target less the protocol section
    and the tool schemas), the cut moves forward over whole units (an assistant message with
    its tool results, or one message alone) until the request is at most :data:`LOW_WATER`
    of the budget, never past the newest ``keep_recent`` units. A request is then: the
    leading system prompt and the first task, one note saying how many earlier messages are
    left out (:data:`WINDOW_NOTE`), the questions asked of the agent that it has not answered
    with an answer call (the newest :data:`OPEN_QUESTIONS_KEPT`), and everything from the cut
    on. The cut only moves forward (a larger budget lets the tail grow), and it is a function
    of the transcript: another process that builds the window from the same entries, whole or
    from a :meth:`checkpoint`, reaches the same one. ``budget`` ``None``: nothing more is left
    out.

    Entries before the cut are let go, but for the pinned ones (the head, open questions), so
    the window's memory is bounded by its requests; :attr:`nbytes` is what the entries it
    holds take (:func:`~agent_router.store.transcripts.entry_bytes`, each counted once as it
    is taken in), which a process's transcript cache counts against its byte budget.
    :meth:`checkpoint` says where it stands; :meth:`restore` builds the same window from that
    and the entries from the cut on, without the ones before it.
    """

    def __init__(self, *, target: int | None, budget: int | None, keep_recent: int = 8) -> None:
        self.target = target
        self.budget = budget
        self.keep_recent = keep_recent
        self.length = 0  # entries taken in: the position of the next one
        self.cut = 0  # the position of the first entry of the tail
        self._tail: list[dict[str, Any]] = []  # quoted entries from _base on
        self._tokens: list[int] = []  # theirs
        self._bytes: list[int] = []  # theirs (:func:`entry_bytes`)
        self._pin_bytes: dict[int, int] = {}  # the pinned entries' before _base
        self.nbytes = 0  # the bytes held: of the tail and the pinned entries
        self._prefix = [0]  # tokens of the tail's entries before each of its indices
        self._base = 0  # the position of _tail[0]: the cut, once the cut's move is done
        self._starts: list[int] = []  # positions where units start, from the cut's unit on
        self._cut_unit = 0  # the index in _starts of the cut's unit
        self._pins: dict[int, tuple[dict[str, Any], int]] = {}  # pinned entries before _base
        self._head: list[int] = []  # the leading system entries and the first user message
        self._has_task = False
        self._leading = True
        self._tool_unit = False  # the last unit is an assistant's tool calls: results join it
        self._open: dict[int, int] = {}  # open question id -> position of its ask
        self._last: dict[str, Any] | None = None  # the last entry taken in, as stored
        self._reported = 0  # the cut of the last request
        self._note = message_tokens({"content": WINDOW_NOTE.format(n=10**6, target=target)})

    def __len__(self) -> int:
        """The entries held (the tail and the pinned ones before it)."""
        return len(self._tail) + len(self._pins)

    @property
    def call_ids(self) -> set[str]:
        """The tool call ids of the entries a request holds (every one of the transcript
        while nothing is left out)."""
        return {
            str(call.get("id"))
            for entry in self._tail
            if entry.get("role") == "assistant"
            for call in entry.get("tool_calls") or ()
            if isinstance(call, dict)
        }

    def extend(self, entries: Sequence[dict[str, Any]]) -> None:
        """Take in the entries past those taken in (``entries``: the whole transcript)."""
        self.take(enumerate(entries[self.length :], self.length))

    def take(self, rows: Iterable[Row]) -> None:
        """Take in ``rows``, the entries from position :attr:`length` on, in order."""
        for position, entry in rows:
            self._add(position, entry)
            self._fit()

    def follows(self, row: Row | None) -> bool:
        """Is ``row`` the last entry taken in, as stored? (``None``: nothing was.) A window
        whose last entry is not there any more (its agent's rows were deleted, or SQLite gave
        a deleted agent's id to a new one) is built again."""
        if row is None:
            return self.length == 0
        return row[0] == self.length - 1 and row[1] == self._last

    def retarget(self, target: int | None, budget: int | None) -> None:
        """Keep requests near another target from now on; the cut never moves back."""
        if (target, budget) == (self.target, self.budget):
            return
        self.target, self.budget = target, budget
        self._note = message_tokens({"content": WINDOW_NOTE.format(n=10**6, target=target)})
        self._fit()

    def request(self) -> WindowRequest:
        """The transcript's part of the next request, and whether its cut moved."""
        pinned = self._pinned()
        left_out = self.cut - len(pinned)
        messages = [self._entry(p)[0] for p in pinned if p in self._head]
        if left_out:
            note = WINDOW_NOTE.format(n=left_out, target=self.target)
            messages.append({"role": "user", "content": note})
        messages += [self._entry(p)[0] for p in pinned if p not in self._head]
        messages += self._tail[self.cut - self._base :]
        moved, self._reported = self.cut != self._reported, self.cut
        return WindowRequest(
            messages=messages, tokens=self._size(pinned), left_out=left_out, moved=moved
        )

    def held(self) -> list[dict[str, Any]]:
        """The entries held, in transcript order: what the requests are built from."""
        return [self._pins[p][0] for p in sorted(self._pins)] + self._tail

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self) -> dict[str, Any]:
        """Where the window stands, as JSON: enough, with the entries from the cut on and the
        pinned ones, to build it again (:meth:`restore`)."""
        return {
            "length": self.length,
            "cut": self.cut,
            "head": list(self._head),
            "open": {str(q): p for q, p in self._open.items()},
            "leading": self._leading,
            "has_task": self._has_task,
            "target": self.target,
            "budget": self.budget,
        }

    @classmethod
    def restore(
        cls,
        checkpoint: Mapping[str, Any],
        read: Callable[[int, list[int]], Sequence[Row]],
        *,
        target: int | None,
        budget: int | None,
        keep_recent: int = 8,
    ) -> ContextWindow | None:
        """The window a :meth:`checkpoint` describes, from the rows ``read(after, also)``
        returns: the entries after position ``after`` (the cut's) and at the positions ``also``
        (the pinned ones before it), in order; later entries are taken in as new ones. ``None``
        when the checkpoint is not one this class wrote, or the rows are not those (the
        transcript is not the one it was taken of)."""
        try:
            cut, length = int(checkpoint["cut"]), int(checkpoint["length"])
            head = [int(p) for p in checkpoint["head"]]
            opened = {int(q): int(p) for q, p in checkpoint["open"].items()}
            leading, has_task = bool(checkpoint["leading"]), bool(checkpoint["has_task"])
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        pins = sorted({p for p in [*head, *opened.values()] if p < cut})
        rows = read(cut - 1, pins)
        by_position = dict(rows)
        tail = [(p, e) for p, e in rows if p >= cut]
        if (
            not 0 <= cut < length
            or any(p not in by_position for p in pins)
            or [p for p, _e in tail[: length - cut]] != list(range(cut, length))
        ):
            return None
        window = cls(
            target=checkpoint.get("target"), budget=checkpoint.get("budget"),
            keep_recent=keep_recent,
        )  # fmt: skip
        window.length = window.cut = window._base = window._reported = cut
        window._head, window._has_task, window._leading = head, has_task, leading
        window._open = {q: p for q, p in opened.items() if p < cut}
        for p in pins:
            entry = by_position[p]
            quoted = formats.quote_reply(entry) if entry.get("role") == "assistant" else entry
            window._pins[p] = (quoted, message_tokens(quoted))
            window._pin_bytes[p] = entry_bytes(quoted)
            window.nbytes += window._pin_bytes[p]
        for position, entry in tail[: length - cut]:  # fitted when the checkpoint was taken
            window._add(position, entry)
        if window._starts[:1] != [cut]:
            return None
        window.retarget(target, budget)
        window.take(tail[length - cut :])
        return window

    # ------------------------------------------------------------------ the cut

    def _add(self, position: int, entry: dict[str, Any]) -> None:
        if position != self.length:
            raise ValueError(f"entry {position} taken in after {self.length - 1}")
        role = entry.get("role")
        quoted = formats.quote_reply(entry) if role == "assistant" else entry
        self._tail.append(quoted)
        self._tokens.append(message_tokens(quoted))
        self._bytes.append(entry_bytes(quoted))
        self.nbytes += self._bytes[-1]
        self._prefix.append(self._prefix[-1] + self._tokens[-1])
        if role != "tool" or not self._tool_unit:
            self._starts.append(position)
            self._tool_unit = role == "assistant" and bool(entry.get("tool_calls"))
        if self._leading and role in ("system", "developer"):
            self._head.append(position)
        else:
            self._leading = False
        if role == "user":
            if not self._has_task:
                self._head.append(position)
                self._has_task = True
            env = _envelope(entry)
            question = env.question_id if env is not None and env.type is MessageType.ASK else None
            if question is not None:
                self._open[question] = position
                while len(self._open) > OPEN_QUESTIONS_KEPT:
                    oldest = next(iter(self._open))
                    self._unpin(self._open.pop(oldest))
        for call in entry.get("tool_calls") or () if role == "assistant" else ():
            if not isinstance(call, dict):
                continue
            question = _answered_question(call)
            if question is not None and question in self._open:
                self._unpin(self._open.pop(question))
        self.length += 1
        self._last = entry

    def _unpin(self, position: int) -> None:
        """An ask no longer open (or no longer kept) is left out with the rest before the cut."""
        if position not in self._head and self._pins.pop(position, None) is not None:
            self.nbytes -= self._pin_bytes.pop(position)

    def _entry(self, position: int) -> tuple[dict[str, Any], int]:
        """A held entry before the cut, quoted, with its tokens."""
        if position < self._base:
            return self._pins[position]
        index = position - self._base
        return self._tail[index], self._tokens[index]

    def _pinned(self) -> list[int]:
        """Entries before the cut that every request keeps, in transcript order."""
        kept = {*self._head, *self._open.values()}
        return sorted(i for i in kept if i < self.cut)

    def _size(self, pinned: list[int]) -> int:
        tail = self._prefix[-1] - self._prefix[self.cut - self._base]
        note = self._note if self.cut > len(pinned) else 0
        return tail + note + sum(self._entry(p)[1] for p in pinned)

    def _fit(self) -> None:
        if self.budget is None or self._size(self._pinned()) <= self.budget:
            return
        low = self.budget * LOW_WATER
        while len(self._starts) - (self._cut_unit + 1) >= self.keep_recent:
            self._cut_unit += 1
            self.cut = self._starts[self._cut_unit]
            if self._size(self._pinned()) <= low:
                break
        self._let_go()

    def _let_go(self) -> None:
        """Drop the entries before the cut, keeping the pinned ones."""
        if self.cut == self._base:
            return
        pinned = {*self._head, *self._open.values()}
        for position in range(self._base, self.cut):
            if position in pinned:
                self._pins[position] = self._entry(position)
                self._pin_bytes[position] = self._bytes[position - self._base]
            else:
                self.nbytes -= self._bytes[position - self._base]
        gone = self.cut - self._base
        del self._tail[:gone], self._tokens[:gone], self._bytes[:gone]
        self._prefix = [n - self._prefix[gone] for n in self._prefix[gone:]]
        self._starts = self._starts[self._cut_unit :]
        self._cut_unit = 0
        self._base = self.cut


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
    "CUT_NOTE",
    "LOW_WATER",
    "NORMAL",
    "OPEN_QUESTIONS_KEPT",
    "TIGHT",
    "WINDOW_NOTE",
    "Compaction",
    "ContextWindow",
    "Row",
    "TokenCounter",
    "WindowRequest",
    "compact",
    "count_tokens",
    "estimate_tokens",
    "fit",
    "message_tokens",
    "pairing_holds",
    "token_counter",
]
