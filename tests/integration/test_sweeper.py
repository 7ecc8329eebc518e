"""The sweeper repairs what crashes and lost signals leave: expired leases, lost turn tasks,
unpublished outbox rows, overdue questions."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session

from agent_router import (
    AgentState,
    LedgerAction,
    MessageType,
    QuestionStatus,
    Router,
    Settings,
    StaleTurnError,
    TurnTrigger,
)
from agent_router.broker import CeleryPublisher, create_app
from agent_router.domain import OutboxKind
from agent_router.ops.checks import check_team
from agent_router.outbox import RecordingPublisher
from agent_router.store.models import AgentRow, OutboxRow
from agent_router.store.recovery import BACKLOG_WINDOWS

from .helpers import assistant, start_running, tool_call

FAST: dict[str, Any] = {"lease_seconds": 0.3, "heartbeat_seconds": 0.1, "sweep_seconds": 0.1}


@pytest.fixture
def fast_router(database_url: str) -> Iterator[Router]:
    router = Router(Settings(database_url=database_url, **FAST), publisher=RecordingPublisher())
    yield router
    router.close()


def _wait_past(seconds: float) -> None:
    time.sleep(seconds * 1.5)


def _count(router: Router, team_id: int, action: LedgerAction) -> int:
    # The sweeper is global (other tests' teams share the PostgreSQL database): count this team's.
    return sum(1 for e in router.ledger(team_id) if e.action is action)


def test_expired_lease_is_taken_over_and_recovered(fast_router: Router) -> None:
    router = fast_router
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    dead = start_running(router, team.id, "Engineer_1")
    dead.append_assistant(assistant(None, tool_call("c1")))
    _wait_past(FAST["lease_seconds"])
    router.sweep()
    assert _count(router, team.id, LedgerAction.TAKE_OVER) == 1
    agent = router.agent(team.id, "Engineer_1")
    assert (agent.state, agent.pending_trigger) == (AgentState.SCHEDULED, TurnTrigger.RECOVERY)
    with pytest.raises(StaleTurnError):
        dead.append_tool_result("c1", "too late")
    assert dead.heartbeat() is False
    recovery = router.claim_turn(team.id, "Engineer_1")
    assert recovery is not None and recovery.trigger is TurnTrigger.RECOVERY
    assert router.transcript(team.id, "Engineer_1")[-1]["content"].startswith("interrupted")
    recovery.append_assistant(assistant("recovered"))
    recovery.end()
    router.sweep()
    assert _count(router, team.id, LedgerAction.TAKE_OVER) == 1
    assert check_team(router, team.id, quiescent=True).ok


def test_heartbeat_keeps_a_live_turn(fast_router: Router) -> None:
    router = fast_router
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    turn = start_running(router, team.id, "Engineer_1")
    for _ in range(4):
        time.sleep(FAST["lease_seconds"] / 3)
        assert turn.heartbeat() is True
        router.sweep()
        assert _count(router, team.id, LedgerAction.TAKE_OVER) == 0
    assert router.agent(team.id, "Engineer_1").state is AgentState.RUNNING


def test_dead_asker_is_suspended_and_resumed_by_the_answer(fast_router: Router) -> None:
    router = fast_router
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    turn = start_running(router, team.id, "Engineer_1")
    turn.append_assistant(assistant(None, tool_call("ask-1", "ask_master"), tool_call("c2")))
    q = turn.ask("Team Leader", "which db?", tool_call_id="ask-1")
    _wait_past(FAST["lease_seconds"])
    router.sweep()
    assert _count(router, team.id, LedgerAction.TAKE_OVER) == 1
    agent = router.agent(team.id, "Engineer_1")
    assert (agent.state, agent.suspended) == (AgentState.WAITING, True)
    assert router.question(q.id).status is QuestionStatus.OPEN
    # The blocked ask stays open; the call after it has not run, so it gets no result yet.
    assert router.store.reads.open_tool_calls(agent.id) == ["ask-1", "c2"]
    router.send(
        team.id,
        to="Engineer_1",
        content="postgres",
        sender="Team Leader",
        type=MessageType.ANSWER,
        question_id=q.id,
    )
    cont = router.claim_turn(team.id, "Engineer_1")
    assert cont is not None and cont.trigger is TurnTrigger.CONTINUATION
    assert cont.open_tool_calls() == ["c2"]


def test_lost_turn_task_is_reenqueued_once(fast_router: Router) -> None:
    router = fast_router
    publisher = router.publisher
    assert isinstance(publisher, RecordingPublisher)
    team = router.create_team()
    agent = router.create_agent(team.id, role="Engineer")
    router.send(team.id, to="Engineer_1", content="go", sender="Team Leader")
    epoch = router.agent(team.id, "Engineer_1").epoch
    published = len(publisher.entries)  # ...and the broker lost that task
    router.sweep()
    assert _count(router, team.id, LedgerAction.REENQUEUED) == 0  # too early: may be queued
    _wait_past(FAST["lease_seconds"])
    router.sweep()
    assert _count(router, team.id, LedgerAction.REENQUEUED) == 1
    again = [e for e in publisher.entries[published:] if e.agent_id == agent.id]
    assert [(e.kind, e.agent_id, e.epoch) for e in again] == [
        (OutboxKind.ENQUEUE_TURN, agent.id, epoch)
    ]
    assert router.claim(agent.id, epoch) is not None
    assert router.claim(agent.id, epoch) is None  # the original, if it reappears, is a no-op


def test_unpublished_outbox_rows_are_published_by_the_sweeper(database_url: str) -> None:
    settings = Settings(database_url=database_url, **FAST)
    offline = Router(settings, publisher=None)  # committed; the process died before publishing
    team = offline.create_team()
    offline.create_agent(team.id, role="Engineer")
    offline.send(team.id, to="Engineer_1", content="durable", sender="Team Leader")
    offline.close()
    publisher = RecordingPublisher()
    sweeper = Router(settings, publisher=publisher)
    # Past the lease too: the agent has been `scheduled` long enough to look lost, but its task
    # is only now published by this sweep, so the same pass must not re-enqueue it as well.
    _wait_past(FAST["lease_seconds"])
    sweeper.sweep()
    mine = [e for e in publisher.entries if e.agent_id == sweeper.agent(team.id, "Engineer_1").id]
    assert len(mine) == 1
    assert _count(sweeper, team.id, LedgerAction.REENQUEUED) == 0
    assert all(e.id not in {u.id for u in sweeper.store.reads.unpublished()} for e in mine)
    sweeper.close()


def test_concurrent_sweepers_publish_a_lost_row_once(database_url: str) -> None:
    """Every worker runs a sweeper timer: two passes at the same instant must not both publish
    the same lost outbox row (each takes its rows; the other skips them)."""
    settings = Settings(database_url=database_url, **FAST)
    offline = Router(settings, publisher=None)  # commits, never publishes: every enqueue is "lost"
    team = offline.create_team()
    names = [offline.create_agent(team.id, role="Engineer").display_name for _ in range(8)]
    ours = {offline.agent(team.id, n).id for n in names}
    sweepers = [Router(settings, publisher=RecordingPublisher()) for _ in range(2)]
    for _round in range(12):
        for name in names:  # one lost enqueue per agent and round
            offline.send(team.id, to=name, content="go", sender="user")
        _wait_past(FAST["sweep_seconds"])  # as a sweeper sees them: older than a period
        barrier = threading.Barrier(2)

        def sweep(router: Router, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            router.publish_outbox(older_than_seconds=FAST["sweep_seconds"])

        threads = [threading.Thread(target=sweep, args=(r,)) for r in sweepers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for name in names:  # back to idle for the next round's enqueue
            turn = offline.claim_turn(team.id, name)
            assert turn is not None
            turn.drain()
            turn.append_assistant(assistant("ok"))
            turn.end()
    published = Counter(
        e.id
        for r in sweepers
        for e in r.publisher.entries  # type: ignore[union-attr]
        if e.agent_id in ours
    )
    lost = {e.id for e in offline.outbox(team.id)}
    assert set(published) == lost  # every lost row published...
    assert [row for row, n in published.items() if n > 1] == []  # ...exactly once
    for r in (offline, *sweepers):
        r.close()


def test_overdue_questions_expire_on_sweep(fast_router: Router) -> None:
    router = fast_router
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    turn = start_running(router, team.id, "Engineer_1")
    turn.append_assistant(assistant(None, tool_call("ask-1", "ask_master")))
    q = turn.ask("Team Leader", "hello?", tool_call_id="ask-1", timeout_seconds=0.1)
    assert turn.suspend() is True
    _wait_past(0.1)
    router.sweep()
    assert _count(router, team.id, LedgerAction.QUESTION_EXPIRED) == 1
    assert router.question(q.id).status is QuestionStatus.EXPIRED
    agent = router.agent(team.id, "Engineer_1")
    assert (agent.state, agent.pending_trigger) == (AgentState.SCHEDULED, TurnTrigger.CONTINUATION)


def _age(router: Router, agent_id: int, seconds: float) -> None:
    """Move the agent's schedule and its publishes ``seconds`` into the past (a backlog that
    long, without waiting for it)."""
    back = timedelta(seconds=seconds)
    with Session(router.store.engine) as session, session.begin():
        for row in session.scalars(sa.select(OutboxRow).where(OutboxRow.agent_id == agent_id)):
            if row.published_at is not None:
                row.published_at -= back
        agent = session.get(AgentRow, agent_id)
        assert agent is not None and agent.scheduled_at is not None
        agent.scheduled_at -= back


def test_a_scheduled_agent_is_reenqueued_with_backoff(database_url: str) -> None:
    """Under a backlog the task is most likely still queued: re-enqueues come after 1, 2, 4, ...
    delivery windows, not once per window."""
    router = Router(Settings(database_url=database_url), publisher=RecordingPublisher())
    lease = router.settings.lease_seconds
    team = router.create_team()
    agent = router.create_agent(team.id, role="Engineer")
    router.send(team.id, to="Engineer_1", content="go", sender="Team Leader")
    reenqueued = []
    for waited in (1.1, 1.1, 1.0, 2.1, 2.0, 4.1):  # in windows, 11.4 in all
        _age(router, agent.id, waited * lease)
        router.sweep()
        reenqueued.append(_count(router, team.id, LedgerAction.REENQUEUED))
    assert reenqueued == [1, 1, 2, 2, 3, 3]  # once per window would be 11
    windows = [e.detail["backoff_windows"] for e in router.ledger(team.id)
               if e.action is LedgerAction.REENQUEUED]  # fmt: skip
    assert windows == [1, 2, 4]
    assert router.claim(agent.id) is not None
    router.close()


def test_a_task_queued_behind_a_backlog_is_not_reenqueued_until_overtaken(
    fast_router: Router,
) -> None:
    """Turns that started after an agent's enqueue, all of agents scheduled before it: the
    broker hands tasks out in order, so its task is still queued behind them. A turn scheduled
    after it and started means its task was passed over (lost): then it is re-enqueued."""
    router = fast_router
    lease = FAST["lease_seconds"]
    team = router.create_team()
    for _ in range(3):
        router.create_agent(team.id, role="Engineer")
    router.send(team.id, to="Engineer_1", content="go", sender="Team Leader")  # scheduled first
    router.send(team.id, to="Engineer_2", content="go", sender="Team Leader")  # then this one
    backlog = router.claim_turn(team.id, "Engineer_1")  # the backlog being worked off
    assert backlog is not None
    _wait_past(lease)
    assert backlog.heartbeat()  # alive: not taken over by this sweep
    router.sweep()
    assert _count(router, team.id, LedgerAction.REENQUEUED) == 0  # still queued behind it
    start_running(router, team.id, "Engineer_3")  # scheduled after Engineer_2, and started
    router.sweep()
    reenqueued = [e.agent_id for e in router.ledger(team.id)
                  if e.action is LedgerAction.REENQUEUED]  # fmt: skip
    assert reenqueued == [router.agent(team.id, "Engineer_2").id]


def test_an_agent_behind_a_backlog_too_long_is_reenqueued_anyway(fast_router: Router) -> None:
    router = fast_router
    team = router.create_team()
    for _ in range(2):
        router.create_agent(team.id, role="Engineer")
    router.send(team.id, to="Engineer_1", content="go", sender="Team Leader")
    router.send(team.id, to="Engineer_2", content="go", sender="Team Leader")
    backlog = router.claim_turn(team.id, "Engineer_1")
    assert backlog is not None
    _wait_past(FAST["lease_seconds"] * BACKLOG_WINDOWS)
    assert backlog.heartbeat()
    router.sweep()
    assert _count(router, team.id, LedgerAction.REENQUEUED) == 1


@pytest.fixture(params=["sqlite", "postgresql"])
def own_database(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A database of the test's own: a pass re-enqueues whatever is stale in all of it."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'queue.db'}"
        Router(Settings(database_url=url)).create_schema()
        return url
    return str(request.getfixturevalue("own_pg_schema_url"))


def test_a_task_still_in_the_brokers_queue_is_not_reenqueued_at_any_depth(
    own_database: str, redis_url: str
) -> None:
    """The sweeper asks the broker how deep the agents' queue is (Redis, a real one): tasks
    published 100 delivery windows ago and still queued (no worker consumes) are left alone,
    however long the backlog; once the broker has lost them (a restart without persistence),
    each is enqueued again, once."""
    queue = f"agent_router.test.{uuid.uuid4().hex[:10]}"
    settings = Settings(database_url=own_database, broker_url=redis_url, queue=queue)
    app = create_app(settings)
    router = Router(settings, publisher=CeleryPublisher(app))
    client = redis.Redis.from_url(redis_url)
    try:
        team = router.create_team()
        agents = [router.create_agent(team.id, role="Engineer") for _ in range(3)]
        for agent in agents:
            router.send(team.id, to=agent.display_name, content="go", sender="Team Leader")
        assert client.llen(queue) == 3
        for agent in agents:
            _age(router, agent.id, 100 * settings.lease_seconds)  # 100 windows of backlog
        assert router.sweep().reenqueued == 0  # all three are still in the queue
        assert client.llen(queue) == 3
        client.delete(queue)  # the broker restarted without them
        assert router.sweep().reenqueued == 3
        assert client.llen(queue) == 3  # each published again, once
        for agent in agents:
            _age(router, agent.id, 100 * settings.lease_seconds)
        assert router.sweep().reenqueued == 0  # the copies are queued
        windows = [e.detail["backoff_windows"] for e in router.ledger(team.id)
                   if e.action is LedgerAction.REENQUEUED]  # fmt: skip
        assert windows == [1, 1, 1]
    finally:
        client.delete(queue)
        client.close()
        router.close()
        app.close()
