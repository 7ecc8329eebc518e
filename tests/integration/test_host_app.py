"""A host's own Celery app after ``agent_router.worker.install``: the host's tasks keep their
results, routes and acks; the router's tasks carry their own reliability options and run.

The running app is tested as a host tests its own: pytest-celery's ``celery_session_app`` and
``celery_session_worker`` (configured by ``celery_config``, ``celery_includes``, the pool and
the worker's queues), and the router's plugin (``agent_router.testing``) beside them: its
``agent_router_worker`` runs the router's queue of that same app, on a database of the test's."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab
from kombu import Queue

from agent_router import AgentState, LedgerAction, Settings, Team
from agent_router.broker import CeleryPublisher
from agent_router.constants import RUN_AGENT_TURN, SWEEP, SWEEP_SCHEDULE_ENTRY
from agent_router.errors import RouterDisabledError
from agent_router.testing import settle
from agent_router.worker import hosting, install
from agent_router.worker.bootstep import WorkerSweeper
from agent_router.worker.runtime import Runtime

TIMEOUT = 60.0


@pytest.fixture
def host_app(celery_settings: Settings, redis_url: str) -> Iterator[Celery]:
    """A chat backend's app as it was before the router: results in Redis, early acks, its own
    route for its own tasks and its own beat entry."""
    host_queue = f"chat.{uuid.uuid4().hex[:8]}"
    app = Celery(f"chat_{uuid.uuid4().hex[:6]}", broker=redis_url, backend=redis_url)
    app.conf.task_routes = {"chat.*": {"queue": host_queue}}
    app.conf.beat_schedule = {"chat-digest": {"task": "chat.digest", "schedule": crontab()}}

    @app.task(name="chat.digest_now", shared=False)  # each test's app has its own
    def digest_now() -> str:
        return "sent"

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
    host_queue = _queue_of(host_app, "chat.digest_now")
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
    assert _queue_of(host_app, "chat.digest_now") == host_queue
    assert _queue_of(host_app, RUN_AGENT_TURN) == celery_settings.queue
    assert set(host_app.conf.beat_schedule) == {"chat-digest", SWEEP_SCHEDULE_ENTRY}
    assert host_app.conf.beat_schedule[SWEEP_SCHEDULE_ENTRY]["task"] == SWEEP
    assert WorkerSweeper in host_app.steps["worker"]
    # Acks: the host's task acknowledges early as before; the router's turn task late.
    host_task, turn_task = host_app.tasks["chat.digest_now"], host_app.tasks[RUN_AGENT_TURN]
    assert (host_task.acks_late, host_task.reject_on_worker_lost) == (False, None)
    assert host_task.ignore_result is False
    assert (turn_task.acks_late, turn_task.reject_on_worker_lost) == (True, True)
    assert turn_task.ignore_result is True


# pytest-celery's session app and worker, configured as a host configures them for its tests.
HOST_QUEUE = f"chat.{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        (
            "AGENT_ROUTER_DATABASE_URL",
            "mysql://chat:s3cret@db/chat",
            "AGENT_ROUTER_DATABASE_URL is invalid: database_url must be a sqlite:// or "
            "postgresql:// URL; accepted: SQLAlchemy URL",
        ),
        (
            "AGENT_ROUTER_LEASE_SECONDS",
            "-1",
            "AGENT_ROUTER_LEASE_SECONDS is invalid: Input should be greater than 0; accepted: "
            "A running turn's lease",
        ),
    ],
)
def test_install_on_an_invalid_variable_leaves_the_router_off_and_the_app_as_it_was(
    host_app: Celery,
    celery_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    variable: str,
    value: str,
    said: str,
) -> None:
    monkeypatch.setenv("AGENT_ROUTER_DATABASE_URL", celery_settings.database_url)
    monkeypatch.setenv(variable, value)
    routes, beat = host_app.conf.task_routes, dict(host_app.conf.beat_schedule)
    with caplog.at_level(logging.DEBUG, logger="agent_router"):
        install(host_app)
        install(host_app)  # the same reason is not said twice
    (line,) = [r for r in caplog.records if r.name.startswith("agent_router")]
    assert line.levelno == logging.WARNING
    assert line.getMessage().startswith(f"agent-router is off in this process: {said}")
    assert "s3cret" not in line.getMessage()
    assert host_app.conf.task_routes == routes and dict(host_app.conf.beat_schedule) == beat
    # The router's tasks are registered, and fail with the same line, typed.
    for name in (RUN_AGENT_TURN, SWEEP):
        args = (1, 1) if name == RUN_AGENT_TURN else ()
        failed = host_app.tasks[name].apply(args=args)
        assert isinstance(failed.result, RouterDisabledError), failed.result
        assert str(failed.result) == line.getMessage().split(" action=")[0]
    # Given settings, a later install turns it on.
    install(host_app, celery_settings)
    assert hosting.disabled_reason(host_app) is None
    assert _queue_of(host_app, RUN_AGENT_TURN) == celery_settings.queue


@pytest.fixture(scope="session")
def celery_config(redis_url: str) -> dict[str, Any]:
    """The host's app: Redis for messages and results, its own route for its own tasks."""
    return {
        "broker_url": redis_url,
        "result_backend": redis_url,
        "task_routes": {"chat.*": {"queue": HOST_QUEUE}},
    }


