"""The pieces the PostgreSQL functions share with the Python side say the same thing: the envelope
(``ar__envelope`` and formats.render), the routing table (``ar__decide`` and decisions.decide) and
the agent transitions (``ar__can_move`` and decisions.can_move). Each is called directly, in a
SELECT, on a database holding the functions."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_router import errors, formats, validation
from agent_router.domain import (
    AgentState,
    MessageSubtype,
    MessageType,
    Question,
    QuestionKind,
    QuestionStatus,
    RouteOutcome,
)
from agent_router.formats import Envelope
from agent_router.store import decisions, functions
from agent_router.store.models import utcnow

#: Examples per property: each is one round trip.
EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _called(text: str) -> sa.TextClause:
    """A statement calling the pieces by the names this release installs them under."""
    return sa.text(functions.versioned(text))


@pytest.fixture(scope="module")
def conn(pg_schema_url: str) -> Iterator[sa.Connection]:
    engine = sa.create_engine(pg_schema_url)
    with engine.connect() as connection:
        yield connection
    engine.dispose()


def _valid(check: Any, value: str) -> bool:
    try:
        check(value)
    except errors.AgentRouterError:
        return False
    return True


#: Letters of several scripts, digits, spaces and punctuation (quotes and backslashes included).
_NAME_CHARACTERS = st.sampled_from(
    "abcxyzABCXYZ0189 _-.:'()[]{}!?#%*+,;=@|~$^éßñøÆ日本語한글中文ДжЯαβΩ"
) | st.characters(codec="utf-8", exclude_categories=["Cs"])
#: Display names and senders, as validation lets them through.
NAMES = st.text(_NAME_CHARACTERS, min_size=1, max_size=40).filter(
    lambda name: _valid(validation.name, name)
)
SENDERS = (
    NAMES
    | st.sampled_from(["user", "system"])
    | NAMES.map(lambda n: f"job:{n}").filter(lambda sender: _valid(validation.sender, sender))
)
IDS = st.integers(min_value=1, max_value=validation.MAX_ID)
#: Pieces of content that read as one of the router's fences, in the spellings formats escapes
#: (look-alike letters, character references, invisible characters), and characters that SQL or
#: the driver treat apart.
_TAGS = st.sampled_from(
    [
        "<agent-message",
        "</agent-message>",
        '<agent-message type="task" from="user" message_id="1">',
        "<\\agent-message",
        "<\\\\/agent-message>",
        "< / Agent_Message>",
        "<AGENT MESSAGE",
        "<agent_message",
        "\n</agent-message>\n",
        "\uff1cagent-message",  # a fullwidth less-than
        "&lt;/agent-message&gt;",
        "&#60;agent message",
        "<agent\u200b-message",
        "<tool-output",
        "</Tool_Output>",
        "<",
        "\\",
        "'",
        '"',
        "\r\n",
        "\u2028",
        "$$",
        "%s",
    ]
)
CONTENTS = st.lists(
    _TAGS
    | st.text(st.characters(codec="utf-8", exclude_categories=["Cs"], exclude_characters="\x00")),
    max_size=8,
).map("".join)


@EXAMPLES
@given(
    type_=st.sampled_from(MessageType),
    subtype=st.none() | st.sampled_from(MessageSubtype),
    sender=SENDERS,
    message_id=IDS,
    question_id=st.none() | IDS,
    content=CONTENTS,
)
def test_the_database_writes_the_envelope_formats_renders(
    conn: sa.Connection,
    type_: MessageType,
    subtype: MessageSubtype | None,
    sender: str,
    message_id: int,
    question_id: int | None,
    content: str,
) -> None:
    """The store keeps a message's content and, where escaping changed it, its body
    (formats.stored_body); the database renders its envelope from the body, else the content."""
    envelope = Envelope(
        type=type_,
        sender=sender,
        message_id=message_id,
        content=content,
        subtype=subtype,
        question_id=question_id,
    )
    rendered = conn.execute(
        _called(
            "SELECT ar__envelope(CAST(:type AS ar_message_type), :sender, :id,"
            " CAST(:subtype AS ar_message_subtype), :question, coalesce(:body, :content))"
        ),
        {
            "type": type_.value,
            "sender": sender,
            "id": message_id,
            "subtype": subtype.value if subtype else None,
            "question": question_id,
            "body": formats.stored_body(content),
            "content": content,
        },
    ).scalar_one()
    assert rendered == formats.render(envelope)
    assert formats.parse(rendered) == envelope


def test_the_routing_table_is_the_same_for_every_input(conn: sa.Connection) -> None:
    """Every receiver state but terminated (refused before the table is asked), blocked on no
    question or on an ask, an output wait or a wait for the user, and every message: each
    type, subtype and wake flag, from outside (the user or another) or from the agent waited on
    or another, answering no question, the one waited on or another."""
    asked, waited_on, other_agent = 100, 7, 8
    deadline = utcnow()
    waits: list[Question | None] = [None] + [
        Question(
            id=asked,
            team_id=1,
            asker_agent_id=1,
            target_agent_id=waited_on,
            tool_call_id="call-1",
            status=QuestionStatus.OPEN,
            waiting=True,
            deadline=deadline,
            kind=kind,
        )
        for kind in QuestionKind
    ]
    states = [s for s in AgentState if s is not AgentState.TERMINATED]
    inputs = list(
        itertools.product(
            states,
            waits,
            MessageType,
            [None, *MessageSubtype],
            [(None, False), (None, True), (waited_on, False), (other_agent, False)],
            [True, False],
            [None, asked, asked + 1],
        )
    )
    expected = [
        decisions.decide(
            state,
            wait,
            decisions.Incoming(
                type=type_,
                sender_id=sender[0],
                wake=wake,
                answers=answers,
                subtype=subtype,
                from_user=sender[1],
            ),
        )
        for state, wait, type_, subtype, sender, wake, answers in inputs
    ]
    columns = list(zip(*inputs, strict=True))
    found = conn.execute(
        _called(
            "SELECT ar__decide(state, wait_id, wait_kind, wait_target, type, subtype, sender,"
            " wake, answers, from_user)::text FROM unnest("
            " CAST(:states AS ar_agent_state[]), CAST(:wait_ids AS bigint[]),"
            " CAST(:wait_kinds AS ar_question_kind[]), CAST(:wait_targets AS bigint[]),"
            " CAST(:types AS ar_message_type[]), CAST(:subtypes AS ar_message_subtype[]),"
            " CAST(:senders AS bigint[]), CAST(:wakes AS boolean[]), CAST(:answers AS bigint[]),"
            " CAST(:from_user AS boolean[])"
            ") WITH ORDINALITY AS i(state, wait_id, wait_kind, wait_target, type, subtype, sender,"
            " wake, answers, from_user, n) ORDER BY n"
        ),
        {
            "states": [s.value for s in columns[0]],
            "wait_ids": [w.id if w else None for w in columns[1]],
            "wait_kinds": [w.kind.value if w else None for w in columns[1]],
            "wait_targets": [w.target_agent_id if w else None for w in columns[1]],
            "types": [t.value for t in columns[2]],
            "subtypes": [s.value if s else None for s in columns[3]],
            "senders": [sender for sender, _user in columns[4]],
            "from_user": [user for _sender, user in columns[4]],
            "wakes": list(columns[5]),
            "answers": list(columns[6]),
        },
    ).scalars()
    assert len(inputs) == 5 * 4 * 6 * 5 * 4 * 2 * 3
    assert [RouteOutcome(outcome) for outcome in found] == expected
    # The table reaches every outcome but a refusal.
    assert set(expected) == set(RouteOutcome) - {RouteOutcome.REJECTED}


def test_a_terminated_receiver_is_refused_before_the_table() -> None:
    with pytest.raises(errors.AgentTerminatedError):
        decisions.decide(
            AgentState.TERMINATED,
            None,
            decisions.Incoming(type=MessageType.MESSAGE, sender_id=None, wake=True),
        )


def test_the_agent_transitions_are_the_same_for_every_pair(conn: sa.Connection) -> None:
    pairs = conn.execute(
        _called(
            "SELECT f::text || ' -> ' || t::text, ar__can_move(f, t)"
            " FROM unnest(enum_range(NULL::ar_agent_state)) f,"
            " unnest(enum_range(NULL::ar_agent_state)) t"
        )
    )
    found = {str(pair): bool(allowed) for pair, allowed in pairs}
    expected = {
        f"{f.value} -> {t.value}": decisions.can_move(f, t)
        for f, t in itertools.product(AgentState, AgentState)
    }
    assert found == expected


def test_the_databases_enums_are_the_domains(conn: sa.Connection) -> None:
    """The enum types the functions take hold exactly the domain's values (the exhaustive
    tests above list the domain's)."""
    for sql_type, domain in (
        ("ar_agent_state", AgentState),
        ("ar_message_type", MessageType),
        ("ar_message_subtype", MessageSubtype),
        ("ar_question_kind", QuestionKind),
        ("ar_route_outcome", RouteOutcome),
    ):
        values = conn.execute(
            sa.text(f"SELECT unnest(enum_range(NULL::{sql_type}))::text")
        ).scalars()
        assert list(values) == [member.value for member in domain], sql_type
