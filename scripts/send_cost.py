"""The CPU one send to a running agent costs, client and server, in one process.

Rounds of sends to a running agent through ``Router.send`` (one thread, so one pooled
connection): the client's CPU per send is this thread's ``time.thread_time``, the server's the
on-CPU time of the backend that ran them (``/proc/<pid>/schedstat``, nanoseconds; PostgreSQL on
this machine only). Run it from the checkout to measure; alternate two checkouts' runs to
compare them, never runs far apart in time::

    .venv/bin/python scripts/send_cost.py --postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test

One JSON object: the per-round figures (us per send) and their medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

from agent_router import Router, Settings


def _on_cpu_ns(pids: list[int]) -> int:
    return sum(int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) for pid in pids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres-url", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sends", type=int, default=400)
    parser.add_argument("--profile", help="write a cProfile of the rounds' sends to this file")
    args = parser.parse_args()
    app = f"send_cost_{uuid.uuid4().hex[:8]}"
    sep = "&" if "?" in args.postgres_url else "?"
    router = Router(
        Settings(database_url=f"{args.postgres_url}{sep}application_name={app}"), publisher=None
    )
    router.create_schema()
    team = router.create_team()
    router.create_agent(team.id, role="Bench")
    router.send(team.id, to="Bench_1", content="start", sender="user")
    turn = router.claim_turn(team.id, "Bench_1")
    assert turn is not None
    turn.drain()

    def send() -> None:
        router.send(team.id, to="Bench_1", content="m", sender="user")

    for _ in range(100):  # warm: statements prepared, caches filled
        send()
    admin = sa.create_engine(args.postgres_url.split("?")[0], poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        pids = list(
            conn.execute(
                sa.text("SELECT pid FROM pg_stat_activity WHERE application_name = :app"),
                {"app": app},
            ).scalars()
        )
    admin.dispose()
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)  # CPU, not waits
    client: list[float] = []
    server: list[float] = []
    for _ in range(args.rounds):
        s0 = _on_cpu_ns(pids)
        c0 = time.thread_time()
        if profiler is not None:
            profiler.enable()
        for _ in range(args.sends):
            send()
        if profiler is not None:
            profiler.disable()
        c1 = time.thread_time()
        s1 = _on_cpu_ns(pids)
        client.append((c1 - c0) / args.sends * 1e6)
        server.append((s1 - s0) / args.sends / 1e3)
    if profiler is not None:
        profiler.dump_stats(args.profile)
    router.close()
    print(
        json.dumps(
            {
                "client_us": [round(v, 1) for v in client],
                "server_us": [round(v, 1) for v in server],
                "client_median": round(statistics.median(client), 1),
                "server_median": round(statistics.median(server), 1),
                "backends": len(pids),
            }
        )
    )


if __name__ == "__main__":
    main()
