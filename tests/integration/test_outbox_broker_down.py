"""With the broker stopped, sends still succeed (they are durable in the database); once it is
back, the sweeper publishes what could not be, and every scheduled turn runs. The broker is a
private redis-server on its own port, so other tests' Redis is not disturbed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_router import MessageStatus, RouteOutcome, Settings
from agent_router.agents.llm import SCRIPTED_MODEL
from agent_router.broker import create_app
from agent_router.ops.chaos_processes import PrivateRedis
from agent_router.ops.checks import check_team
from agent_router.ops.demo import wait_quiescent
from agent_router.worker import runtime
from agent_router.worker.threaded import thread_worker

TIMEOUT = 60.0


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.stop()


def test_sends_survive_a_stopped_broker_and_turns_run_once_it_is_back(
    own_pg_schema_url: str, private_redis: PrivateRedis
) -> None:
    settings = Settings(
        database_url=own_pg_schema_url,
        broker_url=private_redis.url,
        queue=f"agent_router.test.{uuid.uuid4().hex[:10]}",
        sweep_seconds=0.5,
        work_seconds=0.05,
        scripted_write_seconds=0.0,
        openai_model=SCRIPTED_MODEL,
    )
    app = create_app(settings)
    # No publish-retry tuning here: the shipped configuration must keep sends fast.
    rt = runtime.configure(settings, app=app)
    router = rt.router
    try:
        team = router.create_team()
        subs = [router.create_agent(team.id, role="Full-Stack Engineer") for _ in "ab"]
        names = [a.display_name for a in subs]
        private_redis.stop()
        deliveries = [
            router.send(team.id, to=name, content=f"task {i} while the broker is down")
            for i, name in enumerate([*names, team.lead.display_name])
        ]
        assert all(d.outcome is RouteOutcome.TRIGGERED_NEW_TURN for d in deliveries)
        ids = {a.id for a in subs} | {team.lead.id}
        assert len([e for e in router.store.reads.unpublished() if e.agent_id in ids]) == 3
        private_redis.start()
        with thread_worker(app, concurrency=4, queues=[settings.queue]):
            time.sleep(settings.sweep_seconds)
            assert router.sweep().republished >= 3
            wait_quiescent(router, team.id, timeout=TIMEOUT)
        messages = {m.id: m for m in router.messages(team.id)}
        assert all(messages[d.message_id].status is MessageStatus.DELIVERED for d in deliveries)
        assert check_team(router, team.id, quiescent=True).ok
    finally:
        runtime.reset()
