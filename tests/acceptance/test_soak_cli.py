"""`agent-router bench --soak` as an operator runs it, for a fraction of a minute: a worker
process, the scripted model server and two teams. Only the output's shape is checked (a row
per period with every figure, whether a request reached the context target, a slope with its
standard error per figure, the checks line):
the figures themselves depend on the machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from agent_router.ops.soak import COLUMNS, SLOPED

CLI = str(Path(sys.executable).parent / "agent-router")
NUMBER = r"[-+]?\d+(?:\.\d+)?"


def test_a_short_soak_prints_rows_slopes_and_clean_checks(pg_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    proc = subprocess.run(
        [CLI, "bench", "--soak", "0.25", "--period", "5", "--workers", "1", "--concurrency",
         "2", "--teams", "2", "--rate", "2", "--asks", "50", "--postgres-url", pg_url],
        check=False, capture_output=True, text=True, timeout=280, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("soak: 1 workers x 2 slots, 2 teams of 4, 2 sends/s, 50% asks")
    heading = lines.index("  ".join(h for _, h, _ in COLUMNS))
    rows = []
    for line in lines[heading + 1 :]:
        if not re.fullmatch(rf"\s*(?:{NUMBER}\s+){{{len(COLUMNS) - 1}}}{NUMBER}", line):
            break
        rows.append([float(cell) for cell in line.split()])
    assert len(rows) == 3  # 15 s, a row every 5
    assert all(row[1] > 0 for row in rows)  # sends in each period
    assert sum(row[2] for row in rows) > 0  # turns ended
    # Whether a request reached the context target (15 s of two teams: none does).
    (target,) = [line for line in lines if line.startswith("context target reached: ")]
    assert re.fullmatch(
        r"context target reached: no \(32000 tokens: 0 of \d+ agents' requests; "
        r"the largest request was \d+\.\d KiB\)",
        target,
    ), target
    slopes = lines.index("slopes per minute (± standard error):")
    for key, line in zip(SLOPED, lines[slopes + 1 : slopes + 1 + len(SLOPED)], strict=True):
        assert re.fullmatch(rf"\s+{key}\s+{NUMBER}\s+± {NUMBER}", line), line
    (checks,) = [line for line in lines if line.startswith("checks: ")]
    assert re.fullmatch(
        r"checks: \d+ sends, 2 teams, settled=yes, lost=0 duplicated=0 reordered=0 "
        r"violations=0 failures=0: OK",
        checks,
    ), checks
