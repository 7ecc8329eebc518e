"""`agent-router bench` as a user runs it: every published figure on both backends, each beside
its floor, as a ratio to the raw driver's floor and against its target, in the documented JSON
form. Nothing here is timed: the figures are only checked to be there and consistent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
import sqlalchemy as sa

CLI = str(Path(sys.executable).parent / "agent-router")


def _ratio_of(ratio: object, ours: float, floor: float) -> bool:
    """``ratio`` is ``ours / floor`` as the bench computes it: of the unrounded figures, rounded
    to 2 decimals, where ours and floor are printed rounded to 3 (a floor of 0.018 ms may be
    anything from 0.0175 to 0.0185, so the ratio lies between the quotients of those ends)."""
    assert isinstance(ratio, int | float)
    half = 0.0005
    low = (ours - half) / (floor + half)
    high = (ours + half) / (floor - half) if floor > half else float("inf")
    return low - 0.006 <= ratio <= high + 0.006


# The whole bench takes about two and a half minutes on two cores with nothing else running; among
# the other tests' processes it took more than the 280 s it is given.
@pytest.mark.alone
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
        assert set(row) == {
            "figure", "backend", "ours", "floor", "ratio", "raw_ratio", "target", "met", "unit"
        }, row  # fmt: skip
    by_backend: dict[str, dict[str, dict[str, object]]] = {}
    for row in rows:
        by_backend.setdefault(row["backend"], {})[row["figure"]] = row
    assert set(by_backend) == {"embedded", "postgresql+redis"}
    for backend, figures in by_backend.items():
        names = set(figures)
        for state in ("idle", "running", "waiting"):
            assert {f"route p50 ({state})", f"route p99 ({state})"} <= names, backend
        assert {"wake p50", "wake p99", "turn start p50", "turn start p99"} <= names, backend
        # Turn start's floor is the round trip after the same pause as its samples; the round
        # trip back to back is printed beside it.
        assert "Celery round trip p50, back to back" in names, backend
        for senders in (1, 4, 16):
            assert f"routed msgs/s ({senders} senders)" in names, backend
        assert "drain cost per message" in names
        assert "routed msgs/s (send_many of 8, 1 sender)" in names
        # Both floors, so that the stack's own overhead shows beside the physical one.
        for q in ("p50", "p99"):
            for name in ("raw driver", "our engine"):
                assert f"floor transaction {q} ({name})" in names, backend
        raw50 = figures["floor transaction p50 (raw driver)"]["ours"]
        raw99 = figures["floor transaction p99 (raw driver)"]["ours"]
        raw4 = figures["floor transactions/s, 4 threads (raw driver)"]["ours"]
        same4 = figures["same-work floor transactions/s, 4 threads (raw driver)"]["ours"]
        assert isinstance(raw50, float) and isinstance(raw99, float)
        assert isinstance(raw4, float) and isinstance(same4, float)
        assert "drain peak memory, 3000 queued (batches of 1000)" in names
        # Where four senders' time goes: the CPU of a send beside the raw floor transaction's,
        # this process's, and on PostgreSQL (here, on this machine) the server's.
        sides = ("client", "server") if backend == "postgresql+redis" else ("client",)
        cpu_rows = {f: r for f, r in figures.items() if "CPU per send" in f}
        assert set(cpu_rows) == {f"{side} CPU per send (4 senders)" for side in sides}, backend
        for figure, row in cpu_rows.items():
            assert row["target"] is None and row["raw_ratio"] == row["ratio"], (backend, figure)
        # The live feed (Redis only): a reader blocked in events() woken by a send to the lead,
        # beside a raw PUBLISH -> get_message; a route to the lead with its feed signal on and
        # off, and their difference (beside a raw PUBLISH), which may fall below zero.
        feed = {
            "feed wake p50 (commit -> reader holds it)",
            "feed wake p99 (commit -> reader holds it)",
            "feed read p50 (events after a cursor, no wait)",
            "route p50 (to the lead, feed signal off)",
            "route p50 (to the lead, feed signal on)",
        }
        cost = "feed signal cost p50 (route on - off)"
        postgres = backend == "postgresql+redis"
        assert (feed | {cost}) <= names if postgres else not (feed | {cost}) & names, backend
        if postgres:
            on, off = (figures[f"route p50 (to the lead, feed signal {s})"] for s in ("on", "off"))
            assert on["floor"] == off["ours"] and off["floor"] == raw50, backend
            signal = figures.pop(cost)
            assert signal["unit"] == "ms" and isinstance(signal["ours"], float), signal
            assert isinstance(signal["floor"], float) and signal["floor"] > 0, signal
            assert signal["target"] is None and signal["met"] is None, signal
        for figure, row in figures.items():
            ours, floor, ratio = row["ours"], row["floor"], row["ratio"]
            assert isinstance(ours, int | float) and ours > 0, (backend, figure)
            if floor is None:
                assert ratio is None, (backend, figure)
                assert figure.startswith(
                    (
                        "drain",
                        "database round trip",
                        "feed read",
                        "Celery round trip",
                        "router CPU per",
                        "statements per",
                    )
                ), (backend, figure)
            else:
                assert isinstance(floor, int | float) and floor > 0, (backend, figure)
                assert _ratio_of(ratio, ours, floor), (backend, figure)
            # Every latency and rate is also a ratio to the raw floor of the same kind.
            raw_ratio = row["raw_ratio"]
            if row["unit"] == "ms":
                raw = raw99 if " p99" in figure else raw50
                assert _ratio_of(raw_ratio, ours, raw), (backend, figure)
            elif figure == "routed msgs/s (4 senders)" or row["unit"] == "tx/s":
                assert _ratio_of(raw_ratio, ours, raw4), (backend, figure)
            # A target is judged on the figures of this run.
            if row["target"] is None:
                assert row["met"] is None, figure
            else:
                assert isinstance(row["met"], bool), figure
        targets = {f: r for f, r in figures.items() if r["target"] is not None}
        # The statements a turn sends are held to their bounds on PostgreSQL, where a
        # transition is one statement (a turn: 2k + 1, its claim making the first call's
        # transition, its end writing the lead's answer).
        statements = {
            "statements per model call (counted)": 2,
            "statements per turn of 1 model call (counted)": 3,
            "statements per turn of 4 model calls (counted)": 9,
        }
        bounded = set(statements) if postgres else set()
        # The built-in loop's wall time per model call beside a minimal loop's (PostgreSQL).
        loops = {"built-in loop, wall per model call"} if postgres else set()
        assert set(targets) == {
            "route p50 (idle)", "route p50 (running)", "route p50 (waiting)", "wake p50",
            "turn start p50", "routed msgs/s (4 senders)",
            "router CPU per model call (32k-token request, OpenAI SDK)", *bounded, *loops,
        }, backend  # fmt: skip
        if postgres:
            minimal = figures["minimal loop, wall per model call"]
            builtin = figures["built-in loop, wall per model call"]
            assert minimal["floor"] == minimal["ours"] == builtin["floor"], backend
        for figure, bound in statements.items():
            counted = figures[figure]
            assert counted["unit"] == "stmts" and counted["floor"] is None, (backend, figure)
            if figure in bounded:
                assert counted["met"] == (float(str(counted["ours"])) <= bound), figure
        # Model calls per second with the built-in loop beside the same-work floor: the rows a
        # model call must write, by hand.
        how = "4 turns at once"
        capacity = figures[f"model calls/s, built-in loop ({how})"]
        same_calls = figures[f"same-work floor model calls/s ({how})"]
        assert capacity["floor"] == same_calls["ours"] == same_calls["floor"], backend
        # A message sent -> the first model call holding it, beside the Celery round trip.
        for q in ("p50", "p99"):
            first_call = figures[f"send -> first model call {q}"]
            assert first_call["floor"] == figures[f"turn start {q}"]["floor"], (backend, q)
        for state, times in (("idle", 2), ("running", 2), ("waiting", 3)):
            route = figures[f"route p50 ({state})"]
            assert route["floor"] == raw50, (backend, state)
            ours = float(str(route["ours"]))
            if abs(ours - times * raw50) > 0.01:  # clear of the rounding to 3 decimals
                assert route["met"] == (ours <= times * raw50), (backend, state)
        # Four senders against the same-work floor: the rows a routed message must write.
        four = figures["routed msgs/s (4 senders)"]
        assert four["floor"] == same4, backend
        if abs(float(str(four["ours"])) - 0.9 * same4) > 0.01:
            assert four["met"] == (float(str(four["ours"])) >= 0.9 * same4), backend
        # A handful of turns against one per message. (Exactly one plus at most one follow-up
        # is asserted where the senders' timing is controlled: tests/integration; here, on a
        # loaded machine, senders slower than two turns could be answered by a third.)
        burst = figures["turns fired for a burst of 100"]
        assert burst["floor"] == 100 and 1 <= int(str(burst["ours"])) < 10, burst
        # The router's own CPU for one model call, at three transcript lengths (a model that
        # answers at once): printed, in microseconds, with no floor and no target.
        per_call = {
            f: r
            for f, r in figures.items()
            if f.startswith("router CPU per model call") and "OpenAI SDK" not in f
        }
        assert set(per_call) == {
            f"router CPU per model call ({n} transcript entries{how})"
            for n in ("10", "100", "1,000")
            for how in ("", ", window let go")
        }, backend
        for figure, row in per_call.items():
            assert row["unit"] == "us" and row["floor"] is None and row["target"] is None, figure
        # The CPU of one model call through the SDK at three request sizes, each beside the
        # same request's JSON encoding alone; at 32k tokens against twice the figure at 1k.
        sdk = {
            k: figures[f"router CPU per model call ({k}k-token request, OpenAI SDK)"]
            for k in (1, 8, 32)
        }
        for row in sdk.values():
            assert row["unit"] == "us" and isinstance(row["floor"], float), row
        first = float(str(sdk[1]["ours"]))
        if abs(float(str(sdk[32]["ours"])) - 2 * first) > 0.01:
            assert sdk[32]["met"] == (float(str(sdk[32]["ours"])) <= 2 * first), backend
        assert figures["route p50 (idle)"]["unit"] == "ms"
        assert figures["routed msgs/s (4 senders)"]["unit"] == "msg/s"


def test_scale_curve_fills_consistent_history_and_compares_each_size_with_the_first(
    fresh_pg_url: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    chart = tmp_path / "curve.svg"
    proc = subprocess.run(
        [CLI, "bench", "--json", "--samples", "6", "--scale", "400:20,2000:50",
         "--svg", str(chart), "--postgres-url", fresh_pg_url],
        check=False, capture_output=True, text=True, timeout=280, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {row["figure"]: row for row in json.loads(proc.stdout)}
    sizes = ("400 msgs, 20 teams", "2000 msgs, 50 teams")
    names = ("route p50", "claim p50", "sweeper pass p50")
    assert set(rows) == {f"fill to {s}" for s in sizes} | {
        f"{n} at {s}" for n in names for s in sizes
    }
    for name in names:
        first, second = rows[f"{name} at {sizes[0]}"], rows[f"{name} at {sizes[1]}"]
        # Each size's floor is the same figure at the smallest size, measured in the same run.
        assert first["floor"] == first["ours"] and second["floor"] == first["ours"], name
        ours, floor = float(second["ours"]), float(first["ours"])
        assert _ratio_of(second["ratio"], ours, floor), name
        assert second["target"] == "<= 1.2x the smallest size"
        if abs(ours - 1.2 * floor) > 0.01:
            assert second["met"] == (ours <= 1.2 * floor), name
        assert isinstance(second["raw_ratio"], float) and second["raw_ratio"] > 0
    # The filled history is what the router itself would have written.
    engine = sa.create_engine(fresh_pg_url)
    with engine.connect() as conn:
        one = conn.execute(
            sa.text(
                "SELECT (SELECT count(*) FROM ar_teams), (SELECT count(*) FROM ar_messages), "
                "(SELECT count(*) FROM ar_messages m WHERE m.status = 'delivered' AND NOT EXISTS "
                "  (SELECT 1 FROM ar_transcript_entries e WHERE e.message_id = m.id)), "
                "(SELECT count(*) FROM ar_agents a WHERE a.next_seq <> 1 + "
                "  (SELECT coalesce(max(seq), 0) FROM ar_messages m WHERE m.target_agent_id = a.id)"
                "  OR a.epoch <> (SELECT coalesce(max(epoch), 0) FROM ar_turns t "
                "                 WHERE t.agent_id = a.id)"
                "  OR a.next_position <> (SELECT coalesce(max(position) + 1, 0)"
                "                         FROM ar_transcript_entries e WHERE e.agent_id = a.id)), "
                "(SELECT count(*) FROM (SELECT agent_id FROM ar_transcript_entries"
                "  GROUP BY agent_id HAVING count(*) <> max(position) + 1) gaps), "
                "(SELECT count(*) FROM ar_turns WHERE status = 'running'), "
                "(SELECT count(*) FROM ar_outbox WHERE published_at IS NULL), "
                "(SELECT count(*) FROM ar_turns t WHERE NOT EXISTS (SELECT 1 FROM ar_outbox o "
                "  WHERE o.agent_id = t.agent_id AND o.epoch = t.epoch))"
            )
        ).one()
    engine.dispose()
    teams, messages, untold, off_seq, gaps, running, unpublished, unenqueued = one
    assert teams >= 50 and messages >= 2000
    assert (untold, off_seq, gaps, running, unpublished, unenqueued) == (0, 0, 0, 0, 0, 0)
    chart_root = ElementTree.parse(chart).getroot()
    lines = chart_root.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 3 and all(len(p.get("points", "").split()) == 2 for p in lines)


def test_scale_curve_refuses_sizes_that_shrink() -> None:
    proc = subprocess.run(
        [CLI, "bench", "--scale", "2000:50,400:20", "--postgres-url", "postgresql://nowhere/x"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "--scale" in proc.stderr
