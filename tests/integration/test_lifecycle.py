"""Storage lifecycle on both backends: deleting a team removes every row it owns and its wake
keys, fences its queued and running turns, and leaves other teams untouched; ``prune`` removes
finished teams and old published outbox rows, and a dry run counts exactly what a real run
deletes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from agent_router import (
    AgentState,
    MessageType,
    Router,
    Settings,
    StaleTurnError,
    UnknownAgentError,
    UnknownTeamError,
)
from agent_router.constants import wake_key
from agent_router.outbox import RecordingPublisher
from agent_router.store.models import Base
from agent_router.waker import RedisWaker

from .helpers import assistant, start_running, start_waiting, tool_call


@pytest.fixture(params=["sqlite", "postgresql"])
def own_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of the test's own: a prune sees every team in it."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lifecycle.db'}"
    return str(request.getfixturevalue("fresh_pg_url"))


@pytest.fixture
def router(own_database: str, redis_url: str) -> Iterator[Router]:
    r = Router(
        Settings(database_url=own_database, work_seconds=0),
        publisher=RecordingPublisher(),
        waker=RedisWaker(redis_url),
    )
    r.create_schema()
    yield r
    r.close()


def _rows(router: Router) -> dict[str, int]:
    with router.store.engine.connect() as conn:
        return {
            t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in Base.metadata.sorted_tables
        }


def _busy_team(router: Router) -> tuple[int, int, Any]:
    """A team with a blocked ask (open question, wake key), a running turn, pending mail and a
    scheduled agent: returns the team, the scheduled agent's id and the running turn."""
    team = router.create_team()
    for role in ("Engineer", "Designer", "Writer"):
        router.create_agent(team.id, role=role)
    start_waiting(router, team.id, "Engineer_1", "Team Leader")
    (question,) = [m.question_id for m in router.messages(team.id) if m.question_id]
    assert question is not None
    router.waker.notify(question, "left")  # a wake key left in Redis
    running = start_running(router, team.id, "Designer_1")
    router.send(team.id, to="Writer_1", content="draft it", type=MessageType.TASK)
    return team.id, router.agent(team.id, "Writer_1").id, running


def test_deleting_a_team_removes_everything_it_owns_and_nothing_else(
    router: Router, redis_url: str
) -> None:
    other = router.create_team()
    router.create_agent(other.id, role="Engineer")
    router.send(other.id, to="Engineer_1", content="keep me")
    kept = (router.messages(other.id), router.agents(other.id), router.ledger(other.id))
    before = _rows(router)
    team_id, scheduled_id, running = _busy_team(router)
    (question,) = {m.question_id for m in router.messages(team_id) if m.question_id}
    assert question is not None

    dry = router.delete_team(team_id, dry_run=True)
    assert dry.dry_run and dry.teams == (team_id,) and dry.total > 10
    assert router.team(team_id).id == team_id  # nothing deleted

    deletion = router.delete_team(team_id)
    assert deletion.rows == dry.rows and deletion.questions == (question,)
    assert _rows(router) == before  # every row of the team is gone, the other team's stay
    assert (router.messages(other.id), router.agents(other.id), router.ledger(other.id)) == kept
    client = redis.Redis.from_url(redis_url)
    assert not client.exists(wake_key(question))
    client.close()
    with pytest.raises(UnknownTeamError):
        router.team(team_id)
    with pytest.raises(UnknownAgentError):  # a queued turn task claims nothing
        router.claim(scheduled_id)
    with pytest.raises(StaleTurnError):  # a running turn writes nothing more
        running.append_assistant(assistant("still here?"))
    with pytest.raises(UnknownTeamError):
        router.delete_team(team_id)


def test_prune_removes_finished_teams_and_published_outbox_rows(router: Router) -> None:
    finished = router.create_team()
    router.create_agent(finished.id, role="Engineer")
    turn = start_running(router, finished.id, "Engineer_1")
    turn.append_assistant(assistant(None, tool_call("c1")))
    turn.append_tool_result("c1", "done")
    turn.append_assistant(assistant("all done"))
    turn.end()
    assert router.agent(finished.id, "Engineer_1").state is AgentState.COMPLETED
    busy_id, _, _ = _busy_team(router)
    router.publish_outbox(RecordingPublisher())
    outbox_before = len(router.outbox(busy_id))

    dry = router.prune(older_than_seconds=0, dry_run=True)
    assert dry.teams == (finished.id,)
    assert router.team(finished.id).id == finished.id  # a dry run deletes nothing
    pruned = router.prune(older_than_seconds=0)
    assert pruned.teams == dry.teams and pruned.rows == dry.rows
    with pytest.raises(UnknownTeamError):
        router.team(finished.id)
    assert router.agent(busy_id, "Designer_1").state is AgentState.RUNNING  # kept
    assert len(router.outbox(busy_id)) < outbox_before  # its published rows went
    assert router.prune(older_than_seconds=3600).total == 0  # nothing that old left


def test_repeated_refusals_share_one_ledger_row(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    ledger = len(router.ledger(team.id))
    for _ in range(5):
        with pytest.raises(UnknownAgentError):
            router.send(team.id, to="Nobody_1", content="hello?")
    with pytest.raises(UnknownAgentError):  # another receiver: a row of its own
        router.send(team.id, to="Nobody_2", content="hello?")
    rows = router.ledger(team.id)[ledger:]
    assert [(e.detail["to"], e.detail.get("repeats", 1)) for e in rows] == [
        ("Nobody_1", 5),
        ("Nobody_2", 1),
    ]
