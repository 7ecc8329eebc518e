"""The text forms in which what did not come from the router reaches a model, and the rule that
keeps any of it from passing for the router's own words.

The router writes two fences. A routed message enters a transcript (a ``user`` entry when it is
drained, the ``tool`` result of the blocked call it resolves) in the **envelope**::

    <agent-message type="task" from="Team Leader" message_id="12">
    ...content...
    </agent-message>

Optional attributes, in this order: ``subtype``, ``question_id``. ``from`` is who really sent
the message, never what the content claims. Attribute values are display names and ids, which
never contain quotes, newlines or angle brackets. The same facts are stored as structured
metadata on the transcript entry (:func:`metadata`).

The result of a tool that an MCP server or a host function ran is the **tool output fence**,
naming the tool and the server (``server="host"`` for a host function)::

    <tool-output tool="git_log" server="git">
    ...what the tool returned...
    </tool-output>

**Provenance.** Everything inside a fence, and every other text that did not come from the
router and reaches a model (a model's own reply read back to it, a router tool's answer that
quotes an argument, a server's tool description), is *neutralised* (:func:`escape`): read the
way a model may read it, it holds no opening or closing of either fence. Reading is
:func:`normalise`:

1. each character is decomposed (NFKD: the fullwidth U+FF1C is ``<``); combining marks,
   format characters (zero-width spaces and joiners, bidi controls), Hangul fillers, and
   control, private-use and unassigned code points but whitespace are dropped;
2. what is left is case-folded, and each character that Unicode's confusables data
   (``confusables.txt``, as packaged by ``confusable-homoglyphs``) lists as a look-alike of one
   ASCII character (or string) reads as it: the Cyrillic U+0430 as ``a``, the hyphen
   U+2010 as ``-``, the angle quotation mark U+2039 as ``<``;
3. HTML character references are decoded as a browser decodes them (``&lt;``, ``&#60;``,
   ``&#x3c;``, ``&lt`` without its semicolon), then step 1 and 2 apply to what they decoded;
   this is repeated up to three times (``&amp;lt;`` is ``<`` too).

An opening or a closing is then ``<``, optional spaces and ``/``, and a fence's name with
anything but letters and digits between its words: ``agent-message``, ``Agent_Message``,
``agent message``, ``agentmessage``; ``tool-output``, ... (:data:`TAG_PATTERN`).

Neutralising puts one backslash right after the characters that read as the ``<`` of one, and
also where that ``<`` is already followed by backslashes (``<\\agent-message`` gets a second):
the reader then sees ``<\\`` where a tag would start. :func:`unescape` removes exactly the
backslashes :func:`escape` put, so honest text comes back as it was written, and the
transcript stays readable: ``<\\agent-message`` shows what the sender wrote, one backslash
more. A JSON text (a router tool's answer, a tool call's arguments) is neutralised value by
value (:func:`escape_json`), so that it stays JSON with the same structure.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import unicodedata
from dataclasses import dataclass
from html import entities
from html import unescape as _html_unescape
from typing import Any

from agent_router import limits
from agent_router.domain import Message, MessageSubtype, MessageType

#: The router's fences, by name.
ENVELOPE = "agent-message"
TOOL_OUTPUT = "tool-output"

#: A fence's name as a reader may take it (in normalised text: lower case).
_NAMES = r"(?:agent[\W_]*message|tool[\W_]*output)"
#: An opening or a closing of one of the router's fences, in normalised text (:func:`tags`).
TAG_PATTERN = re.compile(r"<\s*/?\s*" + _NAMES)
#: A ``<`` behind zero or more backslashes, then a tag: where :func:`escape` adds one.
_ESCAPE = re.compile(r"<(?=\\*\s*/?\s*" + _NAMES + ")")
#: A ``<`` behind one or more backslashes, then a tag: where :func:`unescape` removes one.
_UNESCAPE = re.compile(r"<(?=\\+\s*/?\s*" + _NAMES + ")")

#: An HTML character reference, as :func:`html.unescape` finds them.
_CHARREF = re.compile(r"&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)")
#: How many times over character references are decoded (``&amp;amp;lt;`` is three).
ENTITY_PASSES = 3

# Dropped when reading: invisible, layout-changing or unassigned code points. Whitespace of
# these categories (tabs, line feeds) is kept.
_DROPPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Mn", "Me"})
# Default-ignorable letters: they draw as nothing.
_FILLERS = frozenset("\u115f\u1160\u3164\uffa0")

_ENVELOPE_OPEN = re.compile(r'^<agent-message((?: [a-z_]+="[^"\n]*")*)>$')
_ENVELOPE_CLOSE = "</agent-message>"
_FENCE_OPEN = re.compile(r'^<tool-output((?: [a-z_]+="[^"\n]*")*)>$')
_FENCE_CLOSE = "</tool-output>"
_ATTR = re.compile(r' ([a-z_]+)="([^"\n]*)"')
#: What a name in a fence's attribute may hold; anything else becomes ``_``.
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.:-]")


# ------------------------------------------------------------------------------ reading


@functools.cache
def _lookalikes() -> dict[str, str]:
    """Non-ASCII character -> the ASCII text Unicode's confusables data says it looks like
    (those it lists with exactly one). Loaded on first use: the data is a 900 kB file."""
    from confusable_homoglyphs import confusables

    table: dict[str, str] = {}
    for char, glyphs in confusables.confusables_data.items():
        if len(char) != 1 or char.isascii():
            continue
        ascii_ = {g["c"] for g in glyphs if g["c"].isascii() and g["c"].isprintable()}
        if len(ascii_) == 1:
            table[char] = ascii_.pop()
    return table


@functools.lru_cache(maxsize=65536)
def _fold(char: str) -> str:
    """How one character reads (steps 1 and 2 of the module's rule)."""
    if char.isascii() and (char.isprintable() or char.isspace()):
        return char.lower()
    lookalikes = _lookalikes()
    out = []
    for c in unicodedata.normalize("NFKD", char):
        if c in _FILLERS or (unicodedata.category(c) in _DROPPED_CATEGORIES and not c.isspace()):
            continue
        out.append(lookalikes.get(c) or "".join(lookalikes.get(f, f) for f in c.casefold()))
    return "".join(out).lower()


class _Folds(dict[int, str]):
    """A translation table (code point -> how it reads) filled as characters are met."""

    def __missing__(self, code: int) -> str:
        self[code] = folded = _fold(chr(code))
        return folded


_FOLDS = _Folds()


def _fold_text(text: str) -> str:
    return text.translate(_FOLDS)


@functools.lru_cache(maxsize=4096)
def _charref(name: str) -> tuple[int, str] | None:
    """How many characters of ``&name`` a browser reads as a character reference, and how
    what it decodes them to reads; ``None`` when none (:func:`html.unescape`'s rules)."""
    if name[0] == "#":
        return len(name) + 1, _fold_text(_html_unescape("&" + name))
    if name in entities.html5:
        return len(name) + 1, _fold_text(entities.html5[name])
    for end in range(len(name) - 1, 1, -1):  # the longest name without its semicolon
        if name[:end] in entities.html5:
            return end + 1, _fold_text(entities.html5[name[:end]])
    return None


#: Text a reader takes as it is (printable ASCII and whitespace), but for case.
_PLAIN = re.compile(r"[\t-\r\x1c-\x7e]*")


@dataclass(frozen=True)
class _Reading:
    """``text`` normalised, and per character of it where the characters it was read from
    end in the original (``None``: the next index, one original character each)."""

    text: str
    ends: list[int] | None

    def end(self, index: int) -> int:
        return index + 1 if self.ends is None else self.ends[index]


def _decode(reading: _Reading) -> _Reading | None:
    """One pass of step 3: each character reference becomes what it decodes to, each
    character of which stands for every original character the reference was read from.
    ``None`` when there is none."""
    text = reading.text
    if "&" not in text:
        return None
    ends = reading.ends if reading.ends is not None else list(range(1, len(text) + 1))
    texts: list[str] = []
    spans: list[list[int]] = []
    last = 0
    for match in _CHARREF.finditer(text):
        found = _charref(match.group(1))
        if found is None:
            continue
        length, decoded = found
        begin, stop = match.start(), match.start() + length
        texts += (text[last:begin], decoded)
        spans += (ends[last:begin], [ends[stop - 1]] * len(decoded))
        last = stop
    if not texts:
        return None
    texts.append(text[last:])
    spans.append(ends[last:])
    return _Reading("".join(texts), list(itertools.chain.from_iterable(spans)))


def _read(text: str) -> _Reading:
    if _PLAIN.fullmatch(text):
        reading = _Reading(text.lower(), None)
    else:
        folds = list(map(_fold, text))
        ends = None
        if set(map(len, folds)) != {1}:
            ends = [i for i, f in enumerate(folds, 1) for _ in f]
        reading = _Reading("".join(folds), ends)
    for _ in range(ENTITY_PASSES):
        decoded = _decode(reading)
        if decoded is None:
            break
        reading = decoded
    return reading


def _replace_ref(match: re.Match[str]) -> str:
    found = _charref(match.group(1))
    if found is None:
        return match.group(0)
    length, decoded = found
    return decoded + match.group(0)[length:]


def normalise(text: str) -> str:
    """``text`` as a reader may take it (the module's rule): the text fences are looked for
    in. The same text as the reading :func:`escape` builds, without its map back to ``text``."""
    reading = text.lower() if _PLAIN.fullmatch(text) else _fold_text(text)
    for _ in range(ENTITY_PASSES):
        if "&" not in reading:
            break
        decoded = _CHARREF.sub(_replace_ref, reading)
        if decoded == reading:  # no reference was found: one never reads as itself
            break
        reading = decoded
    return reading


def tags(text: str) -> list[str]:
    """The openings and closings of the router's fences ``text`` holds, read as
    :func:`normalise` reads it."""
    return TAG_PATTERN.findall(normalise(text)) if _may_hold_tag(text) else []


def _may_hold_tag(text: str) -> bool:
    """Whether some character of ``text`` reads as ``<`` or ``&`` (cheap: distinct
    characters only)."""
    return any("<" in (r := _fold(c)) or "&" in r for c in set(text))


# ------------------------------------------------------------------------------ neutralising


def escape(text: str) -> str:
    """``text`` neutralised: one backslash after every character that reads as the ``<`` of a
    fence's opening or closing, escaped or not (see the module docstring)."""
    if not _may_hold_tag(text) or not _ESCAPE.search(normalise(text)):
        return text
    reading = _read(text)
    cuts = sorted({reading.end(m.start()) for m in _ESCAPE.finditer(reading.text)})
    if not cuts:
        return text
    bounds = [0, *cuts, len(text)]
    return "\\".join(text[a:b] for a, b in itertools.pairwise(bounds))


def unescape(text: str) -> str:
    """Inverse of :func:`escape`: the backslash right after each character that reads as the
    ``<`` of an escaped opening or closing is removed."""
    if not _may_hold_tag(text) or not _UNESCAPE.search(normalise(text)):
        return text
    reading = _read(text)
    cuts = sorted(
        end
        for end in {reading.end(m.start()) for m in _UNESCAPE.finditer(reading.text)}
        if text[end : end + 1] == "\\"
    )
    if not cuts:
        return text
    bounds = [0, *cuts, len(text)]
    return "".join(text[a + (i > 0) : b] for i, (a, b) in enumerate(itertools.pairwise(bounds)))


def _each_string(value: Any, change: Any) -> Any:
    if isinstance(value, str):
        return change(value)
    if isinstance(value, list):
        return [_each_string(v, change) for v in value]
    if isinstance(value, dict):
        return {change(k): _each_string(v, change) for k, v in value.items()}
    return value


def escape_json(text: str) -> str:
    """A JSON text neutralised string by string (keys too), so that it stays JSON with the same
    structure; a text that is not JSON is neutralised as text (:func:`escape`)."""
    if not _may_hold_tag(text) and "\\u" not in text:
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return escape(text)
    if not isinstance(value, dict | list | str):
        return text
    # Re-encoded without \\u escapes: "\\u003c" is a "<" a reader may take for one too. An
    # escape of a lone surrogate ("\\ud800") decodes to a character no encoding writes: it
    # becomes U+FFFD, so that the text can be sent (a request that holds it cannot).
    return json.dumps(_each_string(value, _escape_storable), ensure_ascii=False)


def _escape_storable(text: str) -> str:
    return escape(limits.encodable(text))


def unescape_json(text: str) -> str:
    """Inverse of :func:`escape_json`, up to JSON's own spelling (the same value)."""
    try:
        value = json.loads(text)
    except ValueError:
        return unescape(text)
    if not isinstance(value, dict | list | str):
        return text
    return json.dumps(_each_string(value, _unescape_storable), ensure_ascii=False)


def _unescape_storable(text: str) -> str:
    return unescape(limits.encodable(text))


def quote_reply(entry: dict[str, Any]) -> dict[str, Any]:
    """An assistant entry as its model reads it back in a later request: its text neutralised,
    and its tool calls' names and arguments (value by value) too. The stored entry keeps what
    the model wrote; an entry with nothing to neutralise is returned as it is."""
    content = entry.get("content")
    calls = entry.get("tool_calls")
    quoted: dict[str, Any] = {}
    if isinstance(content, str) and (escaped := escape(limits.encodable(content))) is not content:
        quoted["content"] = escaped
    if isinstance(calls, list) and any(_call_needs_quoting(c) for c in calls):
        quoted["tool_calls"] = [_quote_call(c) for c in calls]
    return {**entry, **quoted} if quoted else entry


def _call_needs_quoting(call: Any) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return False
    texts = (function.get("name"), function.get("arguments"))
    return any(isinstance(t, str) and (_may_hold_tag(t) or "\\u" in t) for t in texts)


def _quote_call(call: Any) -> Any:
    if not _call_needs_quoting(call):
        return call
    function = dict(call["function"])
    if isinstance(function.get("name"), str):
        function["name"] = escape(function["name"])
    if isinstance(function.get("arguments"), str):
        function["arguments"] = escape_json(function["arguments"])
    return {**call, "function": function}


# ------------------------------------------------------------------------------ the envelope


@dataclass(frozen=True, kw_only=True)
class Envelope:
    type: MessageType
    sender: str
    message_id: int
    content: str
    subtype: MessageSubtype | None = None
    question_id: int | None = None


def envelope_of(message: Message) -> Envelope:
    return Envelope(
        type=message.type,
        sender=message.source_name,
        message_id=message.id,
        content=message.content,
        subtype=message.subtype,
        question_id=message.question_id,
    )


def render(env: Envelope) -> str:
    """The envelope around the content (on PostgreSQL the store's function ``ar__envelope``
    writes the same text, from the content as :func:`escape` left it)."""
    attrs = ""
    if env.subtype is not None:
        attrs += f' subtype="{env.subtype.value}"'
    if env.question_id is not None:
        attrs += f' question_id="{env.question_id}"'
    return (
        f'<agent-message type="{env.type.value}" from="{env.sender}" '
        f'message_id="{env.message_id}"{attrs}>\n{escape(env.content)}\n{_ENVELOPE_CLOSE}'
    )


def stored_body(content: str) -> str | None:
    """What the store keeps of a message beside its content: the content as it appears inside
    an envelope, where escaping changed it (``None``: the content itself)."""
    body = escape(content)
    return None if body == content else body


def _fenced(text: str, opening: re.Pattern[str], close: str) -> tuple[dict[str, str], str]:
    """The attributes of a fence's first line and the content, unescaped; ``ValueError`` for
    anything else."""
    head, sep, rest = text.partition("\n")
    match = opening.match(head)
    if not sep or match is None or (not rest.endswith("\n" + close) and rest != close):
        raise ValueError(f"not a {close[2:-1]} fence")
    content = "" if rest == close else rest[: -len(close) - 1]
    return dict(_ATTR.findall(match.group(1))), unescape(content)


def parse(text: str) -> Envelope:
    """Inverse of :func:`render`; raises ``ValueError`` on anything else."""
    attrs, content = _fenced(text, _ENVELOPE_OPEN, _ENVELOPE_CLOSE)
    try:
        return Envelope(
            type=MessageType(attrs["type"]),
            sender=attrs["from"],
            message_id=int(attrs["message_id"]),
            content=content,
            subtype=MessageSubtype(attrs["subtype"]) if "subtype" in attrs else None,
            question_id=int(attrs["question_id"]) if "question_id" in attrs else None,
        )
    except (KeyError, ValueError) as exc:
        raise ValueError(f"bad agent-message attributes: {exc}") from exc


def metadata(message: Message) -> dict[str, Any]:
    return {
        "message_id": message.id,
        "type": message.type.value,
        "subtype": message.subtype.value if message.subtype else None,
        "from": message.source_name,
        "question_id": message.question_id,
        "seq": message.seq,
    }


# ------------------------------------------------------------------------------ tool output


#: The ``server`` a host function's output is fenced with.
HOST_SERVER = "host"


@dataclass(frozen=True, kw_only=True)
class ToolOutput:
    """What a tool of a server returned, as its fence names it."""

    tool: str
    server: str
    content: str


def fence_name(name: str) -> str:
    """``name`` as a fence's attribute holds it: letters, digits, ``_ . : -``, others ``_``."""
    return _UNSAFE_NAME.sub("_", name)[:128] or "_"


def fence(output: ToolOutput) -> str:
    """The tool output fence around ``output.content``, neutralised."""
    return (
        f'<tool-output tool="{fence_name(output.tool)}" server="{fence_name(output.server)}">\n'
        f"{escape(output.content)}\n{_FENCE_CLOSE}"
    )


def parse_fence(text: str) -> ToolOutput:
    """Inverse of :func:`fence`; raises ``ValueError`` on anything else."""
    attrs, content = _fenced(text, _FENCE_OPEN, _FENCE_CLOSE)
    try:
        return ToolOutput(tool=attrs["tool"], server=attrs["server"], content=content)
    except KeyError as exc:
        raise ValueError(f"bad tool-output attributes: {exc}") from exc


#: Room left in each part of a split report for its ``[part i/n]`` header.
_PART_HEADER_BYTES = 64


def keyed_parts(text: str, max_bytes: int, key: str) -> list[tuple[str, str]]:
    """``text`` in its :func:`report_parts`, each with its deduplication key: ``key`` for a
    whole one, ``key:i`` for part ``i``."""
    parts = report_parts(text, max_bytes)
    if len(parts) == 1:
        return [(parts[0], key)]
    return [(part, f"{key}:{number}") for number, part in enumerate(parts, 1)]


def report_parts(text: str, max_bytes: int) -> list[str]:
    """``text`` as it reaches its reader (a report to the lead, an answer written as prose):
    whole when it fits in one message of ``max_bytes``, else split into parts that each fit
    (at line breaks where one is near), numbered ``[part i/n]``. Nothing is cut off: the parts
    joined without their headers are ``text``."""
    if len(text.encode("utf-8")) <= max_bytes:
        return [text]
    room = max(max_bytes - _PART_HEADER_BYTES, 16)
    chunks: list[str] = []
    rest = text.encode("utf-8")
    while rest:
        cut = min(room, len(rest))
        while cut < len(rest) and rest[cut] & 0xC0 == 0x80:  # not inside a UTF-8 sequence
            cut -= 1
        newline = rest.rfind(b"\n", 0, cut)
        if cut < len(rest) and newline > cut // 2:
            cut = newline + 1
        chunks.append(rest[:cut].decode("utf-8"))
        rest = rest[cut:]
    return [f"[part {i}/{len(chunks)}]\n{chunk}" for i, chunk in enumerate(chunks, 1)]
