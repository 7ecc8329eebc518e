"""A script's ``Router(Settings(...))`` with a broker configured publishes the turn a send
starts right after the commit, as the README's twenty lines say; ``publisher=None`` leaves it
in the outbox. The worker here runs no sweeper: a turn left unpublished never runs."""

from __future__ import annotations

from agent_router import AgentState, RouteOutcome, Router, Settings
from agent_router.ops.demo import wait_until
from agent_router.worker.runtime import Runtime

TIMEOUT = 60.0


def test_a_router_made_from_settings_publishes_what_it_commits(
    inproc_worker: Runtime, celery_settings: Settings
) -> None:
    script = Router(celery_settings)  # no publisher given: the settings' broker
    silent = Router(celery_settings, publisher=None)
    try:
        team = script.create_team().id
        script.create_agent(team, role="Full-Stack Engineer")
        script.create_agent(team, role="UI Operator")
        held = silent.send(team, to="UI Operator_1", content="Not yet.", sender="Team Leader")
        sent = script.send(team, to="Full-Stack Engineer_1", content="Build it.")
        assert sent.outcome is held.outcome is RouteOutcome.TRIGGERED_NEW_TURN
        wait_until(
            lambda: script.agent(team, "Full-Stack Engineer_1").state is AgentState.COMPLETED,
            "the published turn to run",
            timeout=TIMEOUT,
        )
        # This team's turn tasks (the database holds other tests' rows, wake rows among them).
        unpublished = {
            e.payload["agent"]
            for e in script.store.reads.unpublished()
            if e.payload.get("team_id") == team and "agent" in e.payload
        }
        assert "UI Operator_1" in unpublished
        assert "Full-Stack Engineer_1" not in unpublished
        assert script.agent(team, "UI Operator_1").state is AgentState.SCHEDULED
    finally:
        script.close()
        silent.close()
