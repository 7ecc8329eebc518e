"""The chaos suite, CI profile: three `agent-router worker` processes on a private Redis and a
private PostgreSQL database, SIGKILLed every few seconds, Redis restarted once, the workers'
database backends terminated once; then nothing may be lost, duplicated or reordered, no turns
may overlap, no tool call may dangle, and every question must be closed.

The long profile (1,000+ messages, 100+ asks) is ``agent-router chaos --duration 600``."""

from __future__ import annotations

import pytest

from agent_router.chaos import CI_PROFILE, run_chaos

from ..conftest import PG_ADMIN_URL


@pytest.mark.timeout(240)
def test_nothing_is_lost_under_chaos(redis_url: str) -> None:
    lines: list[str] = []
    result = run_chaos(CI_PROFILE, admin_url=PG_ADMIN_URL, log=lines.append)
    print("\n".join([*lines, result.recovery_line(), result.summary()]))
    assert result.report.violations == []
    assert result.open_questions == 0
    assert result.ok
    assert result.kills >= 3
    # 6 agents x 50 messages, plus asks, answers and wake-ups.
    assert result.report.messages >= 6 * CI_PROFILE.sends_per_agent
    assert result.questions >= 40
    bound = CI_PROFILE.lease_seconds + CI_PROFILE.sweep_seconds + 5.0  # + restart and claim
    assert all(r.total <= bound for r in result.recoveries), result.recovery_line()
