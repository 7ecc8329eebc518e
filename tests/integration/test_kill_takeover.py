"""A worker SIGKILLed mid-turn, with the default lease, heartbeat and sweep period: the turn's
lease runs out (nothing renews it), a worker's sweeper takes the turn over, and the recovery
turn answers the task. The time from the kill to the takeover is printed (lease +
sweep_seconds at most, plus the pass's run time); only a generous timeout is asserted."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest
from celery import Celery

from agent_router import MessageSubtype, Router, Settings, TurnTrigger
from agent_router.broker import CeleryPublisher
from agent_router.ops.demo import wait_until

from .conftest import _sweeping_worker, _wait_for_worker
from .helpers import wait_taken_over

TIMEOUT = 120.0
ENGINEER = "Engineer_1"


@pytest.mark.own_database
def test_a_worker_killed_mid_turn_has_its_turn_taken_over_with_default_settings(
    celery_settings: Settings, celery_app: Celery, tmp_path: Path
) -> None:
    defaults = Settings()
    router = Router(celery_settings, publisher=CeleryPublisher(celery_app))
    team = router.create_team()
    engineer = router.create_agent(team.id, role="Engineer")
    # The first worker's model takes two minutes to write the final reply: it is killed in it.
    slow = {"scripted_write_seconds": 120.0}
    with (tmp_path / "first.log").open("wb") as log, (tmp_path / "second.log").open("wb") as log2:
        # Unsupervised: the SIGKILL hits the Celery worker itself (a supervisor killed would
        # have its child stop warm, its turn finishing first).
        first = _sweeping_worker(celery_settings, slow, log, "--no-supervise")
        second = None
        try:
            router.send(team.id, to=ENGINEER, content="build the login form", sender="Team Leader")
            wait_until(
                lambda: any(e["role"] == "assistant" for e in router.transcript(team.id, ENGINEER)),
                "the first worker's turn to make a model call",
                timeout=TIMEOUT,
            )
            # Another worker, ready before the kill (as a deployment's others are): its sweeper
            # takes the turn over, and it runs the recovery turn.
            hostname = f"ar-test-{uuid.uuid4().hex[:8]}@localhost"
            second = _sweeping_worker(celery_settings, {}, log2, f"--hostname={hostname}")
            _wait_for_worker(celery_app, hostname, second, tmp_path / "second.log")
            first.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            first.wait(TIMEOUT)
            wait_taken_over(router, team.id, ENGINEER, "a sweeper to take the turn over", TIMEOUT)
            taken_over = time.monotonic() - killed
            wait_until(
                lambda: any(
                    m.source_name == ENGINEER and m.subtype is MessageSubtype.COMPLETION_REPORT
                    for m in router.messages(team.id)
                ),
                "the recovery turn to report to the lead",
                timeout=TIMEOUT,
            )
        finally:
            for proc in (first, second):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(60)
    triggers = [t.trigger for t in router.store.reads.turns(engineer.id)]
    assert triggers[:2] == [TurnTrigger.NEW, TurnTrigger.RECOVERY]
    print(
        f"kill -> takeover {taken_over:.1f} s (lease {defaults.lease_seconds:g} s, heartbeat "
        f"{defaults.heartbeat_seconds:g} s, sweep period {defaults.sweep_seconds:g} s)"
    )
    router.close()
