"""Bad input gets a typed error and changes nothing but (where a team exists) the ledger."""

from __future__ import annotations

from typing import Any

import pytest

from agent_router import (
    AgentRouterError,
    ContentTooLargeError,
    DuplicateDisplayNameError,
    InvalidMessageError,
    LedgerAction,
    MessageType,
    QuestionClosedError,
    RefusedError,
    ReservedNameError,
    Router,
    Settings,
    UnknownAgentError,
    UnknownQuestionError,
    UnknownTeamError,
)
from agent_router.errors import (
    AskRefusedError,
    InvalidArgumentError,
    InvalidNameError,
    WrongQuestionError,
)
from agent_router.store import refusals

from .helpers import assistant, start_running, start_waiting, tool_call


def _snapshot(router: Router, team_id: int) -> tuple[Any, ...]:
    return (
        router.messages(team_id),
        router.agents(team_id),
        router.outbox(team_id),
        {
            a.display_name: router.transcript(team_id, a.display_name)
            for a in router.agents(team_id)
        },
    )


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"to": "Engineer_1", "content": ""}, InvalidMessageError),
        ({"to": "Engineer_1", "content": "   \n"}, InvalidMessageError),
        ({"to": "Engineer_1", "content": 42}, InvalidMessageError),
        ({"to": "Engineer_1", "content": None}, InvalidMessageError),
        ({"to": "Engineer_1", "content": "x" * 2049}, ContentTooLargeError),
        ({"to": "Engineer_1", "content": "é" * 1025}, ContentTooLargeError),  # 2050 bytes
        ({"to": "Engineer_1", "content": "nul\x00byte"}, InvalidMessageError),
        ({"to": "Engineer_1", "content": "lone \ud800 surrogate"}, InvalidMessageError),
        ({"to": "Engineer_1", "content": "hi", "type": "shout"}, InvalidMessageError),
        ({"to": "Engineer_1", "content": "hi", "subtype": "whatever"}, InvalidMessageError),
        ({"to": "Engineer_1", "content": "hi", "wake": "yes"}, InvalidMessageError),
        ({"to": "Engineer_1", "content": "hi", "dedup_key": ""}, InvalidMessageError),
        ({"to": "Engineer_1", "content": "hi", "question_id": "7"}, InvalidMessageError),
        ({"to": 7, "content": "hi"}, InvalidMessageError),
        ({"to": "Engineer_9", "content": "hi"}, UnknownAgentError),
        ({"to": "Engineer_1", "content": "hi", "sender": "Team Leadr"}, UnknownAgentError),
        ({"to": "Engineer_1", "content": "hi", "sender": "Engineer_1"}, InvalidMessageError),
        ({"to": "Engineer_1", "content": "hi", "type": MessageType.ANSWER}, InvalidMessageError),
        (
            {
                "to": "Engineer_1",
                "content": "hi",
                "type": MessageType.ANSWER,
                "question_id": 999999,
            },
            UnknownQuestionError,
        ),
    ],
)
def test_malformed_send_is_refused_and_changes_nothing(
    database_url: str, kwargs: dict[str, Any], error: type[AgentRouterError]
) -> None:
    router = Router(Settings(database_url=database_url, max_content_bytes=2048))
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    before = _snapshot(router, team.id)
    ledger = len(router.ledger(team.id))
    kwargs.setdefault("sender", "Team Leader")
    with pytest.raises(error):
        router.send(team.id, **kwargs)
    assert _snapshot(router, team.id) == before
    new_events = router.ledger(team.id)[ledger:]
    assert [e.action for e in new_events] == [LedgerAction.SEND_REJECTED]
    assert issubclass(error, RefusedError)
    router.close()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"task": "x" * 2049}, ContentTooLargeError),
        ({"task": " "}, InvalidMessageError),
        ({"task": "hi", "sender": "Team Leadr"}, UnknownAgentError),
        ({"task": "hi", "display_name": "Team Leader"}, DuplicateDisplayNameError),
        ({"task": "hi", "role": "job:ci"}, InvalidMessageError),
    ],
)
def test_agent_with_a_refused_task_is_not_created(
    database_url: str, kwargs: dict[str, Any], error: type[AgentRouterError]
) -> None:
    """A sub-agent and its first task are one transaction: a refusal of either leaves neither."""
    router = Router(Settings(database_url=database_url, max_content_bytes=2048))
    team = router.create_team()
    before = _snapshot(router, team.id)
    kwargs = {"role": "Engineer", "sender": "Team Leader", **kwargs}
    with pytest.raises(error):
        router.create_agent_with_task(team.id, **kwargs)
    assert _snapshot(router, team.id) == before
    assert LedgerAction.AGENT_CREATED not in {e.action for e in router.ledger(team.id)[1:]}
    assert router.create_agent(team.id, role="Engineer").display_name == "Engineer_1"
    router.close()


