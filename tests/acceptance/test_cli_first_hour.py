"""What a newcomer meets in the first hour with the CLI, each through the real ``agent-router``
binary: every failure is one line that says what to do, with its exit status (1; usage errors 2,
as Click's), and the commands take what a newcomer types."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_router import Router, Settings
from agent_router.outbox import RecordingPublisher
from agent_router.store import migrate
from tests.acceptance.test_errors_cli import CLI, DOWN_REDIS, one_error_line, run
from tests.acceptance.test_run_cli import scripted_llm
from tests.support.chat_server import ChatServer

#: Nothing listens on port 1 of this machine.
DOWN_POSTGRES = "postgresql+psycopg://root@127.0.0.1:1/nothing"


@pytest.fixture
def blocked_team(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A SQLite database with three teams; the last has a sub-agent blocked in an ask, one
    running, and a lead with a question to answer."""
    url = f"sqlite:///{tmp_path / 'team.db'}"
    router = Router(Settings(database_url=url), publisher=RecordingPublisher())
    router.create_schema()
    for _ in range(3):
        team = router.create_team().id
    router.create_agent(team, role="Full-Stack Engineer")
    router.create_agent(team, role="UI Operator")
    router.send(team, to="Full-Stack Engineer_1", content="go")
    asking = router.claim_turn(team, "Full-Stack Engineer_1")
    assert asking is not None
    asking.drain()
    call = {"id": "ask-1", "type": "function", "function": {"name": "ask_master"}}
    asking.append_assistant({"role": "assistant", "content": None, "tool_calls": [call]})
    asking.ask("Team Leader", "Which auth module?", tool_call_id="ask-1")
    router.send(team, to="UI Operator_1", content="go")
    assert router.claim_turn(team, "UI Operator_1") is not None
    yield url, team
    router.close()


def test_send_with_the_database_down_is_one_line_with_a_hint() -> None:
    line = one_error_line(
        run("send", "1", "Team Leader", "hi", "--database-url", DOWN_POSTGRES),
        hint="is the database server running?",
    )
    assert "Connection refused" in line
    assert "--traceback" not in line


def test_send_on_a_database_without_the_schema(fresh_pg_url: str) -> None:
    line = one_error_line(
        run("send", "1", "Team Leader", "hi", "--database-url", fresh_pg_url),
        hint="`agent-router db upgrade --database-url URL`",
    )
    assert "no agent-router schema" in line and "UndefinedTable" not in line


def test_a_worker_with_the_database_down_says_it_in_whole_words() -> None:
    line = one_error_line(
        run("worker", "--database-url", DOWN_POSTGRES, "--broker-url", DOWN_REDIS),
        hint="--database-url",
    )
    # The driver's whole sentence, not cut inside a word.
    assert "accepting TCP/IP connections?" in line


def test_a_worker_with_the_broker_down_refuses_to_start_in_one_line(pg_schema_url: str) -> None:
    proc = run("worker", "--database-url", pg_schema_url, "--broker-url", DOWN_REDIS)
    line = one_error_line(proc, hint="--wait-for-broker")
    assert line.startswith("agent-router: error: broker redis://127.0.0.1:1/0 unreachable")
    assert proc.stdout == ""  # no banner, no retries


def test_unknown_team_and_agent_names_say_what_there_is(blocked_team: tuple[str, int]) -> None:
    url, team = blocked_team
    line = one_error_line(
        run("send", str(team), "team leader", "hi", "--database-url", url),
        hint="did you mean 'Team Leader'?",
    )
    assert f"team {team} has Team Leader, Full-Stack Engineer_1, UI Operator_1" in line
    one_error_line(
        run("stop", str(team), "full-stack engineer", "--database-url", url),
        hint="did you mean 'Full-Stack Engineer_1'?",
    )
    nothing_close = one_error_line(
        run("inspect", "agent", str(team), "Designer_9", "--database-url", url),
        hint=f"team {team} has Team Leader",
    )
    assert "did you mean" not in nothing_close
    one_error_line(
        run("send", "999", "Team Leader", "hi", "--database-url", url),
        hint="`agent-router status` lists every team",
    )


