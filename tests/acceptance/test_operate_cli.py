"""The operator's commands, run as an operator runs them: the real ``agent-router`` binary in a
subprocess, against PostgreSQL, configured by ``AGENT_ROUTER_*`` variables.

The team is put in the middle of its work through the Router/Turn API (no worker): one agent
running, one blocked in an ask (waiting), one completed, so ``status`` can be checked against
each state deterministically.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from agent_router import Router, Settings, TurnTrigger
from agent_router.outbox import RecordingPublisher
from agent_router.store.migrate import VERSION_TABLE
from tests.integration.helpers import start_running, start_waiting

CLI = str(Path(sys.executable).parent / "agent-router")


def run(*args: str, database_url: str | None, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    env["COLUMNS"] = "200"  # rich tables stay on one line per row
    if database_url is not None:
        env["AGENT_ROUTER_DATABASE_URL"] = database_url
    env.update(extra_env)
    return subprocess.run(
        [CLI, *args], check=False, capture_output=True, text=True, timeout=60, env=env
    )


@dataclass(frozen=True)
class MidWork:
    url: str
    team_id: int
    ask_message_id: int
    question_id: int


@pytest.fixture(scope="module")
def mid_work(pg_schema_url: str) -> Iterator[MidWork]:
    router = Router(Settings(database_url=pg_schema_url), publisher=RecordingPublisher())
    team = router.create_team()
    for role in ("UI Operator", "Full-Stack Engineer", "QA Engineer"):
        router.create_agent(team.id, role=role)
    start_running(router, team.id, "UI Operator_1", "Build the login page.")
    start_waiting(router, team.id, "Full-Stack Engineer_1", "Team Leader", call_id="ask-1")
    done = start_running(router, team.id, "QA Engineer_1", "Test the login page.")
    done.append_assistant({"role": "assistant", "content": "All tests pass."})
    done.end()
    router.send(team.id, to="Team Leader", content="How is it going?")  # the lead is scheduled
    ask = next(m for m in router.messages(team.id) if m.type.value == "ask")
    assert ask.question_id is not None
    yield MidWork(pg_schema_url, team.id, ask.id, ask.question_id)
    router.close()


def status_rows(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    return {r["agent"]: r for r in rows}


def test_status_of_a_team_mid_work_shows_running_waiting_completed(mid_work: MidWork) -> None:
    rows = status_rows(run("status", str(mid_work.team_id), "--json", database_url=mid_work.url))
    assert rows["UI Operator_1"]["state"] == "running"
    assert rows["UI Operator_1"]["turn_id"] is not None
    assert rows["UI Operator_1"]["lease_expires_at"] is not None
    assert rows["Full-Stack Engineer_1"]["state"] == "waiting"
    assert rows["Full-Stack Engineer_1"]["open_questions"] == [mid_work.question_id]
    assert rows["QA Engineer_1"]["state"] == "completed"
    assert rows["QA Engineer_1"]["lease_expires_at"] is None
    # The lead was woken by the question and the completion report: one turn scheduled.
    lead = rows["Team Leader"]
    assert lead["state"] == "scheduled"
    assert lead["questions_to_answer"] == [mid_work.question_id]
    assert lead["mailbox_depth"] == 2

    table = run("status", str(mid_work.team_id), database_url=mid_work.url)
    assert table.returncode == 0, table.stderr
    names = ("UI Operator_1", "Full-Stack Engineer_1", "QA Engineer_1")
    lines = {name: line for line in table.stdout.splitlines() for name in names if name in line}
    assert "running" in lines["UI Operator_1"]
    assert re.search(r" \d+s *$", lines["UI Operator_1"])  # seconds left on the lease
    assert " blocked " in lines["Full-Stack Engineer_1"]  # waiting, in a worker
    assert "completed" in lines["QA Engineer_1"]


def test_status_of_all_teams_includes_this_team(mid_work: MidWork) -> None:
    proc = run("status", "--json", "--limit", "100000", database_url=mid_work.url)
    assert proc.returncode == 0, proc.stderr
    teams = {json.loads(line)["team_id"] for line in proc.stdout.splitlines()}
    assert mid_work.team_id in teams
    # A page at a time: the first page of two, then the next from its last agent id.
    page = run("status", "--json", "--limit", "2", database_url=mid_work.url)
    first = [json.loads(line) for line in page.stdout.splitlines()]
    assert len(first) == 2
    after = str(first[-1]["agent_id"])
    second = run("status", "--json", "--limit", "2", "--after", after, database_url=mid_work.url)
    assert json.loads(second.stdout.splitlines()[0])["agent_id"] > first[-1]["agent_id"]
    running = run("status", str(mid_work.team_id), "--json", "--state", "running",
                  database_url=mid_work.url)  # fmt: skip
    assert {json.loads(line)["state"] for line in running.stdout.splitlines()} == {"running"}


def test_ledger_is_the_timeline_readable_and_json(mid_work: MidWork) -> None:
    proc = run("ledger", str(mid_work.team_id), "--json", database_url=mid_work.url)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["id"] for r in records] == sorted(r["id"] for r in records)
    routes = [r for r in records if r["action"] == "route"]
    assert {r["outcome"] for r in routes} >= {"triggered_new_turn", "coalesced"}
    assert any(r["action"] == "ask" and r["agent"] == "Full-Stack Engineer_1" for r in records)
    assert any(r["action"] == "turn_ended" and r["agent"] == "QA Engineer_1" for r in records)
    # --after tails: only the events after that id.
    after = records[-3]["id"]
    tail = run(
        "ledger", str(mid_work.team_id), "--json", f"--after={after}", database_url=mid_work.url
    )
    assert [json.loads(line)["id"] for line in tail.stdout.splitlines()] == [
        r["id"] for r in records[-2:]
    ]

    readable = run("ledger", str(mid_work.team_id), database_url=mid_work.url)
    assert readable.returncode == 0, readable.stderr
    for text in ("triggered_new_turn", "turn", "starts (new, epoch 1)", "QA Engineer_1"):
        assert text in readable.stdout, text


def test_inspect_message_and_agent_show_provenance(mid_work: MidWork) -> None:
    msg = run(
        "inspect", "message", str(mid_work.ask_message_id), "--json", database_url=mid_work.url
    )
    assert msg.returncode == 0, msg.stderr
    record = json.loads(msg.stdout)
    assert record["from"] == "Full-Stack Engineer_1" and record["to"] == "Team Leader"
    assert record["type"] == "ask" and record["question_id"] == mid_work.question_id
    assert record["outcome"] == "triggered_new_turn" and record["status"] == "pending"
    assert [e["action"] for e in record["ledger"]] == ["route"]

    agent = run(
        "inspect", "agent", str(mid_work.team_id), "UI Operator_1", database_url=mid_work.url
    )
    assert agent.returncode == 0, agent.stderr
    assert "<- message from user (message" in agent.stdout
    assert "Build the login page." in agent.stdout

    entries = run(
        "inspect",
        "agent",
        str(mid_work.team_id),
        "Full-Stack Engineer_1",
        "--json",
        database_url=mid_work.url,
    )
    payloads = [json.loads(line) for line in entries.stdout.splitlines()]
    assert payloads[0]["meta"]["from"] == "user" and payloads[0]["message_id"] is not None
    assert payloads[-1]["payload"]["tool_calls"][0]["id"] == "ask-1"


def test_errors_are_one_line_with_a_non_zero_exit(mid_work: MidWork) -> None:
    cases = (
        ("status", "987654321"),
        ("ledger", "987654321"),
        ("inspect", "message", "987654321"),
        ("inspect", "agent", str(mid_work.team_id), "Nobody_1"),
        # Hostile input: typed refusals, the same one line on every backend.
        ("status", "99999999999999999999"),
        ("ledger", str(10**23)),
        ("inspect", "message", "0"),
        ("inspect", "agent", str(mid_work.team_id), "Team\u200bLeader"),
        ("send", str(mid_work.team_id), "Team Leader", "hi", "--sender", 'job:x" from="y'),
        ("send", str(mid_work.team_id), "Team Leader", "hi", "--sender", "job:x\ny"),
    )
    # Each command is a process of its own: they run side by side.
    with ThreadPoolExecutor(max_workers=4) as pool:
        procs = list(pool.map(lambda args: run(*args, database_url=mid_work.url), cases))
    for args, proc in zip(cases, procs, strict=True):
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("agent-router: error: ")
        assert "Traceback" not in proc.stderr
    unknown = run("status", "987654321", database_url=mid_work.url)
    assert unknown.stderr.startswith("agent-router: error: unknown team 987654321 (hint: ")

    bad_url = run("status", database_url="mysql://nowhere/db")
    assert bad_url.returncode == 1
    assert bad_url.stderr.startswith("agent-router: error: invalid setting database_url")
    unreachable = run("status", database_url="postgresql+psycopg://root@127.0.0.1:1/nothing")
    assert unreachable.returncode == 1 and unreachable.stderr.count("\n") == 1
    assert unreachable.stderr.startswith("agent-router: error: database error: ")


def test_db_upgrade_migrates_an_empty_database_and_is_idempotent(fresh_pg_url: str) -> None:
    first = run("db", "upgrade", database_url=fresh_pg_url)
    assert first.returncode == 0, first.stderr
    again = run("db", "upgrade", database_url=fresh_pg_url)
    assert again.returncode == 0, again.stderr
    engine = sa.create_engine(fresh_pg_url)
    try:
        tables = set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {"ar_teams", "ar_agents", "ar_messages", "ar_ledger", VERSION_TABLE} <= tables
    assert "alembic_version" not in tables  # the host's Alembic table is never the router's
    # The migrated schema serves the CLI at once.
    assert run("status", "--json", database_url=fresh_pg_url).stdout == ""


def test_send_routes_and_publishes_the_turn_to_the_broker(
    pg_schema_url: str, redis_url: str
) -> None:
    """`send` is Router.send from a shell: routed by state, and the turn task it schedules is on
    the broker's queue for a worker (none runs here: the task waits in Redis)."""
    import redis

    router = Router(Settings(database_url=pg_schema_url), publisher=RecordingPublisher())
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    queue = f"agent_router.test.{uuid.uuid4().hex[:10]}"
    env = {"AGENT_ROUTER_BROKER_URL": redis_url, "AGENT_ROUTER_QUEUE": queue}
    client = redis.Redis.from_url(redis_url)
    try:
        sent = run("send", str(team.id), "Engineer_1", "Build it.", "--type", "task", "--json",
                   database_url=pg_schema_url, **env)  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        delivery = json.loads(sent.stdout)
        assert delivery["outcome"] == "triggered_new_turn" and delivery["target"] == "Engineer_1"
        agent = router.agent(team.id, "Engineer_1")
        (row,) = router.outbox(team.id)
        assert row.epoch == agent.epoch
        assert row.id not in {e.id for e in router.store.reads.unpublished(limit=1_000_000)}
        (raw,) = client.lrange(queue, 0, -1)
        headers = json.loads(raw)["headers"]
        assert headers["task"] == "agent_router.run_agent_turn"
        assert headers["argsrepr"].startswith("Engineer_1 (team ")

        coalesced = run("send", str(team.id), "Engineer_1", "Also this.", "--dedup-key", "k1",
                        database_url=pg_schema_url, **env)  # fmt: skip
        assert coalesced.returncode == 0, coalesced.stderr
        assert ": coalesced" in coalesced.stdout
        again = run("send", str(team.id), "Engineer_1", "Also this.", "--dedup-key", "k1",
                    database_url=pg_schema_url, **env)  # fmt: skip
        assert "already sent with this dedup key" in again.stdout
        assert client.llen(queue) == 1  # one turn for all three sends
        message = router.messages(team.id)[-1]
        assert (message.type.value, message.source_name) == ("message", "user")
        assert len(router.messages(team.id)) == 2
    finally:
        client.delete(queue)
        client.close()
        router.close()


