"""The sweeper as a beat-scheduled Celery task, as a timer in every worker, and the embedded
mode's in-process timer."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from celery import Celery

from agent_router import AgentState, LedgerAction, Router, Settings, TurnTrigger
from agent_router.broker import beat_schedule, create_app
from agent_router.constants import SWEEP, SWEEP_SCHEDULE_ENTRY
from agent_router.ops.demo import wait_quiescent, wait_until
from agent_router.outbox import RecordingPublisher
from agent_router.worker.bootstep import WorkerSweeper, install
from agent_router.worker.embedded import SweeperThread
from agent_router.worker.runtime import Runtime

from .conftest import _sweeping_worker
from .helpers import FAST_SWEEP, dead_turn, start_running, wait_taken_over

TIMEOUT = 60.0


def test_beat_schedule_ships_the_sweeper_with_its_period() -> None:
    settings = Settings(sweep_seconds=2.5, queue="q1")
    entry = beat_schedule(settings)[SWEEP_SCHEDULE_ENTRY]
    assert (entry["task"], entry["schedule"]) == (SWEEP, 2.5)
    assert entry["options"]["queue"] == "q1"
    app = create_app(settings)
    assert app.conf.beat_schedule == beat_schedule(settings)
    app.loader.import_default_modules()  # what a worker does at start
    assert SWEEP in app.tasks


def test_redis_broker_gets_a_result_backend() -> None:
    assert create_app(Settings(broker_url="redis://h:1/0")).conf.result_backend == "redis://h:1/0"
    assert not create_app(Settings(broker_url="memory://")).conf.result_backend


def test_sweeper_thread_takes_over_an_expired_lease(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    settings = Settings(
        database_url=url, lease_seconds=0.3, heartbeat_seconds=0.1, sweep_seconds=0.1
    )
    router = Router(settings, publisher=RecordingPublisher())
    router.create_schema()
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    start_running(router, team.id, "Engineer_1")  # ... and its worker dies: no heartbeat
    with SweeperThread(router) as sweeper:
        wait_until(
            lambda: router.agent(team.id, "Engineer_1").state is AgentState.SCHEDULED,
            "the sweeper thread to take the turn over",
            timeout=TIMEOUT,
        )
    assert sweeper.passes >= 1
    agent = router.agent(team.id, "Engineer_1")
    assert agent.pending_trigger is TurnTrigger.RECOVERY
    router.close()


def test_sweep_task_publishes_a_lost_outbox_row(inproc_worker: Runtime) -> None:
    settings = inproc_worker.router.settings
    offline = Router(settings, publisher=None)  # committed; the process died before publishing
    team = offline.create_team()
    offline.create_agent(team.id, role="Full-Stack Engineer")
    offline.send(team.id, to="Full-Stack Engineer_1", content="durable", sender="Team Leader")
    offline.close()
    router = inproc_worker.router
    time.sleep(settings.sweep_seconds)  # the sweeper leaves rows younger than a period alone
    inproc_worker.app.send_task(SWEEP)
    wait_until(
        lambda: any(e.action is LedgerAction.TURN_CLAIMED for e in router.ledger(team.id)),
        "the re-published turn to start",
        timeout=TIMEOUT,
    )
    wait_quiescent(router, team.id, timeout=TIMEOUT)


def test_worker_sweeper_step_is_installed_once() -> None:
    app = create_app(Settings())
    install(app)
    install(app)
    assert [s for s in app.steps["worker"] if s is WorkerSweeper] == [WorkerSweeper]


def test_worker_sweeper_connections_are_not_shared_with_forked_children(
    celery_settings: Settings, celery_app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefork pool forks the worker after the step made its router: a child must start with
    an empty pool of its own, and the parent's connection must still work afterwards."""
    monkeypatch.setenv("AGENT_ROUTER_DATABASE_URL", celery_settings.database_url)
    monkeypatch.setenv("AGENT_ROUTER_BROKER_URL", celery_settings.broker_url)
    step = WorkerSweeper(SimpleNamespace(app=celery_app))
    sweeper = step.create(SimpleNamespace(app=celery_app))
    try:
        reads = sweeper.router.store.reads
        sweeper.router.sweep()  # the parent's pool now holds a connection
        assert reads.idle_connections() == 1
        pid = os.fork()
        if pid == 0:  # the child: a pool of its own, empty
            os._exit(0 if reads.idle_connections() == 0 else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        sweeper.router.sweep()  # the parent's connection was left alone
        assert reads.idle_connections() == 1
    finally:
        sweeper.router.close()


@pytest.mark.own_database
def test_worker_timer_takes_over_an_expired_lease_without_beat(
    celery_settings: Settings, celery_app: Celery, tmp_path: Path
) -> None:
    """`agent-router worker` sweeps on its own timer: no beat runs, no sweep task is sent, and
    a turn whose worker died is still taken over and recovered."""
    settings, router, team_id = dead_turn(celery_settings, celery_app)
    with (tmp_path / "worker.log").open("wb") as log:
        proc = _sweeping_worker(settings, FAST_SWEEP, log)
        try:
            wait_taken_over(
                router, team_id, "Engineer_1", "the worker's sweeper to take the turn over", TIMEOUT
            )
            wait_quiescent(router, team_id, timeout=TIMEOUT)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    turns = router.store.reads.turns(router.agent(team_id, "Engineer_1").id)
    assert [t.trigger for t in turns] == [TurnTrigger.NEW, TurnTrigger.RECOVERY]
    router.close()
