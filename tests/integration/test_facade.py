"""The Router's doors for what its callers (the agent loop, the operator's tools, the worker)
used to reach through its store: the read views, a team's budgets, the sub-agent charge, a
seeded mailbox, a forked child's pool. Each on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from agent_router import BudgetExhaustedError, Router, UnknownAgentError, UnknownTeamError
from agent_router.domain import AgentState, BudgetName, MessageStatus, MessageType
from agent_router.store import Reads

from .helpers import start_running


def test_reads_are_the_read_views(router: Router) -> None:
    team = router.create_team()
    assert isinstance(router.reads, Reads)
    assert router.reads.team(team.id) == router.team(team.id)
    assert [a.display_name for a in router.reads.agents(team.id)] == ["Team Leader"]


def test_a_seeded_mailbox_holds_notices_that_wake_nobody(router: Router) -> None:
    team = router.create_team().id
    engineer = router.create_agent(team, role="Engineer")
    router.seed_mailbox(engineer.id, 3, content="queued message")
    seeded = [m for m in router.messages(team) if m.target_agent_id == engineer.id]
    assert [(m.type, m.status, m.wake) for m in seeded] == [
        (MessageType.NOTICE, MessageStatus.PENDING, False)
    ] * 3
    assert router.agent(team, "Engineer_1").state is AgentState.IDLE
    assert router.outbox(team) == []
    # The next turn drains them after the message that woke it.
    turn = start_running(router, team, "Engineer_1")
    assert [m.status for m in router.messages(team) if m.target_agent_id == engineer.id] == [
        MessageStatus.DELIVERED
    ] * 4
    assert turn.state() is AgentState.RUNNING


def test_a_seeded_mailbox_needs_an_agent(router: Router) -> None:
    with pytest.raises(UnknownAgentError):
        router.seed_mailbox(10**9, 1, content="queued message")


def test_budget_reads_a_teams_limits_and_use(router: Router) -> None:
    team = router.create_team(budget={BudgetName.MODEL_CALLS: 2}).id
    turn = start_running(router, team, "Team Leader")
    turn.charge_model_call()
    budget = router.budget(team)
    assert budget.limits[BudgetName.MODEL_CALLS] == 2
    assert budget.used[BudgetName.MODEL_CALLS] == 1
    assert budget.exhausted is None
    with pytest.raises(UnknownTeamError):
        router.budget(10**9)


def test_the_sub_agent_charge_refuses_past_the_limit(router: Router) -> None:
    team = router.create_team(budget={BudgetName.SUB_AGENTS_CREATED: 1}).id
    router.charge_sub_agent(team, "Engineer")
    router.create_agent(team, role="Engineer")
    with pytest.raises(BudgetExhaustedError):
        router.charge_sub_agent(team, "Engineer")
    assert [e.action.value for e in router.ledger(team)].count("budget_refused") == 1


def test_after_fork_the_router_opens_connections_of_its_own(router: Router) -> None:
    team = router.create_team().id
    router.after_fork()
    router.create_agent(team, role="Engineer")
    assert [a.display_name for a in router.agents(team)] == ["Team Leader", "Engineer_1"]
