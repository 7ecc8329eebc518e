"""The backlog run: TEAMS teams of 5 agents (a lead and 4 sub-agents), every one woken at once,
every model call taking MODEL_SECONDS, behind two `agent-router worker` processes of 2 slots each
with their sweeper timers on (leases of LEASE seconds, a sweep period of 0.5 s), on a private
Redis and a private database of the PostgreSQL server at 127.0.0.1. Once every team rests it
prints the turns claimed, the re-enqueues (and their share of the turns) and the claims the
fence refused: a backlog tens of leases deep must not be multiplied by re-enqueues of tasks
that are still queued.

    .venv/bin/python scripts/backlog_run.py [TEAMS MODEL_SECONDS LEASE]   (default: 60 1 2)

The workers import this module for their runtime (``slow_runtime``): the scripted models, each
call taking MODEL_SECONDS (``AGENT_ROUTER_BACKLOG_MODEL_SECONDS``).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from celery import Celery

from agent_router.agents.llm import Model, ScriptedModel
from agent_router.agents.roles import roles_from_env
from agent_router.agents.toolbox import agent_tools
from agent_router.broker import CeleryPublisher, create_app
from agent_router.budgeting import NO_LIMITS
from agent_router.domain import Agent, LedgerAction, MessageType
from agent_router.ops.chaos_processes import PrivateRedis, Workers, private_database
from agent_router.ops.demo import wait_quiescent
from agent_router.router import Router
from agent_router.settings import Settings
from agent_router.store.models import LedgerRow
from agent_router.worker import runtime

ADMIN = "postgresql+psycopg://root@127.0.0.1:5432/test"
SUB_AGENTS = 4
SLOTS = 2


class Slow:
    """A scripted model whose every call takes ``seconds``."""

    def __init__(self, model: Model, seconds: float) -> None:
        self.model, self.seconds = model, seconds

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        time.sleep(self.seconds)
        return self.model.complete(messages, tools)


def slow_runtime(settings: Settings, app: Celery) -> runtime.Runtime:
    """A worker's runtime: the scripted models, each call slowed down."""
    seconds = float(os.environ.get("AGENT_ROUTER_BACKLOG_MODEL_SECONDS", "1"))

    def models(agent: Agent) -> Model:
        return Slow(ScriptedModel.for_agent(agent), seconds)

    # Built here, not by runtime.configure: the factory runs under the runtime's lock.
    router = Router(settings, publisher=CeleryPublisher(app), hooks=runtime.default_hooks(settings))
    # The built-in tools, do_work included: the scripted sub-agents work through it.
    tools = agent_tools(settings, roles_from_env())
    return runtime.Runtime(router=router, models=models, tools=tools, app=app)


def main(teams: int, model_seconds: float, lease: float) -> None:
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        url = ADMIN.rsplit("/", 1)[0] + "/" + stack.enter_context(private_database(ADMIN))
        redis_server = PrivateRedis(workdir)
        redis_server.start()
        stack.callback(redis_server.stop)
        timing: dict[str, Any] = {
            "lease_seconds": lease,
            "heartbeat_seconds": min(0.5, lease / 4),
            "sweep_seconds": 0.5,
            "work_seconds": 0.0,
            "scripted_write_seconds": 0.0,
        }
        common: dict[str, Any] = {
            "broker_url": redis_server.url,
            "redis_url": redis_server.url,
            "queue": f"agent_router.backlog.{uuid.uuid4().hex[:8]}",
            **timing,
        }
        settings = Settings(database_url=url, **common)
        app = create_app(settings)
        router = Router(settings, publisher=CeleryPublisher(app))
        router.create_schema()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
        env.update({f"AGENT_ROUTER_{k.upper()}": str(v) for k, v in common.items()})
        env.update(
            AGENT_ROUTER_DATABASE_URL=url,
            AGENT_ROUTER_RUNTIME_FACTORY="backlog_run:slow_runtime",
            AGENT_ROUTER_BACKLOG_MODEL_SECONDS=str(model_seconds),
            PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")]),
        )
        workers = Workers(env, SLOTS, workdir)
        try:
            for i in range(2):
                workers.start(i)
            deadline = time.monotonic() + 60
            while len(app.control.ping(timeout=0.5)) < 2:  # both consume before the backlog
                if time.monotonic() > deadline:
                    raise SystemExit("the workers did not start: see their logs")
            started = time.monotonic()
            ids = []
            for _ in range(teams):
                team = router.create_team(budget=NO_LIMITS)
                ids.append(team.id)
                for _ in range(SUB_AGENTS):
                    router.create_agent(team.id, role="Full-Stack Engineer")
                for agent in router.agents(team.id):
                    router.send(team.id, to=agent.display_name, content="Ship it.",
                                type=MessageType.TASK)  # fmt: skip
            for team_id in ids:
                wait_quiescent(router, team_id, timeout=1800)
            seconds = time.monotonic() - started
        finally:
            for proc in workers.procs.values():
                proc.terminate()
                proc.wait(60)
        with router.store.engine.connect() as conn:
            counts = dict(
                conn.execute(
                    sa.select(LedgerRow.action, sa.func.count()).group_by(LedgerRow.action)
                ).all()
            )
        router.close()
        app.close()
    turns = counts.get(LedgerAction.TURN_CLAIMED, 0)
    reenqueued = counts.get(LedgerAction.REENQUEUED, 0)
    print(
        f"teams={teams}x{SUB_AGENTS + 1} model={model_seconds}s lease={lease}s "
        f"workers=2x{SLOTS} backlog={seconds:.0f}s ({seconds / lease:.0f} leases) "
        f"turns={turns} reenqueued={reenqueued} ({100 * reenqueued / max(turns, 1):.1f}% of "
        f"turns) claim_refused={counts.get(LedgerAction.CLAIM_REFUSED, 0)}"
    )


if __name__ == "__main__":
    TEAMS, MODEL_SECONDS, LEASE = (sys.argv[1:] + ["60", "1", "2"][len(sys.argv[1:]) :])[:3]
    main(int(TEAMS), float(MODEL_SECONDS), float(LEASE))