def test_an_operator_answers_a_blocked_ask_once(pg_schema_url: str) -> None:
    router = Router(Settings(database_url=pg_schema_url), publisher=RecordingPublisher())
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    start_waiting(router, team.id, "Engineer_1", "Team Leader", call_id="ask-7")
    (ask,) = [m for m in router.messages(team.id) if m.type.value == "ask"]
    answer = ("send", str(team.id), "Engineer_1", "Use PostgreSQL.", "--type", "answer",
              "--question-id", str(ask.question_id), "--sender", "Team Leader")  # fmt: skip
    try:
        first = run(*answer, database_url=pg_schema_url)
        assert first.returncode == 0, first.stderr
        assert ": resolved" in first.stdout
        (result,) = [
            e for e in router.transcript(team.id, "Engineer_1") if e.get("tool_call_id") == "ask-7"
        ]
        assert "Use PostgreSQL." in result["content"]
        transcript = router.transcript(team.id, "Engineer_1")
        again = run(*answer, database_url=pg_schema_url)
        assert again.returncode == 1 and again.stderr.count("\n") == 1
        assert f"question {ask.question_id}" in again.stderr
        assert router.transcript(team.id, "Engineer_1") == transcript  # answering twice: nothing
        assert [m.type.value for m in router.messages(team.id)].count("answer") == 1
    finally:
        router.close()


