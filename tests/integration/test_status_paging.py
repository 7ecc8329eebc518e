"""``status`` reads: a page at a time, filtered by state, and any number of agents (the page is a
subquery, never a list of bound ids), on both backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from agent_router import AgentState, MessageType, Router, Settings
from agent_router.outbox import RecordingPublisher
from agent_router.store.models import AgentRow, utcnow


@pytest.fixture
def router(database_url: str) -> Iterator[Router]:
    r = Router(Settings(database_url=database_url), publisher=RecordingPublisher())
    yield r
    r.close()


def test_status_pages_and_filters(router: Router) -> None:
    team = router.create_team()
    for role in ("Engineer", "Designer", "Writer", "Tester", "Analyst", "Critic"):
        router.create_agent(team.id, role=role)
    for name in ("Designer_1", "Tester_1"):
        router.send(team.id, to=name, content="go", type=MessageType.TASK)
        router.send(team.id, to=name, content="and this", wake=False)
    reads = router.store.reads
    everyone = [s.agent.id for s in reads.agent_statuses(team.id)]
    assert len(everyone) == 7
    pages: list[list[int]] = []
    after = 0
    while page := reads.agent_statuses(team.id, after_id=after, limit=3):
        pages.append([s.agent.id for s in page])
        after = page[-1].agent.id
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [i for p in pages for i in p] == everyone
    scheduled = reads.agent_statuses(team.id, states=[AgentState.SCHEDULED], limit=1)
    assert [(s.agent.display_name, s.agent.mailbox_depth) for s in scheduled] == [("Designer_1", 2)]
    rest = reads.agent_statuses(
        team.id, states=[AgentState.SCHEDULED], after_id=scheduled[0].agent.id
    )
    assert [(s.agent.display_name, s.agent.mailbox_depth) for s in rest] == [("Tester_1", 2)]


@pytest.fixture(params=["sqlite", "postgresql"])
def own_router(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Router]:
    """A database of the test's own: the agents it adds leave no other test slower."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'many.db'}"
    else:
        url = str(request.getfixturevalue("fresh_pg_url"))
    r = Router(Settings(database_url=url))
    r.create_schema()
    yield r
    r.close()


def test_status_of_more_agents_than_a_statement_can_bind(own_router: Router) -> None:
    router = own_router
    team = router.create_team()
    now = utcnow()
    rows = [
        {
            "team_id": team.id,
            "display_name": f"Worker_{i}",
            "role": "Worker",
            "state": AgentState.IDLE,
            "created_at": now,
        }
        for i in range(1, 66_001)
    ]
    with router.store.engine.begin() as conn:
        conn.execute(sa.insert(AgentRow), rows)
    statuses = router.store.reads.agent_statuses(team.id)
    assert len(statuses) == 66_001
    page = router.store.reads.agent_statuses(team.id, states=[AgentState.IDLE], limit=200)
    assert [s.agent.display_name for s in page[:2]] == ["Team Leader", "Worker_1"]
    assert len(page) == 200 and page[-1].agent.display_name == "Worker_199"
