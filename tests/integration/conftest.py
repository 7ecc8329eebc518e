"""Celery fixtures: real workers (in-process threads and a subprocess) on Redis (or RabbitMQ) +
PostgreSQL; and a router on a PostgreSQL schema of its own that records the turn tasks it
publishes.

Each test gets its own Celery queue, so a worker never takes another test's (or another test
session's) turn tasks from the shared Redis.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from celery import Celery
from kombu import Queue

from agent_router import Router, Settings
from agent_router.agents.llm import SCRIPTED_MODEL
from agent_router.agents.roles import ROLES_FILE_ENV
from agent_router.broker import create_app
from agent_router.ops.chaos_processes import PrivateRedis
from agent_router.outbox import RecordingPublisher
from agent_router.worker import runtime
from agent_router.worker.runtime import Runtime
from agent_router.worker.threaded import thread_worker

#: Worker threads: every agent of a test team can run at once.
CONCURRENCY = 8
WORKER_START_TIMEOUT = 60.0


@pytest.fixture
def pg_router(pg_schema_url: str) -> Iterator[Router]:
    """A router on a PostgreSQL schema of its own, recording the turn tasks it publishes."""
    router = Router(Settings(database_url=pg_schema_url), publisher=RecordingPublisher())
    yield router
    router.close()


@pytest.fixture
def broker_url(request: pytest.FixtureRequest, redis_url: str) -> str:
    """Redis; a test parametrized with ``indirect=["broker_url"]`` and "rabbitmq" gets RabbitMQ."""
    if getattr(request, "param", "redis") == "rabbitmq":
        return str(request.getfixturevalue("amqp_url"))
    return redis_url


@pytest.fixture
def celery_settings(request: pytest.FixtureRequest, broker_url: str, redis_url: str) -> Settings:
    """The session database, or one of the test's own for a test marked ``own_database``."""
    own = request.node.get_closest_marker("own_database") is not None
    return Settings(
        database_url=request.getfixturevalue("own_pg_schema_url" if own else "pg_schema_url"),
        broker_url=broker_url,
        redis_url=redis_url,  # wake keys of blocked asks in Redis, as in production
        queue=f"agent_router.test.{uuid.uuid4().hex[:10]}",
        # UI Operator_1 checks in up to 40 times (0.1 s each) before it gives up waiting for
        # the lead's steer: seconds of margin for the demo to send it.
        work_seconds=0.1,
        # Long enough that the demo's 3.4 message lands while the final reply is written.
        scripted_write_seconds=1.0,
        # Every team's agents run on the built-in scripted model, with its do_work tool.
        openai_model=SCRIPTED_MODEL,
    )


@pytest.fixture
def celery_app(celery_settings: Settings) -> Iterator[Celery]:
    app = create_app(celery_settings, main=f"agent_router_test_{uuid.uuid4().hex[:6]}")
    yield app
    with app.connection_for_write() as conn:
        Queue(celery_settings.queue, channel=conn.default_channel).delete()
    app.close()


@pytest.fixture
def inproc_worker(celery_settings: Settings, celery_app: Celery) -> Iterator[Runtime]:
    """Celery's in-process testing worker (thread pool) consuming the test's queue; the process
    runtime is configured so its Router publishes to the same app."""
    rt = runtime.configure(celery_settings, app=celery_app)
    try:
        with thread_worker(celery_app, concurrency=CONCURRENCY, queues=[celery_settings.queue]):
            yield rt
    finally:
        runtime.reset()


def _worker_env(settings: Settings, *, sweeper: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    env.update(
        # The session database holds every earlier test's teams, leftovers included: a worker's
        # sweeper would republish and run them. Only the tests of that timer turn it on.
        AGENT_ROUTER_WORKER_SWEEPER=str(sweeper).lower(),
        AGENT_ROUTER_DATABASE_URL=settings.database_url,
        AGENT_ROUTER_BROKER_URL=settings.broker_url,
        AGENT_ROUTER_QUEUE=settings.queue,
        AGENT_ROUTER_WORK_SECONDS=str(settings.work_seconds),
        AGENT_ROUTER_SCRIPTED_WRITE_SECONDS=str(settings.scripted_write_seconds),
        # The demo's team, as the tests' own processes staff it (tests/conftest.py).
        AGENT_ROUTER_ROLES_FILE=os.environ[ROLES_FILE_ENV],
    )
    if settings.openai_model:
        env["AGENT_ROUTER_OPENAI_MODEL"] = settings.openai_model
    if settings.redis_url:
        env["AGENT_ROUTER_REDIS_URL"] = settings.redis_url
    return env


def _sweeping_worker(
    settings: Settings, timing: dict[str, float], out: IO[bytes], *args: str
) -> subprocess.Popen[bytes]:
    """``agent-router worker`` (two slots) with its sweeper timer on and ``timing`` (lease,
    heartbeat, sweep period, ...) in its environment, writing to ``out``; ``args`` go to it."""
    env = _worker_env(settings, sweeper=True)
    env.update({f"AGENT_ROUTER_{k.upper()}": str(v) for k, v in timing.items()})
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "agent-router"), "worker", "--concurrency=2", *args],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


@pytest.fixture
def worker_env_extra() -> dict[str, str]:
    """More environment for :func:`subprocess_worker` (a test module overrides it)."""
    return {}


@pytest.fixture
def subprocess_worker(
    celery_settings: Settings, celery_app: Celery, tmp_path: Path, worker_env_extra: dict[str, str]
) -> Iterator[Runtime]:
    """``agent-router worker`` in its own process, configured only by AGENT_ROUTER_* variables.
    The test process's runtime only publishes (no worker in this process)."""
    hostname = f"ar-test-{uuid.uuid4().hex[:8]}@localhost"
    log = (tmp_path / "worker.log").open("w")
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "agent-router"),
            "worker",
            f"--concurrency={CONCURRENCY}",
            "--loglevel=INFO",
            f"--hostname={hostname}",
        ],
        env={**_worker_env(celery_settings), **worker_env_extra},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    rt = runtime.configure(celery_settings, app=celery_app)
    try:
        _wait_for_worker(celery_app, hostname, proc, tmp_path / "worker.log")
        yield rt
    finally:
        runtime.reset()
        proc.send_signal(signal.SIGTERM)  # warm shutdown: running turns finish first
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _wait_for_worker(app: Celery, hostname: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    import time

    deadline = time.monotonic() + WORKER_START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"agent-router worker exited with {proc.returncode}:\n{log.read_text()}")
        if app.control.ping(destination=[hostname], timeout=0.5):
            return
    pytest.fail(f"agent-router worker did not answer a ping:\n{log.read_text()}")


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A Redis server of the test's own, to stop and restart (the shared one is left alone)."""
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.stop()
