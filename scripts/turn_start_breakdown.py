"""Where a turn start's milliseconds go, on PostgreSQL + Redis, with the worker in a process of
its own (as in production: the web process sends, a worker process claims).

    .venv/bin/python scripts/turn_start_breakdown.py \\
        --postgres-url postgresql+psycopg://root@127.0.0.1:5432/bench --samples 60

Each sample sends a message to an idle agent and waits until the worker has claimed its turn and
the agent rests again (as ``agent-router bench`` does). The sender marks when it took a pooled
connection, gave it back (after the route's statement, its own transaction on PostgreSQL) and
published the turn task; the statement itself is not marked, as a listener of the engine's
cursor events would send it through SQLAlchemy instead of the driver. The worker
marks when Celery received the task, started it, and the same steps of the claim, and
reports its marks through a Redis list after the claim. Both processes read the same clock
(``time.perf_counter`` is the system's monotonic clock on Linux), so the marks compare across
them. Printed: the median of each step, and one Celery round trip of a no-op task for scale
(sampled back to back, and after the same pause the turn's samples follow).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import redis
import sqlalchemy as sa
from celery import signals

from agent_router.hooks import HookChain, RouterHooks
from agent_router.ops import bench
from agent_router.settings import Settings
from agent_router.turn import Turn
from agent_router.worker import runtime

SENDER_STEPS = ["sent", "checkout", "checkin", "publish", "published"]
WORKER_STEPS = ["received", "started", "claim", "w_checkout", "w_checkin", "claimed"]


def worker() -> None:
    """The worker process: the runtime of ``AGENT_ROUTER_*``, marks reported after each claim."""
    settings = Settings()
    reports = redis.Redis.from_url(settings.redis_url or "")
    marks: dict[str, float] = {}

    def mark(name: str, *_: Any, **__: Any) -> None:
        marks.setdefault(name, time.perf_counter())

    def received(**_: Any) -> None:
        marks.clear()  # what the previous turn marked after its claim
        mark("received")

    signals.task_received.connect(received, weak=False)
    signals.task_prerun.connect(partial(mark, "started"), weak=False)

    class Report(RouterHooks):
        def after_claim(self, turn: Turn) -> None:
            mark("claimed")
            reports.rpush(f"breakdown:{turn.record.agent_id}", json.dumps(marks))

    rt = runtime.configure(settings, hooks=HookChain([Report(), runtime.default_hooks(settings)]))
    claim = rt.router.store.claim

    def marked_claim(*args: Any, **kwargs: Any) -> Any:
        mark("claim")
        return claim(*args, **kwargs)

    rt.router.store.claim = marked_claim  # type: ignore[method-assign]
    _mark_transactions(rt.router.store.engine, mark, "w_")
    bench._NoopTask(rt.app, settings.queue)  # the floor's task, as the bench registers it
    rt.app.worker_main(
        [
            *("worker", "--pool=threads", "--concurrency=4", "-Q", settings.queue),
            *("--loglevel=WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat"),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--postgres-url", required=True)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--samples", type=int, default=60)
    args = parser.parse_args()
    queue = f"breakdown.{uuid.uuid4().hex[:8]}"
    env = {
        "AGENT_ROUTER_DATABASE_URL": args.postgres_url,
        "AGENT_ROUTER_BROKER_URL": args.redis_url,
        "AGENT_ROUTER_REDIS_URL": args.redis_url,
        "AGENT_ROUTER_QUEUE": queue,
        # As in the bench: the scripted reply takes a quarter second, no other work.
        "AGENT_ROUTER_SCRIPTED_WRITE_SECONDS": "0.25",
        "AGENT_ROUTER_WORK_SECONDS": "0",
        "AGENT_ROUTER_OPENAI_MODEL": "scripted",  # every agent on the scripted model
    }
    settings = Settings(**{k.removeprefix("AGENT_ROUTER_").lower(): v for k, v in env.items()})
    rt = runtime.configure(settings)
    rt.router.create_schema()
    proc = subprocess.Popen([sys.executable, __file__, "--worker"], env={**os.environ, **env})
    try:
        _measure(rt, args.redis_url, args.samples)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        runtime.reset()


def _measure(rt: runtime.Runtime, redis_url: str, n: int) -> None:
    reports = redis.Redis.from_url(redis_url)
    marks: dict[str, float] = {}

    def mark(name: str, *_: Any, **__: Any) -> None:
        marks.setdefault(name, time.perf_counter())

    _mark_transactions(rt.router.store.engine, mark)
    signals.before_task_publish.connect(partial(mark, "publish"), weak=False)
    signals.after_task_publish.connect(partial(mark, "published"), weak=False)
    bench._until(lambda: rt.app.control.ping(timeout=0.5), timeout=60)  # the worker is up
    pause = rt.router.settings.scripted_write_seconds
    noop = bench._NoopTask(rt.app, rt.router.settings.queue)
    trips = {
        "back to back": _round_trips(noop, n, 0.0),
        f"after {pause} s": _round_trips(noop, n, pause),
    }
    team = rt.router.create_team()
    samples: list[dict[str, float]] = []
    for agent in [rt.router.create_agent(team.id, role="Bench") for _ in range(n)]:
        marks.clear()
        mark("sent")
        rt.router.send(team.id, to=agent.display_name, content="go", sender="user")
        mark("returned")
        _, report = reports.blpop([f"breakdown:{agent.id}"], timeout=30) or (None, "{}")
        samples.append({**marks, **json.loads(report)})
        bench._until(partial(bench._team_resting, rt.router, team.id))
    steps = SENDER_STEPS + WORKER_STEPS
    for before, after in itertools.pairwise(steps):
        took = [(s[after] - s[before]) * 1000 for s in samples if before in s and after in s]
        print(f"{before:>10} -> {after:<10} p50 {statistics.median(took):6.2f} ms")
    marking = [(s["returned"] - s["published"]) * 1000 for s in samples]
    print(
        f"{'published':>10} -> {'returned':<10} p50 {statistics.median(marking):6.2f} ms (sender)"
    )
    total = [(s["claimed"] - s["sent"]) * 1000 for s in samples]
    print(f"turn start p50 {statistics.median(total):.2f} ms")
    for label, trip in trips.items():
        print(f"Celery round trip, {label}: p50 {statistics.median(trip):.2f} ms")


def _mark_transactions(engine: sa.Engine, mark: Callable[..., None], prefix: str = "") -> None:
    """Mark the first connection's checkout and its checkin (after the statement that is its
    own transaction, or after a transaction's commit)."""
    for event, name in [("checkout", "checkout"), ("checkin", "checkin")]:
        sa.event.listen(engine, event, partial(mark, prefix + name))


def _round_trips(noop: bench._NoopTask, n: int, pause: float) -> list[float]:
    """``n`` Celery round trips of the bench's no-op task, each after ``pause`` seconds, ms."""
    return [noop.round_trip(after=pause) for _ in range(n)]


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        main()
