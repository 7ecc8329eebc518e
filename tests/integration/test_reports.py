"""Nothing a sub-agent produces is dropped, and ``check_team`` reports what failed quietly:
an oversize or unstorable report reaches the lead; a refused one fails the turn and shows in the
check; failed turns and idle agents sitting on wake messages are reported."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from agent_router import (
    Agent,
    AgentState,
    LedgerAction,
    MessageSubtype,
    MessageType,
    RefusedError,
    Router,
    Settings,
)
from agent_router.agents.loop import TurnOutcome, run_turn
from agent_router.agents.tools import default_registry
from agent_router.formats import report_parts
from agent_router.ops.checks import check_team
from agent_router.ops.explain import describe
from agent_router.outbox import RecordingPublisher
from agent_router.store.models import MessageRow

LIMIT = 2048


class Says:
    """A model whose only reply is ``text``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        return {"role": "assistant", "content": self.text}


@pytest.fixture
def router(database_url: str) -> Iterator[Router]:
    settings = Settings(database_url=database_url, max_content_bytes=LIMIT, work_seconds=0)
    r = Router(settings, publisher=RecordingPublisher())
    yield r
    r.close()


def _sub_agent_says(router: Router, text: str) -> tuple[int, Agent, TurnOutcome]:
    team = router.create_team()
    agent, _ = router.create_agent_with_task(
        team.id, role="Engineer", task="Write it up.", sender="Team Leader"
    )
    turn = router.claim(agent.id)
    assert turn is not None
    outcome = run_turn(router, turn, models=lambda a: Says(text), tools=default_registry())
    return team.id, agent, outcome


def _reports(router: Router, team_id: int) -> list[Any]:
    return [
        m
        for m in router.messages(team_id)
        if m.subtype is MessageSubtype.COMPLETION_REPORT and m.target_name == "Team Leader"
    ]


def test_an_oversize_report_reaches_the_lead_whole_in_parts(router: Router) -> None:
    # Three and a half limits of multi-byte text with line breaks: no part may split a
    # character, and the lead gets every byte.
    text = "\n".join(f"finding {i}: ünïcödé ✓ " + "x" * (i % 50) for i in range(160))
    assert len(text.encode()) > 3 * LIMIT
    team_id, _agent, outcome = _sub_agent_says(router, text)
    assert outcome is TurnOutcome.ENDED
    parts = _reports(router, team_id)
    assert len(parts) >= 4
    assert all(len(m.content.encode()) <= LIMIT for m in parts)
    assert [m.wake for m in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(m.content.split("\n", 1)[1] for m in parts) == text
    assert parts[0].content.startswith(f"[part 1/{len(parts)}]\n")
    assert router.agent(team_id, "Team Leader").state is AgentState.SCHEDULED  # woken once
    assert check_team(router, team_id).ok


def test_a_report_with_nul_and_a_lone_surrogate_is_delivered(router: Router) -> None:
    team_id, agent, outcome = _sub_agent_says(router, "result\x00 is \ud800 fine")
    assert outcome is TurnOutcome.ENDED
    (report,) = _reports(router, team_id)
    assert report.content == "result\ufffd is \ufffd fine"
    transcript = router.transcript(team_id, agent.display_name)
    assert transcript[-1]["content"] == "result\ufffd is \ufffd fine"


def test_a_refused_output_of_an_agent_shows_in_the_check(router: Router) -> None:
    team = router.create_team()
    agent, _ = router.create_agent_with_task(
        team.id, role="Engineer", task="Write it up.", sender="Team Leader"
    )
    router.terminate(team.id, agent.display_name, reason="closed by the lead")
    with pytest.raises(RefusedError):  # what a report written after the termination meets
        router.send(
            team.id,
            to="Team Leader",
            content="my findings",
            sender=agent.display_name,
            type=MessageType.OUTPUT,
            subtype=MessageSubtype.COMPLETION_REPORT,
        )
    report = check_team(router, team.id, quiescent=True)
    assert report.undelivered_reports == 1
    assert not report.ok
    assert report.failures[0] == (
        f"{agent.display_name}: completion_report to Team Leader refused: "
        f"sender {agent.display_name!r} is terminated"
    )
    refused = [e for e in router.ledger(team.id) if e.action is LedgerAction.SEND_REJECTED]
    assert describe(refused[-1], {}) == (
        f"x output from {agent.display_name} to Team Leader refused: "
        f"sender {agent.display_name!r} is terminated"
    )


def test_report_parts_keep_every_character() -> None:
    for text in ("a" * 5000, "é" * 3000, "✓\n" * 2000, "😀" * 1500):
        parts = report_parts(text, 1000)
        assert all(len(p.encode()) <= 1000 for p in parts)
        assert "".join(p.split("\n", 1)[1] for p in parts) == text
    assert report_parts("short", 1000) == ["short"]


def test_check_reports_an_idle_agent_holding_a_wake_message(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    delivery = router.send(
        team.id, to="Engineer_1", content="fyi", sender="Team Leader", wake=False
    )
    assert check_team(router, team.id, quiescent=True).ok  # a notice waits for the next turn
    # A wake message no turn will take (what a lost enqueue without a sweeper leaves behind).
    with router.store.engine.begin() as conn:
        conn.execute(
            sa.update(MessageRow).where(MessageRow.id == delivery.message_id).values(wake=True)
        )
    report = check_team(router, team.id, quiescent=True)
    assert report.idle_with_wake == 1
    assert not report.ok


def test_check_accepts_messages_a_stop_kept(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    router.send(team.id, to="Engineer_1", content="work", sender="Team Leader")
    assert router.stop(team.id, "Engineer_1", reason="hold on") is AgentState.IDLE
    report = check_team(router, team.id, quiescent=True)
    assert report.ok, report.violations
    assert report.pending == 1
    assert [m.type for m in router.messages(team.id)] == [MessageType.MESSAGE]
