"""``agent-router worker`` survives a restart of its Redis broker: turns published after the
broker came back run, in the same Celery worker when it reconnects, or in a new one the
supervisor starts when Celery gave up on the lost connection with an unrecoverable error (it
does when a turn ends while the broker is away); and a worker that starts while the broker is
away already takes over dead turns. The broker is a Redis server of the test's own,
stopped for a few seconds and started again on the same port."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from celery import Celery

from agent_router import (
    MessageSubtype,
    MessageType,
    Router,
    Settings,
    TurnStatus,
    TurnTrigger,
)
from agent_router.ops.chaos_processes import PrivateRedis
from agent_router.ops.demo import wait_quiescent
from agent_router.worker.runtime import Runtime

from .conftest import _sweeping_worker
from .helpers import FAST_SWEEP, dead_turn, wait_taken_over

TIMEOUT = 90.0
WRITE_SECONDS = 3.0


#: The tests publish whatever is unpublished in their database (as the sweeper does): a
#: database of their own, so that no earlier test's leftover turns run on their worker.
pytestmark = pytest.mark.own_database


@pytest.fixture
def broker_url(own_redis: PrivateRedis) -> str:
    return own_redis.url


@pytest.fixture
def worker_env_extra() -> dict[str, str]:
    # A sub-agent takes this long to write its reply: time to stop the broker under a turn.
    return {"AGENT_ROUTER_SCRIPTED_WRITE_SECONDS": str(WRITE_SECONDS)}


def _reports(router: Router, team_id: int) -> int:
    return sum(m.subtype is MessageSubtype.COMPLETION_REPORT for m in router.messages(team_id))


def _wait_for_reports(router: Router, team_id: int, count: int, log: Path) -> None:
    deadline = time.monotonic() + TIMEOUT
    while _reports(router, team_id) < count:
        if time.monotonic() > deadline:
            pytest.fail(f"no completion report {count} after {TIMEOUT} s:\n{log.read_text()}")
        router.publish_outbox(older_than_seconds=1.0)  # what the sweeper does for a lost publish
        time.sleep(0.2)


def _task(router: Router, team_id: int | None, content: str) -> int:
    """Give the team's engineer (a new team and engineer without ``team_id``) a task."""
    if team_id is None:
        team_id = router.create_team().id
        router.create_agent(team_id, role="Full-Stack Engineer")
    router.send(team_id, to="Full-Stack Engineer_1", content=content, sender="Team Leader",
                type=MessageType.TASK)  # fmt: skip
    return team_id


def test_the_worker_survives_a_broker_restart(
    own_redis: PrivateRedis, subprocess_worker: Runtime, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    router = subprocess_worker.router
    team_id = _task(router, None, "Ship it.")
    _wait_for_reports(router, team_id, 1, log)
    own_redis.stop()
    time.sleep(5)
    own_redis.start()
    _task(router, team_id, "Ship it again.")
    _wait_for_reports(router, team_id, 2, log)


def test_a_turn_that_ends_while_the_broker_is_away_is_not_the_last(
    own_redis: PrivateRedis, subprocess_worker: Runtime, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    router = subprocess_worker.router
    team_id = _task(router, None, "Ship it.")
    deadline = time.monotonic() + TIMEOUT
    while "turn_claimed" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    own_redis.stop()  # the turn is writing its reply: it ends, and is acknowledged, meanwhile
    time.sleep(WRITE_SECONDS + 2)
    own_redis.start()
    _wait_for_reports(router, team_id, 1, log)
    _task(router, team_id, "Ship it again.")
    _wait_for_reports(router, team_id, 2, log)


def test_a_worker_that_starts_while_the_broker_is_away_takes_over_a_dead_turn(
    own_redis: PrivateRedis, celery_settings: Settings, celery_app: Celery, tmp_path: Path
) -> None:
    """A worker that cannot reach its broker is not ready, and its sweeper already takes over a
    turn whose worker died: a takeover needs only the database. The recovery turn runs once the
    broker is back."""
    settings, router, team_id = dead_turn(celery_settings, celery_app)
    own_redis.stop()  # no persistence: the queued turn task is gone with it
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = _sweeping_worker(
            settings, FAST_SWEEP, out, "--no-supervise", "--wait-for-broker", "--loglevel=INFO"
        )
        try:
            wait_taken_over(
                router, team_id, "Engineer_1",
                "the sweeper of the worker without a broker to take the turn over", TIMEOUT,
            )  # fmt: skip
            text = log.read_text()
            assert "Cannot connect to redis" in text, text  # the broker is away ...
            assert " ready." not in text, text  # ... so the worker was never ready
            own_redis.start()
            wait_quiescent(router, team_id, timeout=TIMEOUT)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            if own_redis.proc is not None and own_redis.proc.poll() is not None:
                own_redis.start()  # the queue's cleanup needs the broker
    turns = router.store.reads.turns(router.agent(team_id, "Engineer_1").id)
    assert [t.trigger for t in turns] == [TurnTrigger.NEW, TurnTrigger.RECOVERY]
    assert [t.status for t in turns] == [TurnStatus.FENCED, TurnStatus.ENDED]
    router.close()