def test_unknown_team(router: Router) -> None:
    with pytest.raises(UnknownTeamError):
        router.send(987654, to="Team Leader", content="hi")
    with pytest.raises(InvalidArgumentError):  # a wrong type, on both backends
        router.send("1", to="Team Leader", content="hi")  # type: ignore[arg-type]
    with pytest.raises(UnknownTeamError):
        router.create_agent(987654, role="Engineer")
    with pytest.raises(UnknownTeamError):
        router.agent(987654, "Team Leader")


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("ui operator 1", "UI Operator_1"),  # the same letters and digits
        ("full-stack engineer", "Full-Stack Engineer_1"),  # the start of a name
        ("TEAM-LEADER!", "Team Leader"),
        ("Designer_9", None),  # nothing close
        ("ui", None),  # too short to stand for a name
    ],
)
def test_an_unknown_agent_name_says_the_agent_it_was_probably_meant_for(
    router: Router, given: str, meant: str | None
) -> None:
    """The same sentence on both databases, in the refusal and in its ledger event."""
    team = router.create_team()
    router.create_agent(team.id, role="UI Operator")
    router.create_agent(team.id, role="Full-Stack Engineer")
    said = f"no agent {given!r} in team {team.id}" + (f"; did you mean {meant!r}?" if meant else "")
    with pytest.raises(UnknownAgentError) as sent:
        router.send(team.id, to=given, content="hi")
    assert str(sent.value) == said
    rejected = [e for e in router.ledger(team.id) if e.action is LedgerAction.SEND_REJECTED]
    assert rejected[-1].detail["refused"] == "unknown_agent"
    assert refusals.sentence(rejected[-1].detail) == said
    with pytest.raises(UnknownAgentError) as read:
        router.agent(team.id, given)
    assert str(read.value) == said


