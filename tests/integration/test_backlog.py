"""A backlog is not multiplied: many agents woken at once queue behind a few worker slots for
several delivery windows (leases), and the workers' sweepers re-enqueue hardly any of them (a
re-enqueued task would only be refused by the fence, making the backlog worse). Two real
`agent-router worker` processes, with their sweeper timers, on a private PostgreSQL database
(no other test's leftovers for the sweepers to find) and Redis."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest
from celery import Celery

from agent_router import LedgerAction, MessageType, Router, Settings
from agent_router.broker import CeleryPublisher
from agent_router.ops.chaos_processes import private_database
from agent_router.ops.demo import wait_quiescent

from ..conftest import PG_ADMIN_URL
from .conftest import _sweeping_worker, _wait_for_worker

TEAMS = 12
SUB_AGENTS = 4
#: A sub-agent's turn takes about a second (its steps, then the reply), the lead's a little
#: less: 60 turns on 2 x 2 slots, 15-25 s of backlog on an idle machine and up to 35 s on one
#: that other test processes load. Leases of 2 s make that 8 to 18 delivery windows deep:
#: deeper than BACKLOG_WINDOWS, the most an agent waits behind a backlog where the broker's
#: depth of its queue is not known (then its tail is re-enqueued). Here Redis tells it, and
#: the depth tells a queued task from a lost one at any depth of backlog.
TIMING = {
    "lease_seconds": 2.0,
    "heartbeat_seconds": 0.5,
    "sweep_seconds": 0.5,
    "work_seconds": 0.1,
    "scripted_write_seconds": 0.2,
}
TIMEOUT = 240.0


@pytest.mark.alone
def test_a_backlog_of_turns_is_not_reenqueued(
    celery_settings: Settings, celery_app: Celery, tmp_path: Path
) -> None:
    with private_database(PG_ADMIN_URL) as name:
        url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
        settings = celery_settings.model_copy(update={"database_url": url, **TIMING})
        router = Router(settings, publisher=CeleryPublisher(celery_app))
        router.create_schema()
        workers = []
        hostnames = [f"backlog{i}-{uuid.uuid4().hex[:6]}@localhost" for i in range(2)]
        try:
            for i in range(2):
                log = (tmp_path / f"worker{i}.log").open("wb")
                hostname = f"--hostname={hostnames[i]}"
                workers.append(_sweeping_worker(settings, TIMING, log, hostname))
            # The backlog starts once both workers consume: on a loaded machine a worker that
            # takes longer than a delivery window to start would find every agent's task
            # overdue with no turn started, and re-enqueue them all, which is not a backlog.
            for i, proc in enumerate(workers):
                _wait_for_worker(celery_app, hostnames[i], proc, tmp_path / f"worker{i}.log")
            teams = [router.create_team() for _ in range(TEAMS)]
            for team in teams:
                for _ in range(SUB_AGENTS):
                    agent = router.create_agent(team.id, role="Full-Stack Engineer")
                    router.send(team.id, to=agent.display_name, content="Ship it.",
                                sender="Team Leader", type=MessageType.TASK)  # fmt: skip
            for team in teams:
                wait_quiescent(router, team.id, timeout=TIMEOUT)
        finally:
            for proc in workers:
                proc.send_signal(signal.SIGTERM)
            for proc in workers:
                proc.wait(60)
        ledger = [e for team in teams for e in router.ledger(team.id)]
        claimed = sum(e.action is LedgerAction.TURN_CLAIMED for e in ledger)
        reenqueued = sum(e.action is LedgerAction.REENQUEUED for e in ledger)
        refused = sum(e.action is LedgerAction.CLAIM_REFUSED for e in ledger)
        print(f"claimed={claimed} reenqueued={reenqueued} refused={refused}")
        assert claimed >= TEAMS * (SUB_AGENTS + 1)
        assert reenqueued <= 0.05 * claimed, f"claimed={claimed} reenqueued={reenqueued}"
        router.close()
