"""Every failure a new user meets is one line on stderr that says what to do, with exit status 1;
``--traceback`` shows the whole traceback. Each case runs the real ``agent-router`` binary in a
subprocess against real services (or against a port where nothing listens)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_router import Router, Settings
from agent_router.outbox import RecordingPublisher
from tests.support.chat_server import ChatServer, error

CLI = str(Path(sys.executable).parent / "agent-router")
#: Nothing listens on port 1 of this machine: a broker, Redis or model server that is down.
DOWN_REDIS = "redis://127.0.0.1:1/0"
DOWN_MODEL = "http://127.0.0.1:1/v1"


def run(
    *args: str, cwd: Path | None = None, timeout: float = 60, **env_vars: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_ROUTER_", "OPENAI_"))}
    env["COLUMNS"] = "200"
    env.update(env_vars)
    return subprocess.run(
        [CLI, *args], check=False, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )


def one_error_line(proc: subprocess.CompletedProcess[str], *, hint: str) -> str:
    """The single stderr line of a failed command, with its hint."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("agent-router: error: "), lines[0]
    assert "(hint: " in lines[0] and hint in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def team_url(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A SQLite database with the schema and a team of a lead and one sub-agent."""
    url = f"sqlite:///{tmp_path / 'team.db'}"
    router = Router(Settings(database_url=url), publisher=RecordingPublisher())
    router.create_schema()
    team = router.create_team()
    router.create_agent(team.id, role="UI Operator")
    yield url, team.id
    router.close()


def test_status_without_configuration_leaves_no_file_behind(tmp_path: Path) -> None:
    line = one_error_line(run("status", cwd=tmp_path), hint="db upgrade")
    assert "no database at agent_router.db" in line
    assert list(tmp_path.iterdir()) == []


def test_status_on_a_database_without_the_schema(fresh_pg_url: str) -> None:
    line = one_error_line(run("status", "--database-url", fresh_pg_url), hint="db upgrade")
    assert "no agent-router schema" in line


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_schema_behind_this_release_is_one_line_until_upgraded(
    backend: str, fresh_pg_url: str, tmp_path: Path
) -> None:
    """A database migrated by an older release: the worker (and doctor) refuse it with the
    revision it is at and the one this release needs; a command that reads it says the schema
    is older than the release; both take it once it is upgraded."""
    from agent_router.store import migrate

    url = f"sqlite:///{tmp_path / 'old.db'}" if backend == "sqlite" else fresh_pg_url
    migrate.upgrade(url, "0004")
    for command in (["worker", "--broker-url", DOWN_REDIS], ["doctor"]):
        proc = run(*command, "--database-url", url)
        assert proc.returncode == 1
        assert f"at revision 0004; this release's is {migrate.head()}" in proc.stderr + proc.stdout
    line = one_error_line(run("status", "--database-url", url), hint="db upgrade")
    assert "schema is older than this release" in line
    migrate.upgrade(url)
    proc = run("status", "--json", "--database-url", url)
    assert proc.returncode == 0, proc.stderr


def test_unreachable_database_and_invalid_setting() -> None:
    url = "postgresql+psycopg://root@127.0.0.1:1/nothing"
    one_error_line(run("status", "--database-url", url), hint="--database-url")
    line = one_error_line(
        run("status", "--database-url", url, AGENT_ROUTER_LEASE_SECONDS="-1"),
        hint="docs/configuration.md",
    )
    assert "lease_seconds" in line


def test_traceback_option_shows_the_whole_traceback(tmp_path: Path) -> None:
    proc = run("--traceback", "status", cwd=tmp_path)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert "NotReadyError" in proc.stderr


def test_postgres_urls_are_accepted(pg_schema_url: str) -> None:
    short = "postgres://" + pg_schema_url.split("://", 1)[1]
    proc = run("status", "--json", "--database-url", short)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_send_with_the_broker_down_says_the_sweeper_publishes(team_url: tuple[str, int]) -> None:
    url, team = team_url
    proc = run(
        "send", str(team), "UI Operator_1", "hello", "--database-url", url, "--broker-url",
        DOWN_REDIS,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [warning] = proc.stderr.splitlines()
    assert warning.startswith("agent-router: warning: broker redis://127.0.0.1:1/0 unreachable")
    assert "sweeper publishes" in warning
    assert "triggered_new_turn" in proc.stdout
    # The message was committed, its turn waits in the outbox.
    router = Router(Settings(database_url=url))
    try:
        [entry] = router.store.reads.unpublished()
        assert entry.payload["agent"] == "UI Operator_1"
    finally:
        router.close()


def test_demo_with_redis_down_fails_at_once(tmp_path: Path) -> None:
    line = one_error_line(run("demo", "--broker-url", DOWN_REDIS, cwd=tmp_path), hint="broker")
    assert "unreachable" in line


def test_worker_refuses_memory_broker_and_a_database_without_schema(tmp_path: Path) -> None:
    line = one_error_line(run("worker", cwd=tmp_path), hint="--broker-url")
    assert "memory://" in line
    empty = tmp_path / "empty.db"
    empty.touch()
    line = one_error_line(
        run("worker", "--database-url", f"sqlite:///{empty}", "--broker-url", DOWN_REDIS),
        hint="db upgrade",
    )
    assert "no agent-router schema" in line


def test_run_against_an_unreachable_model(tmp_path: Path) -> None:
    proc = run(
        "run", "do it", "--model", "m", "--base-url", DOWN_MODEL, cwd=tmp_path,
        OPENAI_API_KEY="sk-test",
    )  # fmt: skip
    line = one_error_line(proc, hint="--base-url")
    assert "model endpoint" in line and "unreachable" in line


def test_ledger_into_a_closed_pipe_ends_quietly(team_url: tuple[str, int]) -> None:
    url, team = team_url
    router = Router(Settings(database_url=url), publisher=RecordingPublisher())
    for i in range(600):  # far more than a pipe buffers
        router.send(team, to="UI Operator_1", content=f"note {i}", wake=False)
    router.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    proc = subprocess.Popen(
        [CLI, "ledger", str(team), "--database-url", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()
    proc.stdout.close()  # what `| head -1` does
    proc.wait(timeout=60)
    assert proc.stderr.read() == b""  # no BrokenPipeError, nothing at all


def test_ledger_follow_with_agent_and_outcome_filters(team_url: tuple[str, int]) -> None:
    url, team = team_url
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    follow = subprocess.Popen(
        [CLI, "ledger", str(team), "--follow", "--json", "--agent", "UI Operator_1",
         "--outcome", "queued", "--database-url", url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        router = Router(Settings(database_url=url), publisher=RecordingPublisher())
        router.send(team, to="Team Leader", content="for the lead", wake=False)  # other agent
        router.send(team, to="UI Operator_1", content="a note", wake=False)  # queued
        router.send(team, to="UI Operator_1", content="wake up")  # triggered_new_turn
        router.close()
        assert follow.stdout is not None
        ready, _, _ = select.select([follow.stdout], [], [], 60)
        assert ready, "ledger --follow printed nothing"
        record = json.loads(follow.stdout.readline())
    finally:
        follow.terminate()
        follow.wait(timeout=30)
    assert record["agent"] == "UI Operator_1" and record["outcome"] == "queued"
    assert '"a note"' in record["text"]


def test_status_fits_in_80_columns(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'team.db'}"
    router = Router(Settings(database_url=url), publisher=RecordingPublisher())
    router.create_schema()
    team = router.create_team()
    router.create_agent(team.id, role="Full-Stack Engineer")
    router.send(team.id, to="Full-Stack Engineer_1", content="go")
    other = router.create_team()
    router.close()
    proc = run("status", str(team.id), "--database-url", url, COLUMNS="80")
    assert proc.returncode == 0, proc.stderr
    assert all(len(line) <= 80 for line in proc.stdout.splitlines())
    row = next(line for line in proc.stdout.splitlines() if "Full-Stack Engineer_1" in line)
    assert "scheduled" in row and "…" not in proc.stdout
    # All teams: one table with a team column, however many teams the page holds.
    everyone = run("status", "--database-url", url, COLUMNS="80")
    assert everyone.returncode == 0, everyone.stderr
    lines = everyone.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in everyone.stdout
    assert sum("all teams" in line for line in lines) == 1
    rows = [line.split() for line in lines if line.split() and line.split()[0].isdigit()]
    assert sorted((r[0], r[1]) for r in rows) == sorted(
        [(str(team.id), "Team"), (str(team.id), "Full-Stack"), (str(other.id), "Team")]
    )


def test_doctor_reports_each_service(pg_schema_url: str, redis_url: str) -> None:
    good = run("doctor", "--json", "--database-url", pg_schema_url, "--broker-url", redis_url)
    assert good.returncode == 0, good.stdout + good.stderr
    checks = {c["check"]: c for c in map(json.loads, good.stdout.splitlines())}
    assert set(checks) == {"database", "schema", "broker", "redis"}
    assert all(c["ok"] for c in checks.values())

    bad = run(
        "doctor", "--check-model", "--database-url", pg_schema_url, "--broker-url", DOWN_REDIS,
        AGENT_ROUTER_OPENAI_BASE_URL=DOWN_MODEL,
    )  # fmt: skip
    assert bad.returncode == 1
    lines = {line.split()[1]: line for line in bad.stdout.splitlines()}
    assert lines["database"].startswith("ok") and lines["schema"].startswith("ok")
    assert lines["broker"].startswith("FAIL") and "hint:" in lines["broker"]
    assert lines["redis"].startswith("FAIL") and lines["model"].startswith("FAIL")


def test_db_current_and_history(fresh_pg_url: str) -> None:
    history = run("db", "history")
    assert history.returncode == 0, history.stderr
    assert "0001" in history.stdout
    head = history.stdout.splitlines()[0].split()[2].rstrip(",")
    assert run("db", "current", "--database-url", fresh_pg_url).stdout.startswith("none:")
    assert run("db", "upgrade", "--database-url", fresh_pg_url).returncode == 0
    current = run("db", "current", "--database-url", fresh_pg_url)
    assert current.returncode == 0, current.stderr
    assert current.stdout.split()[0] == head and "(head)" in current.stdout


def test_help_is_reflowed_text_not_raw_markup() -> None:
    proc = run("--help", COLUMNS="300")
    assert proc.returncode == 0
    assert "``" not in proc.stdout and "`" not in proc.stdout
    # The docstring's line breaks do not survive as short lines: paragraphs reflow.
    assert "OpenAI-compatible model (API key from AGENT_ROUTER_OPENAI_API_KEY" in proc.stdout
    for command in ("doctor", "timeline", "web", "metrics"):
        assert f" {command} " in proc.stdout, command


def test_json_log_format_for_the_cli(team_url: tuple[str, int]) -> None:
    url, team = team_url
    proc = run(
        "--log-format", "json", "send", str(team), "UI Operator_1", "hello",
        "--database-url", url, "--broker-url", DOWN_REDIS,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stderr.splitlines()
    record = json.loads(line)
    assert record["level"] == "WARNING" and record["logger"] == "agent_router.cli"
    assert "sweeper publishes" in record["message"]


def test_run_with_a_failing_model_logs_one_line_per_record(tmp_path: Path) -> None:
    with ChatServer(responder=lambda _request: error(401, "bad key")) as server:
        proc = run(
            "run", "do it", "--model", "m", "--base-url", server.base_url, "--timeout", "60",
            cwd=tmp_path, OPENAI_API_KEY="sk-test", timeout=120,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert lines and all(line.startswith("agent-router: ") for line in lines), lines
    failed = next(line for line in lines if "turn failed" in line)
    assert failed.startswith("agent-router: error: turn failed team_id=")
    assert 'agent="Team Leader"' in failed and "ModelError" in failed


def test_ledger_follow_into_a_closed_pipe_ends(team_url: tuple[str, int]) -> None:
    url, team = team_url
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    follow = subprocess.Popen(
        [CLI, "ledger", str(team), "--follow", "--json", "--database-url", url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        assert follow.stdout is not None and follow.stderr is not None
        ready, _, _ = select.select([follow.stdout], [], [], 60)
        assert ready and follow.stdout.readline()
        follow.stdout.close()  # what `| head -1` does
        router = Router(Settings(database_url=url), publisher=RecordingPublisher())
        router.send(team, to="UI Operator_1", content="one more event to print")
        router.close()
        follow.wait(timeout=60)
        assert follow.stderr.read() == b""
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()


@pytest.mark.parametrize("command", ["timeline", "check", "ledger", "team delete"])
def test_a_team_id_no_database_holds_is_the_same_one_line_on_both(
    team_url: tuple[str, int], pg_schema_url: str, command: str
) -> None:
    """A team id past 64 bits never reaches SQL (one database would say "bigint out of range",
    the other raise OverflowError): both give the same line."""
    lines = {
        run(*command.split(), str(10**23), "--database-url", url).stderr
        for url in (team_url[0], pg_schema_url)
    }
    (line,) = lines
    assert line == (
        f"agent-router: error: unknown team {10**23} (hint: `agent-router status` lists every "
        "team and its agents)\n"
    )
