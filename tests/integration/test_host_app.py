"""A host's own Celery app after ``agent_router.worker.install``: the host's tasks keep their
results, routes and acks; the router's tasks carry their own reliability options and run."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.schedules import crontab
from kombu import Queue

from agent_router import LedgerAction, Router, Settings
from agent_router.constants import RUN_AGENT_TURN, SWEEP, SWEEP_SCHEDULE_ENTRY
from agent_router.ops.demo import wait_quiescent
from agent_router.worker import install, runtime
from agent_router.worker.bootstep import WorkerSweeper
from agent_router.worker.publisher import CeleryPublisher

TIMEOUT = 60.0


@pytest.fixture
def host_app(celery_settings: Settings, redis_url: str) -> Iterator[Celery]:
    """A chat backend's app as it was before the router: results in Redis, early acks, its own
    route for its own tasks and its own beat entry."""
    host_queue = f"chat.{uuid.uuid4().hex[:8]}"
    app = Celery(f"chat_{uuid.uuid4().hex[:6]}", broker=redis_url, backend=redis_url)
    app.conf.task_routes = {"chat.*": {"queue": host_queue}}
    app.conf.beat_schedule = {"chat-digest": {"task": "chat.digest", "schedule": crontab()}}

    @app.task(name="chat.add", shared=False)  # each test's app has its own
    def add(x: int, y: int) -> int:
        return x + y

    yield app
    with app.connection_for_write() as conn:
        for queue in (host_queue, celery_settings.queue):
            Queue(queue, channel=conn.default_channel).delete()
    app.close()


def _queue_of(app: Celery, task_name: str) -> str:
    route: dict[str, Any] = app.amqp.router.route({}, task_name)
    return str(route["queue"].name)


def test_install_leaves_the_hosts_tasks_as_they_were(
    host_app: Celery, celery_settings: Settings
) -> None:
    host_queue = _queue_of(host_app, "chat.add")
    before = {
        key: host_app.conf[key]
        for key in (
            "task_acks_late",
            "task_ignore_result",
            "task_reject_on_worker_lost",
            "task_serializer",
            "accept_content",
            "worker_prefetch_multiplier",
            "result_backend",
            "task_default_queue",
            "broker_transport_options",
            "task_publish_retry_policy",
        )
    }
    install(host_app, celery_settings)
    install(host_app, celery_settings)  # idempotent
    after = {key: host_app.conf[key] for key in before}
    assert after == before
    # Merged, not replaced: the host's route and beat entry are still there, ours beside them.
    assert _queue_of(host_app, "chat.add") == host_queue
    assert _queue_of(host_app, RUN_AGENT_TURN) == celery_settings.queue
    assert set(host_app.conf.beat_schedule) == {"chat-digest", SWEEP_SCHEDULE_ENTRY}
    assert host_app.conf.beat_schedule[SWEEP_SCHEDULE_ENTRY]["task"] == SWEEP
    assert WorkerSweeper in host_app.steps["worker"]
    # Acks: the host's task acknowledges early as before; the router's turn task late.
    host_task, turn_task = host_app.tasks["chat.add"], host_app.tasks[RUN_AGENT_TURN]
    assert (host_task.acks_late, host_task.reject_on_worker_lost) == (False, None)
    assert host_task.ignore_result is False
    assert (turn_task.acks_late, turn_task.reject_on_worker_lost) == (True, True)
    assert turn_task.ignore_result is True


def test_a_worker_of_the_wired_host_app_returns_host_results_and_runs_turns(
    host_app: Celery, celery_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The session database holds other tests' leftovers: no sweeper timer in this worker.
    monkeypatch.setenv("AGENT_ROUTER_WORKER_SWEEPER", "false")
    install(host_app, celery_settings)
    host_queue = _queue_of(host_app, "chat.add")
    rt = runtime.configure(celery_settings, app=host_app)
    router: Router = rt.router
    assert isinstance(router.publisher, CeleryPublisher)
    try:
        with start_worker(
            host_app,
            pool="threads",
            concurrency=4,
            perform_ping_check=False,
            shutdown_timeout=60.0,
            queues=[host_queue, celery_settings.queue],
        ):
            # The host's task went to its own queue and its result came back.
            assert host_app.send_task("chat.add", args=(2, 3)).get(timeout=TIMEOUT) == 5
            team = router.create_team()
            router.create_agent(team.id, role="Full-Stack Engineer")
            router.send(team.id, to="Full-Stack Engineer_1", content="build it", sender="user")
            wait_quiescent(router, team.id, timeout=TIMEOUT)
            # ... and the router's turn task ran to its end on the same worker.
            actions = [e.action for e in router.ledger(team.id)]
            assert {LedgerAction.TURN_CLAIMED, LedgerAction.TURN_ENDED} <= set(actions)
            transcript = router.transcript(team.id, "Full-Stack Engineer_1")
            assert transcript[-1]["role"] == "assistant"
    finally:
        runtime.reset()