@pytest.fixture(scope="session")
def celery_includes() -> list[str]:
    """The host's tasks, and the router's (as its app's ``include`` names them)."""
    return ["tests.support.host_tasks", "agent_router.tasks"]


@pytest.fixture(scope="session")
def celery_worker_pool() -> str:
    return "threads"


@pytest.fixture(scope="session")
def celery_worker_parameters() -> dict[str, Any]:
    """The host's worker takes the host's queue only; the router's worker (the plugin's
    ``agent_router_worker``) takes the router's."""
    return {
        "queues": (HOST_QUEUE,),
        "perform_ping_check": False,
        "concurrency": 4,
        # Celery's 10 s default is short for a loaded machine to stop a worker's threads.
        "shutdown_timeout": 60.0,
    }


@pytest.fixture
def agent_router_settings(
    agent_router_settings: Settings, celery_settings: Settings, redis_url: str
) -> Iterator[Settings]:
    """The plugin's settings with a router queue of the test's own on the shared Redis."""
    yield agent_router_settings.model_copy(update={"queue": celery_settings.queue})
    app = Celery(broker=redis_url, set_as_current=False)
    with app.connection_for_write() as conn:
        Queue(celery_settings.queue, channel=conn.default_channel).delete()
    app.close()


def test_a_hosts_worker_and_the_routers_worker_share_the_hosts_app(
    celery_session_app: Celery,
    celery_session_worker: Any,
    agent_router_app: Celery,
    agent_router_worker: Runtime,
    agent_router_team: Team,
) -> None:
    router = agent_router_worker.router
    assert agent_router_app is celery_session_app  # the plugin wired the router into it
    assert isinstance(router.publisher, CeleryPublisher)
    assert router.publisher.app is celery_session_app
    # The host's task runs on the host's worker, on its own queue, with its result.
    assert _queue_of(celery_session_app, "chat.add") == HOST_QUEUE
    assert celery_session_app.send_task("chat.add", args=(2, 3)).get(timeout=TIMEOUT) == 5
    # A host task that routes a user's message: the turn it starts runs on the router's worker.
    team = agent_router_team.id
    router.create_agent(team, role="Full-Stack Engineer")
    told = celery_session_app.send_task("chat.tell_lead", args=(team, "Status, please."))
    assert told.get(timeout=TIMEOUT) == "triggered_new_turn"
    settle(router, team, timeout=TIMEOUT)
    actions = [e.action for e in router.ledger(team)]
    assert {LedgerAction.TURN_CLAIMED, LedgerAction.TURN_ENDED} <= set(actions)
    assert router.transcript(team, "Team Leader")[-1]["role"] == "assistant"
    assert router.agent(team, "Team Leader").state is AgentState.COMPLETED
