"""The chaos suite, CI profile: three `agent-router worker` processes on a private Redis and a
private PostgreSQL server, SIGKILLed every few seconds, Redis restarted once while asks are
blocked, the workers' database backends terminated once, the PostgreSQL server restarted once
while asks are blocked; then nothing may be lost, duplicated or reordered, no turns may overlap,
no tool call may dangle, no turn may have failed, and every question must be closed.

The long profile (1,000+ messages, 100+ asks) is ``agent-router chaos --duration 600``. A
shorter run puts the workers behind a private PgBouncer in transaction pooling with 4 server
connections for their 12 slots (``agent-router chaos --pgbouncer-pool 4``)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from agent_router.ops.chaos import CI_PROFILE, run_chaos

from ..conftest import PG_ADMIN_URL


@pytest.mark.alone
@pytest.mark.timeout(290)
def test_nothing_is_lost_under_chaos(redis_url: str) -> None:
    lines: list[str] = []
    result = run_chaos(CI_PROFILE, admin_url=PG_ADMIN_URL, log=lines.append)
    questions = f"questions={result.questions} open_questions={result.open_questions}"
    print("\n".join([*lines, result.recovery_line(), questions, result.summary()]))
    assert result.report.violations == []
    assert result.open_questions == 0
    assert result.report.failed_turns == 0, result.report.failures
    assert result.ok
    # Each server fault struck, the restarts while at least one ask was blocked on them.
    assert set(result.faults) == {"redis restart", "postgres backends", "postgres restart"}
    assert result.faults["redis restart"] >= 1
    assert result.faults["postgres restart"] >= 1
    assert result.kills >= 3
    # The volume CI holds the chaos run to: at least 1,000 messages and 100 asks (6 agents'
    # sends, asks, answers).
    assert result.report.messages >= 1000
    assert result.questions >= 100
    # Recovery time, in two parts. Kill -> takeover is the router's: the lease runs out, then
    # the next pass of any worker's sweeper timer takes the turn over (lease + sweep period, plus
    # the pass's own run time). Takeover -> running is queueing for a free worker slot (and the
    # broker, around the Redis restart); only the total is bounded, by the same + 5 s as before.
    assert result.recoveries, result.recovery_line()
    assert result.late_takeovers == [], result.recovery_line()
    bound = CI_PROFILE.lease_seconds + CI_PROFILE.sweep_seconds + 5.0  # + restart and claim
    assert all(r.total <= bound for r in result.recoveries), result.recovery_line()


#: Behind PgBouncer, a minute of chaos at most: fewer messages and asks, the same faults and kills.
#: A run on a quiet machine ends once every agent sent its share: 45 sends each ended one after
#: two kills, so each agent sends 70 (a loaded machine ends the run at the minute instead).
PGBOUNCER_PROFILE = replace(
    CI_PROFILE, sends_per_agent=70, asks_per_agent=14, duration=60.0, settle_seconds=45.0
)
#: Server connections for the 3 workers' 12 slots, their sweepers and their beat.
PGBOUNCER_POOL = 4


@pytest.mark.alone
@pytest.mark.timeout(240)
def test_nothing_is_lost_under_chaos_behind_pgbouncer(redis_url: str) -> None:
    lines: list[str] = []
    result = run_chaos(
        PGBOUNCER_PROFILE, admin_url=PG_ADMIN_URL, pgbouncer_pool=PGBOUNCER_POOL, log=lines.append
    )
    questions = f"questions={result.questions} open_questions={result.open_questions}"
    print("\n".join([*lines, result.recovery_line(), questions, result.summary()]))
    assert any("through PgBouncer" in line for line in lines)
    assert result.report.violations == []
    assert result.open_questions == 0
    assert result.report.failed_turns == 0, result.report.failures
    assert result.ok
    assert set(result.faults) == {"redis restart", "postgres backends", "postgres restart"}
    # The workers' server connections behind PgBouncer carried their application_name.
    terminated = re.compile(r"terminated [1-9]\d* worker PostgreSQL backends")
    assert any(terminated.search(event) for event in result.events)
    assert result.kills >= 3
    # A run that ends on time stops each agent at what it has sent: at least a hundred messages
    # and ten asks went through PgBouncer.
    assert result.report.messages >= 100
    assert result.questions >= 10
    assert result.late_takeovers == [], result.recovery_line()
