"""The one text form in which a routed message enters a transcript.

A drained message becomes a ``user`` entry, and a message that resolves a blocked ask becomes
that call's ``tool`` result, both rendered as::

    <agent-message type="task" from="Team Leader" message_id="12">
    ...content, verbatim...
    </agent-message>

Optional attributes, in this order: ``subtype``, ``question_id``. The first line and the last line
are the envelope, written by the router: ``from`` is who really sent the message, never what the
content claims. Attribute values are display names and ids, which never contain quotes, newlines
or angle brackets. The same facts are stored as structured metadata on the transcript entry
(:func:`metadata`).

Everything between the two lines is the content, verbatim except for one escape that makes an
envelope unforgeable: wherever the content has ``<`` followed by something that reads as the tag
(``agent-message``, ``/agent-message``, any case, with ``-``, ``_`` or a space, spaces around the
slash), one backslash is put after the ``<`` (``<\\agent-message``); a ``<`` already followed by
backslashes and the tag gets one more. So the rendered text holds exactly one envelope start and
one end, whatever the content says, and :func:`parse` removes exactly the backslashes
:func:`render` added.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agent_router.domain import Message, MessageSubtype, MessageType

_OPEN = re.compile(r'^<agent-message((?: [a-z_]+="[^"\n]*")*)>$')
_ATTR = re.compile(r' ([a-z_]+)="([^"\n]*)"')
_CLOSE = "</agent-message>"
#: Anything a reader could take for the envelope's tag: ``<`` then the tag name, loosely spelled.
_TAG = r"\s*/?\s*agent[-_\s]?message"
#: The tag in content, behind zero or more backslashes (render adds one).
_ESCAPE = re.compile(r"<(\\*)(?=" + _TAG + ")", re.IGNORECASE)
#: The tag in rendered content, behind one or more backslashes (parse removes one).
_UNESCAPE = re.compile(r"<\\(\\*)(?=" + _TAG + ")", re.IGNORECASE)
#: What counts as an envelope start or end in a rendered text (for checks and tests).
TAG_PATTERN = re.compile("<" + _TAG, re.IGNORECASE)


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
        f'message_id="{env.message_id}"{attrs}>\n{escape(env.content)}\n{_CLOSE}'
    )


def escape(content: str) -> str:
    """The content as it appears inside an envelope (see the module docstring)."""
    return _ESCAPE.sub(lambda m: "<\\" + m.group(1), content)


def stored_body(content: str) -> str | None:
    """What the store keeps of a message beside its content: the content as it appears inside
    an envelope, where escaping changed it (``None``: the content itself)."""
    body = escape(content)
    return None if body == content else body


def unescape(text: str) -> str:
    """Inverse of :func:`escape`."""
    return _UNESCAPE.sub(lambda m: "<" + m.group(1), text)


def parse(text: str) -> Envelope:
    """Inverse of :func:`render`; raises ``ValueError`` on anything else."""
    head, sep, rest = text.partition("\n")
    match = _OPEN.match(head)
    if not sep or match is None or (not rest.endswith("\n" + _CLOSE) and rest != _CLOSE):
        raise ValueError("not an agent-message envelope")
    content = "" if rest == _CLOSE else rest[: -len(_CLOSE) - 1]
    attrs = dict(_ATTR.findall(match.group(1)))
    try:
        return Envelope(
            type=MessageType(attrs["type"]),
            sender=attrs["from"],
            message_id=int(attrs["message_id"]),
            content=unescape(content),
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
