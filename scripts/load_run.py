"""A load run: TEAMS teams of a lead and SUBS scripted chaos agents talk for SECONDS on two real
`agent-router worker` processes (4 slots each, their sweeper timers on, leases of 3 s, no
kills), on a private Redis and a private database of the PostgreSQL server at 127.0.0.1.
Prints the sends routed, the turns claimed, the re-enqueues and the refused claims.

    .venv/bin/python scripts/load_run.py [TEAMS SUBS SECONDS]   (default: 50 4 60)"""

from __future__ import annotations

import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import sqlalchemy as sa

from agent_router.broker import CeleryPublisher, create_app
from agent_router.budgeting import NO_LIMITS
from agent_router.domain import LedgerAction, MessageType
from agent_router.ops import chaos
from agent_router.ops.chaos_agent import ROLE, TASK_PREFIX
from agent_router.ops.chaos_processes import PrivateRedis, Workers, private_database
from agent_router.router import Router
from agent_router.settings import Settings
from agent_router.store.models import LedgerRow

TEAMS, SUBS, SECONDS = (int(a) for a in (sys.argv[1:] or ["50", "4", "60"]))
ADMIN = "postgresql+psycopg://root@127.0.0.1:5432/test"

with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
    workdir = Path(tmp)
    dbname = stack.enter_context(private_database(ADMIN))
    redis_server = PrivateRedis(workdir)
    redis_server.start()
    url = ADMIN.rsplit("/", 1)[0] + "/" + dbname
    profile = chaos.Profile(sends_per_agent=100_000, asks_per_agent=10_000, duration=SECONDS)
    common = chaos._shared_settings(profile, redis_server.url)
    settings = Settings(database_url=url, **common)
    router = Router(settings, publisher=CeleryPublisher(create_app(settings)))
    router.create_schema()
    workers = Workers(chaos._worker_env(common, url), 4, workdir)
    try:
        for i in range(2):
            workers.start(i)
        task = f"{TASK_PREFIX}100000 asks=10000"
        for _ in range(TEAMS):
            team = router.create_team(budget=NO_LIMITS)
            for _ in range(SUBS):
                router.create_agent(team.id, role=ROLE)
            for agent in router.agents(team.id):
                router.send(team.id, to=agent.display_name, content=task, type=MessageType.TASK)
        time.sleep(SECONDS)
        with router.store.engine.connect() as conn:
            counts = dict(
                conn.execute(
                    sa.select(LedgerRow.action, sa.func.count()).group_by(LedgerRow.action)
                ).all()
            )
        claimed = counts.get(LedgerAction.TURN_CLAIMED, 0)
        reenq = counts.get(LedgerAction.REENQUEUED, 0)
        refused = counts.get(LedgerAction.CLAIM_REFUSED, 0)
        routes = counts.get(LedgerAction.ROUTE, 0)
        print(
            f"teams={TEAMS}x{SUBS + 1} seconds={SECONDS} routes={routes} claimed={claimed} "
            f"reenqueued={reenq} ({100 * reenq / max(claimed, 1):.1f}% of claimed) "
            f"claim_refused={refused} asks={counts.get(LedgerAction.ASK, 0)}"
        )
    finally:
        for proc in workers.procs.values():
            proc.kill()
            proc.wait()
        router.close()
        redis_server.stop()
