"""The README's first command: ``agent-router demo`` on a fresh machine (no servers), run as a
user runs it, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from agent_router.ops import cli

CLI = str(Path(sys.executable).parent / "agent-router")
TIMEOUT = 240


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    # A clean environment: the embedded default must need no AGENT_ROUTER_* configuration.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    return subprocess.run(
        [CLI, "demo", *args], check=False, capture_output=True, text=True, timeout=TIMEOUT, env=env
    )


def test_demo_json_reports_every_outcome_and_passes() -> None:
    proc = run_demo("--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records: list[dict[str, Any]] = [json.loads(line) for line in proc.stdout.splitlines()]
    ledger = [r for r in records if r["event"] == "ledger"]
    checks = [r for r in records if r["event"] == "check"]
    result = records[-1]
    assert result == {
        "event": "result",
        "team_id": result["team_id"],
        "ok": True,
        "final": result["final"],
    }
    # The lead's last answer to the user, as a host reads the messages to the user.
    assert isinstance(result["final"], str) and result["final"].strip()
    assert len(checks) == 9 and all(c["ok"] for c in checks), checks
    assert {c["name"][:3] for c in checks} >= {"3.1", "3.2", "3.3", "3.4", "3.5"}

    # The timeline is the ledger: ids increase, every routing outcome of the scenarios shows.
    assert [r["id"] for r in ledger] == sorted(r["id"] for r in ledger)
    outcomes = {r["outcome"] for r in ledger if r["action"] == "route"}
    assert {"triggered_new_turn", "injected_inline", "queued", "resolved"} <= outcomes
    actions = {r["action"] for r in ledger}
    assert {"ask", "question_resolved", "stop_requested", "stopped"} <= actions
    agents = {r["agent"] for r in ledger}
    assert {"Team Leader", "UI Operator_1", "Full-Stack Engineer_1"} <= agents
    starts = [r for r in ledger if r["action"] == "turn_claimed"]
    # A turn ends with the hook (turn_ended) or by honouring a stop (stopped, with its turn id).
    ends = [
        r
        for r in ledger
        if r["action"] == "turn_ended" or (r["action"] == "stopped" and r["turn_id"])
    ]
    assert len(starts) == len(ends) >= 5
    follow_ups = [r for r in ledger if r["action"] == "follow_up"]
    assert any(r["agent"] == "UI Operator_1" for r in follow_ups)
    assert any(r["detail"].get("trigger") == "follow_up" for r in starts)


def test_demo_timeline_is_readable() -> None:
    proc = run_demo()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for text in (
        "injected_inline",
        "triggered_new_turn",
        "one follow-up turn scheduled",
        "turn 1 starts",
        "PASS 3.1",
        "PASS 3.2",
        "PASS 3.3",
        "PASS 3.4",
        "PASS 3.5",
        "PASS stop_sub_agent",
        "all guarantees held",
        "Team Leader: ",
    ):
        assert text in out, text
    assert "FAIL" not in out
    # The database is kept and the next commands point at it.
    url = next(line.split()[-1] for line in out.splitlines() if "agent-router ledger" in line)
    assert Path(url.removeprefix("sqlite:///")).is_file()
    ledger = subprocess.run(
        [CLI, "ledger", "1", "--json", "--database-url", url],
        check=False, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert ledger.returncode == 0 and len(ledger.stdout.splitlines()) > 20, ledger.stderr


def test_demo_help_documents_real_services() -> None:
    env = {**os.environ, "COLUMNS": "300"}  # so that rich does not wrap the help text
    proc = subprocess.run(
        [CLI, "demo", "--help"], check=False, capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 0
    for text in ("--database-url", "--broker-url", "agent-router worker", "--json"):
        assert text in proc.stdout, text


def test_status_in_the_middle_of_the_demo_shows_running_waiting_and_completed(
    tmp_path: Path,
) -> None:
    """The `agent-router status` command, polled while the real demo runs (scenario 3.5 holds
    UI Operator_1 waiting on a running Full-Stack Engineer_1 while the lead has completed)."""
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    demo = subprocess.Popen(
        [CLI, "demo", "--json", "--database-url", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    seen: list[set[str]] = []
    try:
        # The status command in-process (a subprocess takes seconds to start on 2 busy cores,
        # longer than the window); the binary itself is exercised in test_operate_cli.py.
        runner = CliRunner()
        while demo.poll() is None:
            status = runner.invoke(cli.app, ["status", "--json", "--database-url", url])
            if status.exit_code != 0:
                time.sleep(0.05)
                continue  # the demo may not have created its tables yet
            states = {json.loads(line)["state"] for line in status.stdout.splitlines() if line}
            seen.append(states)
            if {"running", "waiting", "completed"} <= states:
                break
        out, err = demo.communicate(timeout=TIMEOUT)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 0, out[-2000:] + err[-2000:]
    assert any({"running", "waiting", "completed"} <= s for s in seen), seen