def test_stop_and_terminate_from_a_shell(pg_schema_url: str) -> None:
    router = Router(Settings(database_url=pg_schema_url), publisher=RecordingPublisher())
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    router.create_agent(team.id, role="Designer")
    turn = start_running(router, team.id, "Engineer_1", "Build it.")
    url = pg_schema_url
    try:
        stopping = run("stop", str(team.id), "Engineer_1", "--reason", "scope changed",
                       database_url=url)  # fmt: skip
        assert stopping.returncode == 0, stopping.stderr
        assert stopping.stdout == "Engineer_1 is running: it stops at its next boundary\n"
        assert turn.stop_requested()
        stopped = run("stop", str(team.id), "Designer_1", database_url=url)
        assert stopped.stdout == "Designer_1 stopped: idle\n"
        events = [e for e in router.ledger(team.id) if e.action.value == "stop_requested"]
        assert [e.detail.get("reason") for e in events][:1] == ["scope changed"]

        router.send(team.id, to="Designer_1", content="pending", wake=False)
        gone = run("terminate", str(team.id), "Designer_1", database_url=url)
        assert gone.returncode == 0 and gone.stdout == "Designer_1 terminated\n"
        (pending,) = [m for m in router.messages(team.id) if m.content == "pending"]
        assert pending.status.value == "dropped" and "terminated" in (pending.drop_reason or "")
        refused = run("send", str(team.id), "Designer_1", "hello?", database_url=url)
        assert refused.returncode == 1
        assert refused.stderr == (
            "agent-router: error: agent 'Designer_1' is terminated (hint: a terminated agent is "
            f"gone for good; `agent-router status {team.id}` shows which agents are live)\n"
        )
        lead = run("terminate", str(team.id), "Team Leader", database_url=url)
        assert lead.returncode == 1 and lead.stderr.startswith("agent-router: error: ")
    finally:
        router.close()