def test_db_current_says_where_the_schema_is(fresh_pg_url: str) -> None:
    empty = run("db", "current", "--database-url", fresh_pg_url)
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.startswith("none: the database has no agent-router schema")
    assert "agent-router db upgrade" in empty.stdout
    migrate.upgrade(fresh_pg_url, "0001")
    behind = run("db", "current", "--database-url", fresh_pg_url)
    assert behind.stdout.split()[0] == "0001"
    assert f"head is {migrate.head()}" in behind.stdout
    migrate.upgrade(fresh_pg_url)
    current = run("db", "current", "--database-url", fresh_pg_url)
    assert current.stdout.strip() == f"{migrate.head()} (head)"


def test_a_port_in_use_is_one_line(blocked_team: tuple[str, int]) -> None:
    url, _team = blocked_team
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_error_line(
            run("web", "--port", str(port), "--database-url", url, timeout=30),
            hint="pass another --port",
        )
    assert "the port is in use" in line


def test_status_takes_the_team_as_an_option_too(blocked_team: tuple[str, int]) -> None:
    url, team = blocked_team
    positional = run("status", str(team), "--json", "--database-url", url)
    option = run("status", "--team", str(team), "--json", "--database-url", url)
    assert option.returncode == 0, option.stderr
    assert option.stdout.count("\n") == 3
    assert [r.split('"state"')[1][:14] for r in option.stdout.splitlines()] == [
        r.split('"state"')[1][:14] for r in positional.stdout.splitlines()
    ]
    both = run("status", str(team), "--team", "1", "--database-url", url)
    assert both.returncode == 2 and "differ" in both.stderr


def test_status_of_blocked_and_running_agents_fits_80_columns(
    blocked_team: tuple[str, int],
) -> None:
    url, team = blocked_team
    for args in ((str(team),), ()):
        proc = run("status", *args, "--database-url", url, COLUMNS="80")
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert all(len(line) <= 80 for line in lines), proc.stdout
        header = next(line for line in lines if " agent " in line)
        assert header.split()[-2:] == ["turn", "lease"]
        engineer = next(line for line in lines if "Full-Stack Engineer_1" in line)
        # The lease left, or "expired" when the machine took its length to get here.
        assert re.search(
            r"Full-Stack Engineer_1 +blocked +1 +0 +\d+ +- +\d+ +(\d+s|expired) *$", engineer
        )
        operator = next(line for line in lines if "UI Operator_1" in line)
        assert re.search(r"running .* (\d+s|expired) *$", operator)
        # Every row on one line: no name wraps onto a line of its own.
        assert not any(line.strip() in ("Engineer_1", "Operator_1") for line in lines)


def test_doctor_checks_the_model_list_at_the_base_url_given(pg_schema_url: str) -> None:
    def model_line(*args: str, **env: str) -> tuple[int, str]:
        proc = run("doctor", *args, "--database-url", pg_schema_url, cwd=None, timeout=60, **env)
        line = next(line for line in proc.stdout.splitlines() if line.split()[1] == "model")
        return proc.returncode, line

    with ChatServer() as server:
        status, line = model_line("--base-url", server.base_url)
        assert status == 0 and line.startswith("ok") and "1 model(s)" in line
        # A server that is not an OpenAI-compatible base URL answers 404 there.
        status, line = model_line("--base-url", server.base_url.removesuffix("/v1"))
        assert status == 1 and line.startswith("FAIL") and "answered 404" in line
        assert "/v1" in line and "--base-url" in line
        # The model list takes no scripted reply; only the request off /v1 is recorded.
        assert [r.path for r in server.requests] == ["/models"]
    with ChatServer(api_key="sk-right") as server:
        status, line = model_line("--check-model", AGENT_ROUTER_OPENAI_BASE_URL=server.base_url,
                                  OPENAI_API_KEY="sk-wrong")  # fmt: skip
        assert status == 1 and "refused the API key (401)" in line
        status, line = model_line("--base-url", server.base_url, OPENAI_API_KEY="sk-right")
        assert status == 0 and line.startswith("ok")
    status, line = model_line("--base-url", "not-a-url")
    assert status == 1 and "is not an http(s):// URL" in line and "unreachable" not in line
    # A model named is one the endpoint must list; naming one is what turns the check on.
    with ChatServer() as server:
        env = {"AGENT_ROUTER_OPENAI_BASE_URL": server.base_url}
        status, line = model_line("--model", "test-model", **env)
        assert status == 0 and "test-model among them" in line
        status, line = model_line("--model", "gpt-typo", **env)
        assert status == 1 and line.startswith("FAIL") and "does not list 'gpt-typo'" in line
        status, line = model_line(AGENT_ROUTER_OPENAI_MODEL="gpt-typo", **env)
        assert status == 1 and "does not list 'gpt-typo'" in line