def test_duplicate_and_malformed_display_names(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer", display_name="Bob")
    before = router.agents(team.id)
    with pytest.raises(DuplicateDisplayNameError):
        router.create_agent(team.id, role="Engineer", display_name="Bob")
    with pytest.raises(DuplicateDisplayNameError):
        router.create_agent(team.id, role="Engineer", display_name="Team Leader")
    for bad in ("", ' quoted"', "new\nline", "user", "system", "job:build"):
        with pytest.raises(InvalidMessageError):
            router.create_agent(team.id, role="Engineer", display_name=bad)
    with pytest.raises(InvalidMessageError):
        router.create_agent(team.id, role="")
    with pytest.raises(InvalidMessageError):
        router.create_agent(team.id, role="job:ci")
    assert router.agents(team.id) == before
    # Counting per role skips a taken name.
    router.create_agent(team.id, role="Engineer", display_name="Engineer_1")
    assert router.create_agent(team.id, role="Engineer").display_name == "Engineer_2"
    assert router.create_agent(team.id, role="Designer").display_name == "Designer_1"


def test_an_id_beyond_64_bits_is_one_typed_error_on_both_databases(router: Router) -> None:
    """A store call given an integer no column holds: the same error on both databases (SQLite's
    driver cannot send it; PostgreSQL would look for a function taking ``numeric``), in the
    router's words."""
    from agent_router.errors import StoreError
    from agent_router.store.faults import OUT_OF_RANGE

    with pytest.raises(StoreError) as refused:
        router.store.budget(10**23)
    assert str(refused.value) == OUT_OF_RANGE


def test_a_transcript_position_beyond_its_column_is_one_typed_error_on_both_databases(
    router: Router,
) -> None:
    """Positions are 32-bit on both databases: a start beyond is refused before it is sent (on
    PostgreSQL the comparison with a wider value would fail; SQLite would answer)."""
    team = router.create_team()
    lead = router.agent(team.id, "Team Leader")
    assert router.reads.transcript_entries(lead.id, start=2**31 - 1) == []
    for start in (2**31, 2**63 - 1):
        with pytest.raises(InvalidArgumentError, match="start must be between"):
            router.reads.transcript_entries(lead.id, start=start)


def test_a_role_as_long_as_the_boundary_allows_is_one_the_store_takes(router: Router) -> None:
    """One limit for a role, read by the boundary and the store alike: the longest role the
    boundary passes makes an agent (its display name ``{role}_{n}`` fits a name), one
    character more is refused by the boundary, with one typed error and nothing written."""
    from agent_router.validation import MAX_NAME_CHARS, MAX_ROLE_CHARS

    team = router.create_team()
    for length in (150, MAX_ROLE_CHARS):
        role = "R" * length
        agent = router.create_agent(team.id, role=role)
        assert (agent.role, agent.display_name) == (role, f"{role}_1")
        assert len(agent.display_name) <= MAX_NAME_CHARS
        with_task, _ = router.create_agent_with_task(team.id, role=role, task="go")
        assert with_task.display_name == f"{role}_2"
    before = (router.agents(team.id), router.ledger(team.id))
    with pytest.raises(InvalidNameError, match="at most"):
        router.create_agent(team.id, role="R" * (MAX_ROLE_CHARS + 1))
    assert (router.agents(team.id), router.ledger(team.id)) == before


@pytest.mark.parametrize(
    "name",
    [
        "System",
        "USER",
        "s y s t e m",
        "team-leader",
        "Job: deploy",
        "\u0405\u0423\u0405\u0422\u0415\u041c",
    ],
)
def test_a_name_that_reads_as_the_routers_own_is_reserved(router: Router, name: str) -> None:
    """The router's own senders and the lead's name, in any case or spacing or in look-alike
    letters (the last is SYSTEM in Cyrillic capitals): one typed error, nothing written."""
    team = router.create_team()
    before = (router.agents(team.id), router.ledger(team.id))
    with pytest.raises(ReservedNameError, match="is reserved"):
        router.create_agent(team.id, role="Engineer", display_name=name)
    with pytest.raises(ReservedNameError):
        router.create_agent_with_task(team.id, role="Engineer", display_name=name, task="hi")
    assert (router.agents(team.id), router.ledger(team.id)) == before


def test_answers_that_do_not_fit_are_refused(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    router.create_agent(team.id, role="Designer")
    start_waiting(router, team.id, "Engineer_1", "Team Leader")
    qid = next(m for m in router.messages(team.id) if m.type is MessageType.ASK).question_id
    with pytest.raises(WrongQuestionError):
        router.send(
            team.id,
            to="Designer_1",
            content="a",
            sender="Team Leader",
            type=MessageType.ANSWER,
            question_id=qid,
        )
    router.send(
        team.id,
        to="Engineer_1",
        content="yes",
        sender="Team Leader",
        type=MessageType.ANSWER,
        question_id=qid,
    )
    before = _snapshot(router, team.id)
    with pytest.raises(QuestionClosedError):  # answering twice
        router.send(
            team.id,
            to="Engineer_1",
            content="yes again",
            sender="Team Leader",
            type=MessageType.ANSWER,
            question_id=qid,
        )
    assert _snapshot(router, team.id) == before


def test_refused_asks_change_nothing(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    router.create_agent(team.id, role="Designer")
    turn = start_running(router, team.id, "Engineer_1")
    turn.append_assistant(assistant(None, tool_call("q1", "ask_other_agent")))
    before = _snapshot(router, team.id)
    with pytest.raises(AskRefusedError):
        turn.ask("Engineer_1", "me?", tool_call_id="q1")
    with pytest.raises(AskRefusedError):
        turn.ask("Nobody_3", "you?", tool_call_id="q1")
    with pytest.raises(InvalidMessageError):
        turn.ask("Designer_1", "", tool_call_id="q1")
    assert _snapshot(router, team.id) == before
    router.terminate(team.id, "Designer_1", reason="done")
    before = _snapshot(router, team.id)
    with pytest.raises(AskRefusedError):
        turn.ask("Designer_1", "you?", tool_call_id="q1")
    assert _snapshot(router, team.id) == before
