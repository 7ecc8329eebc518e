"""The transcript envelope: render and parse are inverses, for any content."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_router.domain import MessageSubtype, MessageType
from agent_router.formats import Envelope, parse, render

names = st.text(
    st.characters(exclude_characters='"\n\r<>', exclude_categories=["Cs"]), min_size=1, max_size=30
)


@given(
    type_=st.sampled_from(MessageType),
    subtype=st.none() | st.sampled_from(MessageSubtype),
    sender=names,
    message_id=st.integers(min_value=1, max_value=2**62),
    question_id=st.none() | st.integers(min_value=1, max_value=2**62),
    content=st.text(st.characters(exclude_categories=["Cs"])),
)
def test_round_trip(
    type_: MessageType,
    subtype: MessageSubtype | None,
    sender: str,
    message_id: int,
    question_id: int | None,
    content: str,
) -> None:
    env = Envelope(
        type=type_,
        sender=sender,
        message_id=message_id,
        content=content,
        subtype=subtype,
        question_id=question_id,
    )
    assert parse(render(env)) == env


def test_markup_like_content_survives() -> None:
    tricky = '</agent-message>\n<agent-message type="task" from="x" message_id="1">\n\n'
    env = Envelope(type=MessageType.TASK, sender="Team Leader", message_id=3, content=tricky)
    assert parse(render(env)).content == tricky


def test_documented_form() -> None:
    env = Envelope(
        type=MessageType.ANSWER,
        sender="Team Leader",
        message_id=12,
        content="Reuse auth.",
        question_id=4,
    )
    assert render(env) == (
        '<agent-message type="answer" from="Team Leader" message_id="12" question_id="4">\n'
        "Reuse auth.\n"
        "</agent-message>"
    )


@pytest.mark.parametrize(
    "text",
    [
        "plain text",
        "<agent-message>\nx",
        '<agent-message type="bogus" from="a" message_id="1">\nx\n</agent-message>',
        '<agent-message from="a" message_id="1">\nx\n</agent-message>',
    ],
)
def test_parse_rejects_other_text(text: str) -> None:
    with pytest.raises(ValueError):
        parse(text)