def test_run_names_only_the_option_that_is_wrong_and_says_what_tools_agents_get() -> None:
    proc = run("run", "--mcp-server", "git", "--list-tools")
    assert proc.returncode == 2
    assert "--mcp-server" in proc.stderr and "--host-tools" not in proc.stderr
    assert "NAME=COMMAND_OR_URL" in proc.stderr
    helped = " ".join(run("run", "--help", COLUMNS="300").stdout.split())
    assert "multi-agent tools only" not in helped
    assert "sub-agents also get the MCP servers and host functions their role declares" in helped


def _next_commands(stdout: str) -> list[list[str]]:
    """The commands printed under ``next``, split as a shell splits them."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "look at team" in line)
    return [shlex.split(line) for line in lines[start + 1 :] if line.startswith("  ")]


def _run_each(commands: list[list[str]], cwd: Path) -> None:
    """Every command but ``web`` (a server) runs as printed, from where it was printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_ROUTER_", "OPENAI_"))}
    for command in commands:
        if "web" in command:
            continue
        done = subprocess.run(command, cwd=cwd, env=env, check=False, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, (command, done.stderr)


def test_demo_takes_the_database_from_the_environment_and_prints_runnable_commands(
    tmp_path: Path,
) -> None:
    """Run as ``./dev demo`` runs it: by a relative path that is not on PATH."""
    venv_bin = Path(sys.executable).parent
    (tmp_path / "bin").symlink_to(venv_bin)
    url = f"sqlite:///{tmp_path / 'mine.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    env["PATH"] = "/usr/bin:/bin"
    env["AGENT_ROUTER_DATABASE_URL"] = url
    proc = subprocess.run(["bin/agent-router", "demo"], cwd=tmp_path, env=env, check=False,
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp_path / "mine.db").is_file()
    commands = _next_commands(proc.stdout)
    assert [c[0] for c in commands] == ["bin/agent-router"] * 4
    assert all(url in c for c in commands)
    _run_each(commands, tmp_path)
    assert (tmp_path / "team.html").is_file()  # the timeline command's page


def test_run_prints_its_team_and_keeps_its_database_unless_asked_not_to(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_ROUTER_", "OPENAI_"))}
    env.update(OPENAI_API_KEY="sk-test", AGENT_ROUTER_WORK_SECONDS="0", TMPDIR=str(tmp_path))
    task = "Say hello."
    with ChatServer(responder=scripted_llm) as server:
        args = [CLI, "run", task, "--model", "test-model", "--base-url", server.base_url]
        kept = subprocess.run(args, env=env, check=False, capture_output=True, text=True,
                              timeout=240)  # fmt: skip
        gone = subprocess.run([*args, "--json", "--no-keep-database"], env=env, check=False,
                              capture_output=True, text=True, timeout=240)  # fmt: skip
    assert kept.returncode == 0, kept.stdout[-2000:] + kept.stderr[-2000:]
    # The model has no price: the default cost budget cannot stop the team, said once.
    unpriced = [line for line in kept.stderr.splitlines() if "has no price" in line]
    assert len(unpriced) == 1 and unpriced[0].startswith("agent-router: warning: model ")
    team = re.search(r"^team +(\d+)$", kept.stdout, re.M)
    assert team is not None, kept.stdout
    commands = _next_commands(kept.stdout)
    assert f"look at team {team.group(1)} with:" in kept.stdout
    assert commands[0][1:3] == ["status", team.group(1)]
    _run_each(commands, tmp_path)
    assert gone.returncode == 0, gone.stdout[-2000:] + gone.stderr[-2000:]
    assert json.loads(gone.stdout.splitlines()[-1])["database"] is None
    # The kept run's directory is there; the other's is not.
    assert len(list(tmp_path.glob("agent-router-run-*"))) == 1


def test_ledger_filters_that_match_nothing_say_so(blocked_team: tuple[str, int]) -> None:
    """A filter no record can match is an error with the value meant, not an empty listing."""
    url, team = blocked_team
    line = one_error_line(
        run("ledger", str(team), "--outcome", "bogus", "--database-url", url),
        hint="the outcomes are: resolved, injected_inline, coalesced, triggered_new_turn",
    )
    assert "no outcome 'bogus'" in line and "did you mean" not in line
    one_error_line(
        run("ledger", str(team), "--outcome", "queud", "--database-url", url),
        hint="queued",
    ).index("did you mean 'queued'?")
    line = one_error_line(
        run("ledger", str(team), "--agent", "Nobody", "--database-url", url),
        hint=f"team {team} has: Team Leader, Full-Stack Engineer_1, UI Operator_1",
    )
    assert "no agent 'Nobody'" in line and "did you mean" not in line
    one_error_line(
        run("ledger", str(team), "--agent", "ui operator_1", "--database-url", url),
        hint="Team Leader",
    ).index("did you mean 'UI Operator_1'?")
    # The filters that match still print the records they match.
    kept = run("ledger", str(team), "--agent", "UI Operator_1", "--outcome", "triggered_new_turn",
               "--json", "--database-url", url)  # fmt: skip
    assert kept.returncode == 0, kept.stderr
    records = [json.loads(line) for line in kept.stdout.splitlines()]
    assert records and {(r["agent"], r["outcome"]) for r in records} == {
        ("UI Operator_1", "triggered_new_turn")
    }


@pytest.mark.parametrize("command", ["status", "check 1", "ledger 1", "web --port 0", "doctor"])
def test_a_database_that_does_not_exist_is_named_with_what_creates_it(
    command: str, tmp_path: Path
) -> None:
    missing_file = tmp_path / "missing.db"
    proc = run(*shlex.split(command), "--database-url", f"sqlite:///{missing_file}", timeout=30)
    said = proc.stderr + proc.stdout
    assert proc.returncode == 1, said
    assert f"no database at {missing_file}" in said and "agent-router db upgrade" in said
    assert "server running" not in said
    assert not missing_file.exists()  # no empty file left behind
    missing_db = f"postgresql+psycopg://root@127.0.0.1:5432/no_such_db_{os.getpid()}"
    proc = run(*shlex.split(command), "--database-url", missing_db, timeout=30)
    said = proc.stderr + proc.stdout
    assert proc.returncode == 1, said
    assert f"the PostgreSQL server has no database 'no_such_db_{os.getpid()}'" in said
    assert f"`createdb no_such_db_{os.getpid()}`" in said and "agent-router db upgrade" in said
    assert "server running" not in said
    if not command.startswith("doctor"):
        assert len(proc.stderr.splitlines()) == 1, proc.stderr


def test_timeline_into_a_directory_that_does_not_exist(
    blocked_team: tuple[str, int], tmp_path: Path
) -> None:
    url, team = blocked_team
    target = tmp_path / "missing" / "dir" / "team.html"
    line = one_error_line(
        run("timeline", str(team), "-o", str(target), "--database-url", url),
        hint=f"`mkdir -p {target.parent}`",
    )
    assert f"no directory {target.parent} to write team.html in" in line
    assert "FileNotFoundError" not in line and "doctor" not in line
    assert not (tmp_path / "missing").exists()


def test_every_refusal_of_an_act_has_a_hint(blocked_team: tuple[str, int]) -> None:
    url, team = blocked_team
    db = ("--database-url", url)
    # The library's own refusal names the agent meant; the hint lists the team.
    line = one_error_line(
        run("send", str(team), "ui operator 1", "hi", *db), hint=f"team {team} has Team Leader"
    )
    assert f"no agent 'ui operator 1' in team {team}; did you mean 'UI Operator_1'?" in line
    assert line.count("did you mean") == 1
    # The lead lives as long as its team.
    one_error_line(
        run("terminate", str(team), "Team Leader", *db), hint=f"`agent-router team delete {team}`"
    )
    one_error_line(run("stop", str(team), "Team Leader", *db), hint="only sub-agents can be")
    # A terminated agent takes nothing more.
    assert run("terminate", str(team), "UI Operator_1", *db).returncode == 0
    line = one_error_line(
        run("send", str(team), "UI Operator_1", "hi", *db), hint=f"`agent-router status {team}`"
    )
    assert "is terminated" in line
    # A question that is not open.
    one_error_line(run("answer", "999", "yes", *db), hint="only an open question takes an answer")
    status = json.loads(run("status", str(team), "--json", *db).stdout.splitlines()[0])
    (question,) = status["questions_to_answer"]
    assert run("answer", str(question), "the JWT one", *db).returncode == 0
    line = one_error_line(
        run("answer", str(question), "again", *db), hint="only an open question takes an answer"
    )
    assert f"question {question}" in line
    # A team id that is not a number: one line (a usage error: status 2), not Click's box.
    for command in (["ledger", "abc"], ["status", "abc"], ["send", "x1", "Team Leader", "hi"]):
        proc = run(*command, *db)
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.splitlines()
        assert line == (
            f"agent-router: error: a team id is a number, not {command[1]!r} "
            "(hint: `agent-router status` lists every team by its id)"
        )


def test_help_in_a_pipe_is_not_cut_to_80_columns() -> None:
    """Piped (no terminal, no COLUMNS), help is laid out wide enough that nothing is cut."""
    for command in (["demo"], ["run"], ["ledger"], ["web"], []):
        proc = run(*command, "--help", COLUMNS="")
        assert proc.returncode == 0, proc.stderr
        assert "…" not in proc.stdout, proc.stdout
    demo = run("demo", "--help", COLUMNS="").stdout
    assert "AGENT_ROUTER_DEMO_DATABASE_URL" in demo and "AGENT_ROUTER_DATABASE_URL" in demo


def test_model_calls_say_what_is_not_known(tmp_path: Path) -> None:
    """A model call whose server named no model, and one of a model the price table does not
    list, say so in the ledger's text; a priced one shows its cost."""
    from tests.integration.helpers import start_running

    url = f"sqlite:///{tmp_path / 'calls.db'}"
    prices = {"priced-model": {"input": 1.0, "output": 2.0}}
    router = Router(Settings(database_url=url, models=prices), publisher=RecordingPublisher())
    router.create_schema()
    team = router.create_team().id
    turn = start_running(router, team, "Team Leader")
    for model in (None, "unlisted-model", "priced-model"):
        turn.record_usage(model=model, prompt_tokens=1000, completion_tokens=500)
    router.close()
    proc = run("ledger", str(team), "--database-url", url)
    assert proc.returncode == 0, proc.stderr
    calls = [line.split("Team Leader", 1)[1].strip() for line in proc.stdout.splitlines()
             if "model call" in line]  # fmt: skip
    assert calls == [
        "model call (model not reported): 1000 prompt + 500 completion tokens, price unknown "
        "(not in AGENT_ROUTER_MODELS)",
        "model call (unlisted-model): 1000 prompt + 500 completion tokens, price unknown "
        "(not in AGENT_ROUTER_MODELS)",
        "model call (priced-model): 1000 prompt + 500 completion tokens, $0.002000",
    ]
    assert "(?)" not in proc.stdout


def test_a_demo_scenario_that_times_out_says_it_timed_out(redis_url: str) -> None:
    """No worker takes the demo's turns (its own queue, no embedded workers): a step runs out
    of time, and the demo says that, and how to give it more, not that a guarantee broke."""
    proc = run(
        "demo", "--broker-url", redis_url, "--no-embedded-workers", "--timeout", "1",
        AGENT_ROUTER_QUEUE=f"agent_router.test.demo_timeout.{os.getpid()}", timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert "a guarantee was broken" not in proc.stdout
    assert any(line.startswith("a scenario timed out") and "--timeout" in line for line in lines)
    failed = lines.index(next(line for line in lines if line.startswith("FAIL ")))
    assert "timed out after 1s waiting for" in lines[failed + 1]
