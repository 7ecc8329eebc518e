"""The one text form in which a routed message enters a transcript.

A drained message becomes a ``user`` entry, and a message that resolves a blocked ask becomes
that call's ``tool`` result, both rendered as::

    <agent-message type="task" from="Team Leader" message_id="12">
    ...content, verbatim...
    </agent-message>

Optional attributes, in this order: ``subtype``, ``question_id``. The first line and the last line
are the envelope; everything between them is the content, byte for byte, so no escaping is needed.
Attribute values are display names and ids, which never contain quotes or newlines.
The same facts are stored as structured metadata on the transcript entry (:func:`metadata`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agent_router.domain import Message, MessageSubtype, MessageType

_OPEN = re.compile(r'^<agent-message((?: [a-z_]+="[^"\n]*")*)>$')
_ATTR = re.compile(r' ([a-z_]+)="([^"\n]*)"')
_CLOSE = "</agent-message>"


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
    attrs = [f'type="{env.type.value}"', f'from="{env.sender}"', f'message_id="{env.message_id}"']
    if env.subtype is not None:
        attrs.append(f'subtype="{env.subtype.value}"')
    if env.question_id is not None:
        attrs.append(f'question_id="{env.question_id}"')
    return f"<agent-message {' '.join(attrs)}>\n{env.content}\n{_CLOSE}"


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
