"""Alternate two or more checkouts' measurements, round by round, and print their medians.

Each checkout is ``NAME=DIR`` (a worktree with its own ``.venv``) and measures on a PostgreSQL
database of its own (``--db-prefix`` + NAME, created when missing), so that neither reads the
other's schema or rows. ``bench``: ``agent-router bench --json`` of each checkout (the route
p50s, four senders' msg/s and their ratio to the same-work floor, the CPU per send with four
senders); ``send-cost``: ``scripts/send_cost.py`` of this checkout run by each checkout's Python
(the client's and the server's CPU per send to a running agent, one sender); ``routes``: the
bench's floors, route and throughput figures alone, through each checkout's ``Bench``. On a shared
machine compare only the figures of one run: the rounds alternate so that each checkout sees the
same load::

    .venv/bin/python scripts/alternate.py --what bench --rounds 3 base=../base mine=.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

HERE = Path(__file__).resolve().parent
BENCH_FIGURES = {
    "floor transaction p50 (raw driver)": ("raw floor p50 ms", "ours"),
    "route p50 (idle)": ("route idle ms", "ours"),
    "route p50 (running)": ("route running ms", "ours"),
    "route p50 (waiting)": ("route waiting ms", "ours"),
    "routed msgs/s (4 senders)": ("4 senders msg/s", "ours"),
    "same-work floor transactions/s, 4 threads (raw driver)": ("same-work floor tx/s", "ours"),
    "client CPU per send (4 senders)": ("client us/send (4 senders)", "ours"),
    "server CPU per send (4 senders)": ("server us/send (4 senders)", "ours"),
    "turn start p50": ("turn start ms", "ours"),
}


def _ensure_database(admin_url: str, name: str) -> None:
    engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        if (
            conn.execute(
                sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
            ).first()
            is None
        ):
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    engine.dispose()


def _output(command: list[str], directory: Path) -> Any:
    """What ``command``, run in ``directory``, printed: one JSON value."""
    done = subprocess.run(command, cwd=directory, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def _bench(directory: Path, url: str, args: argparse.Namespace) -> dict[str, float]:
    out = _output(
        [
            str(directory / ".venv/bin/agent-router"),
            "bench",
            "--postgres-url",
            url,
            "--redis-url",
            args.redis_url,
            "--samples",
            str(args.samples),
            "--queued",
            str(args.queued),
            "--json",
        ],
        directory,
    )
    return _figures(out)


def _figures(rows: list[dict[str, Any]]) -> dict[str, float]:
    rows = [r for r in rows if r["backend"] == "postgresql+redis"]
    found: dict[str, float] = {}
    for r in rows:
        for figure, (label, field) in BENCH_FIGURES.items():
            if r["figure"].startswith(figure):
                found[label] = r[field]
        if r["figure"] == "routed msgs/s (4 senders)" and r["ratio"] is not None:
            found["4 senders / same-work floor"] = r["ratio"]
    return found


#: The bench's route and throughput figures alone (its floors first), on PostgreSQL + Redis: the
#: figures a send's cost moves, in a fraction of the whole bench's time.
_ROUTES = """
import sys
from agent_router.ops.bench import Bench
from agent_router.ops.bench_report import to_json
from agent_router.settings import Settings
url, redis_url, samples = sys.argv[1], sys.argv[2], int(sys.argv[3])
settings = Settings(database_url=url, broker_url=redis_url, redis_url=redis_url)
bench = Bench(settings, "postgresql+redis", samples=samples, redis_url=redis_url)
try:
    bench.measure_floors()
    bench.route_latency()
    bench.throughput()
    print(to_json(bench.rows))
finally:
    bench.close()
"""


def _routes(directory: Path, url: str, args: argparse.Namespace) -> dict[str, float]:
    out = _output(
        [
            str(directory / ".venv/bin/python"),
            "-c",
            _ROUTES,
            url,
            args.redis_url,
            str(args.samples),
        ],
        directory,
    )
    return _figures(out)


def _send_cost(directory: Path, url: str, _args: argparse.Namespace) -> dict[str, float]:
    out = _output(
        [str(directory / ".venv/bin/python"), str(HERE / "send_cost.py"), "--postgres-url", url],
        directory,
    )
    return {"client us/send": out["client_median"], "server us/send": out["server_median"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+", help="NAME=DIR")
    parser.add_argument("--what", choices=("bench", "routes", "send-cost"), default="bench")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432")
    parser.add_argument("--db-prefix", default="alt_")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--queued", type=int, default=20000)
    args = parser.parse_args()
    checkouts = [(n, Path(d).resolve()) for n, d in (c.split("=", 1) for c in args.checkouts)]
    measure = {"bench": _bench, "routes": _routes, "send-cost": _send_cost}[args.what]
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in checkouts}
    for name, _ in checkouts:
        _ensure_database(f"{args.postgres}/postgres", f"{args.db_prefix}{name}")
    for i in range(args.rounds):
        for name, directory in checkouts:
            started = time.monotonic()
            found = measure(directory, f"{args.postgres}/{args.db_prefix}{name}", args)
            results[name].append(found)
            print(
                f"round {i + 1} {name} ({time.monotonic() - started:.0f} s): {json.dumps(found)}",
                file=sys.stderr,
                flush=True,
            )
    labels = list(dict.fromkeys(k for runs in results.values() for found in runs for k in found))
    print(
        f"{'median of ' + str(args.rounds) + ' rounds':34s}" + "".join(f"{n:>14s}" for n in results)
    )
    for label in labels:
        cells = []
        for runs in results.values():
            values = [found[label] for found in runs if label in found]
            cells.append(f"{statistics.median(values):14.3f}" if values else f"{'-':>14s}")
        print(f"{label:34s}" + "".join(cells))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
