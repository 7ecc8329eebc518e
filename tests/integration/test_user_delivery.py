"""A team's messages to the user reach the host's own task through the broker, published
after the commit that wrote them: at least once, each with an id the host drops a repeat by,
so that the host takes each exactly once. A host worker SIGKILLed while it holds one gets it
back through the broker; a publish that never happened is made by the sweeper. Real
processes: RabbitMQ, Redis, PostgreSQL, the router's worker and the host's own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from celery import Celery
from kombu import Queue

from agent_router import Router
from agent_router.agents.llm import ScriptedModel
from agent_router.agents.loop import TurnOutcome, run_turn
from agent_router.agents.tools import default_registry
from agent_router.domain import OutboxKind, UserMessageKind
from agent_router.worker.runtime import Runtime

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 90.0
LEAD = "Team Leader"

pytestmark = pytest.mark.parametrize("broker_url", ["rabbitmq"], indirect=True)


def _wait(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


class HostWorkers:
    """``celery -A tests.support.user_tasks worker`` processes on the host's queue."""

    def __init__(self, broker_url: str, redis_url: str, tmp: Path) -> None:
        self.queue = f"chat.users.{uuid.uuid4().hex[:8]}"
        self.key = f"user-delivery-test:{uuid.uuid4().hex}"
        self.redis = redis.Redis.from_url(redis_url)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")},
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            "USER_TASK_BROKER_URL": broker_url,
            "USER_TASK_REDIS_URL": redis_url,
            "USER_TASK_KEY": self.key,
        }
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, **extra: str) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.support.user_tasks", "worker",
             "-Q", self.queue, "--pool=solo", "--loglevel=INFO", f"--hostname={name}@%h"],
            env={**self.env, **extra}, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def listed(self, what: str) -> list[bytes]:
        return cast("list[bytes]", self.redis.lrange(f"{self.key}:{what}", 0, -1))

    def received(self) -> list[dict[str, Any]]:
        return [json.loads(m) for m in self.listed("received")]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.redis.delete(*(f"{self.key}:{k}" for k in ("attempts", "seen", "received")))
        self.redis.close()


@pytest.fixture
def host(
    broker_url: str, redis_url: str, tmp_path: Path, celery_app: Celery
) -> Iterator[HostWorkers]:
    workers = HostWorkers(broker_url, redis_url, tmp_path)
    yield workers
    workers.stop()
    with celery_app.connection_for_write() as conn:
        Queue(workers.queue, channel=conn.default_channel).delete()


def test_the_lead_s_answer_reaches_the_host_task_once_through_a_killed_host_worker(
    inproc_worker: Runtime, host: HostWorkers
) -> None:
    router = inproc_worker.router
    team = router.create_team(user_task=f"chat.user_message@{host.queue}")
    stalling = host.start("stalling", USER_TASK_STALL="1")
    router.send(team.id, to=LEAD, content="Plan the release.")
    (answer,) = _wait(lambda: router.user_messages(team.id), "the lead's answer")
    assert answer.kind is UserMessageKind.ANSWER
    # The host's worker holds the delivery, unacknowledged, and dies with it.
    _wait(lambda: host.listed("attempts"), "the first delivery")
    stalling.send_signal(signal.SIGKILL)
    stalling.wait()
    assert host.received() == []
    host.start("fresh")
    (taken,) = _wait(host.received, "the delivery given back by the broker")
    assert taken == answer.as_payload()
    # A repeat of the same publish (a sweeper that found the row unmarked) is dropped by id.
    (entry,) = [e for e in router.outbox(team.id) if e.kind is OutboxKind.DELIVER_USER]
    router.republish(entry)
    _wait(lambda: len(host.listed("attempts")) >= 3, "the repeated delivery")
    assert [int(i) for i in host.listed("attempts")] == [answer.id] * 3
    assert host.received() == [answer.as_payload()]


@pytest.mark.own_database
def test_a_message_never_published_is_published_by_the_sweeper(
    inproc_worker: Runtime, host: HostWorkers
) -> None:
    # A process with no publisher writes the message (a web process whose broker is away):
    # the row stays unpublished until a sweeper publishes it.
    offline = Router(inproc_worker.router.settings, publisher=None)
    try:
        team = offline.create_team(user_task=f"chat.user_message@{host.queue}")
        offline.send(team.id, to=LEAD, content="Plan the release.")
        turn = offline.claim(team.lead.id, builtin=True)
        assert turn is not None
        outcome = run_turn(offline, turn, models=ScriptedModel.for_agent, tools=default_registry())
        assert outcome is TurnOutcome.ENDED
        (answer,) = offline.user_messages(team.id)
    finally:
        offline.close()
    host.start("host")
    # The database is the test's own: what is unpublished is this team's (its turn task, which
    # claims nothing now, and the answer's delivery).
    assert inproc_worker.router.publish_outbox() == 2
    (taken,) = _wait(host.received, "the delivery the sweeper published")
    assert taken == answer.as_payload()