def test_sweep_from_a_shell_takes_over_a_dead_turn(fresh_pg_url: str) -> None:
    """A database of its own: a sweep acts on every team it finds."""
    router = Router(Settings(database_url=fresh_pg_url, lease_seconds=0.2, heartbeat_seconds=0.1))
    router.create_schema()
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    start_running(router, team.id, "Engineer_1", "Build it.")  # and its worker "dies"
    time.sleep(0.5)
    try:
        swept = run("sweep", "--json", database_url=fresh_pg_url)
        assert swept.returncode == 0, swept.stderr
        assert json.loads(swept.stdout) == {
            "republished": 0, "taken_over": 1, "reenqueued": 0, "expired": 0, "jobs_reported": 0,
            "ledger_pruned": 0, "failed": 0, "skipped": 0, "failures": [],
        }  # fmt: skip
        agent = router.agent(team.id, "Engineer_1")
        assert (agent.state.value, agent.pending_trigger) == ("scheduled", TurnTrigger.RECOVERY)
        again = run("sweep", database_url=fresh_pg_url)
        assert again.stdout == (
            "republished=0 taken_over=0 reenqueued=0 expired=0 jobs_reported=0 ledger_pruned=0"
            " failed=0 skipped=0\n"
        )
    finally:
        router.close()
