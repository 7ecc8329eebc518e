"""Warm shutdown (SIGTERM) of an `agent-router worker` leaves no agent `running`: Celery stops
taking tasks and waits for the running turn, which ends (or suspends, for a blocked ask) in
bounded time. SIGKILL is the chaos suite's business (lease + sweeper)."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path

from celery import Celery

from agent_router import AgentState, MessageType, Settings, TurnStatus
from agent_router.ops.demo import wait_until
from agent_router.worker import runtime

from .conftest import _wait_for_worker, _worker_env

TIMEOUT = 60.0


def test_sigterm_lets_the_running_turn_finish(
    celery_settings: Settings, celery_app: Celery, tmp_path: Path
) -> None:
    hostname = f"ar-term-{uuid.uuid4().hex[:8]}@localhost"
    log = tmp_path / "worker.log"
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "agent-router"), "worker", "--concurrency=2",
         f"--hostname={hostname}"],
        env=_worker_env(celery_settings),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    rt = runtime.configure(celery_settings, app=celery_app)
    router = rt.router
    try:
        _wait_for_worker(celery_app, hostname, proc, log)
        team = router.create_team()
        # UI Operator_1 keeps checking in for a few seconds: a turn that is surely running.
        agent = router.create_agent(team.id, role="UI Operator")
        router.send(team.id, to=agent.display_name, content="Build it.", type=MessageType.TASK)
        wait_until(
            lambda: router.agent(team.id, agent.display_name).state is AgentState.RUNNING,
            "the turn to run",
            timeout=TIMEOUT,
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 0, log.read_text()
        assert router.agent(team.id, agent.display_name).state is not AgentState.RUNNING
        (turn,) = router.store.reads.turns(agent.id)
        assert turn.status is TurnStatus.ENDED
    finally:
        runtime.reset()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
