"""`agent-router bench` as a user runs it: every published figure on both backends, each beside
its floor, in the documented JSON form. Nothing here is timed: the figures are only checked to
be there and consistent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = str(Path(sys.executable).parent / "agent-router")


def test_bench_reports_every_figure_beside_its_floor(fresh_pg_url: str, redis_url: str) -> None:
    # A database of its own: the bench leaves unpublished outbox rows (its route figures run
    # without a publisher) that no other test's sweeper should find.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    proc = subprocess.run(
        [CLI, "bench", "--json", "--samples", "20", "--queued", "3000",
         "--postgres-url", fresh_pg_url, "--redis-url", redis_url],
        check=False, capture_output=True, text=True, timeout=280, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)
    for row in rows:
        assert set(row) == {"figure", "backend", "ours", "floor", "ratio", "unit"}, row
    by_backend: dict[str, dict[str, dict[str, object]]] = {}
    for row in rows:
        by_backend.setdefault(row["backend"], {})[row["figure"]] = row
    assert set(by_backend) == {"embedded", "postgresql+redis"}
    for backend, figures in by_backend.items():
        names = set(figures)
        for state in ("idle", "running", "waiting"):
            assert {f"route p50 ({state})", f"route p99 ({state})"} <= names, backend
        assert {"wake p50", "wake p99", "turn start p50", "turn start p99"} <= names, backend
        for senders in (1, 4, 16):
            assert f"routed msgs/s ({senders} senders)" in names, backend
        assert "drain cost per message" in names
        assert "drain peak memory, 3000 queued (batches of 1000)" in names
        for figure, row in figures.items():
            ours, floor, ratio = row["ours"], row["floor"], row["ratio"]
            assert isinstance(ours, int | float) and ours > 0, (backend, figure)
            if floor is None:
                assert ratio is None and figure.startswith("drain"), (backend, figure)
            else:
                assert isinstance(floor, int | float) and floor > 0, (backend, figure)
                # The bench rounds ours and floor to 3 decimals and the ratio (of the unrounded
                # figures) to 2: a floor of 0.392 ms moves a ratio of 8.3 by up to 0.01.
                assert ratio == pytest.approx(ours / floor, rel=0.005, abs=0.006), (backend, figure)
        # A handful of turns against one per message. (Exactly one plus at most one follow-up
        # is asserted where the senders' timing is controlled: tests/integration; here, on a
        # loaded machine, senders slower than two turns could be answered by a third.)
        burst = figures["turns fired for a burst of 100"]
        assert burst["floor"] == 100 and 1 <= int(str(burst["ours"])) < 10, burst
        assert figures["route p50 (idle)"]["unit"] == "ms"
        assert figures["routed msgs/s (4 senders)"]["unit"] == "msg/s"
