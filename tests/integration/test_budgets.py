"""Team budgets on SQLite and PostgreSQL: counted when a turn starts and before each model call,
one warning, one ``budget_exhausted`` event and a clean stop, sub-agent limits, an operator's
raise, and usage summed per call, turn, agent and team with the price table's cost."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from agent_router import Router, Settings
from agent_router.agents.llm import ScriptedModel, directive
from agent_router.agents.loop import TurnOutcome, run_turn
from agent_router.agents.tools import default_registry
from agent_router.budgeting import WARNING_NOTICE, set_limits
from agent_router.domain import (
    AgentState,
    BudgetName,
    LedgerAction,
    MessageType,
    QuestionStatus,
    TurnStatus,
)
from agent_router.errors import BudgetExhaustedError, InvalidMessageError
from agent_router.ops.checks import check_team
from agent_router.outbox import RecordingPublisher
from agent_router.settings import ModelSpec

from .helpers import assistant, start_running, start_waiting, tool_call


def events(router: Router, team_id: int, action: LedgerAction) -> list[dict[str, Any]]:
    return [e.detail for e in router.ledger(team_id) if e.action is action]


def test_new_teams_get_the_default_budgets_and_overrides(router: Router) -> None:
    team = router.create_team(budget={BudgetName.MODEL_CALLS: 7, BudgetName.COST: None})
    budget = router.store.budget(team.id)
    assert budget.limits[BudgetName.MODEL_CALLS] == 7
    assert budget.limits[BudgetName.COST] is None  # unlimited
    assert budget.limits[BudgetName.TURNS] == router.settings.budget_turns
    assert budget.exhausted is None and not budget.warned
    with pytest.raises(InvalidMessageError):
        router.store.set_limits(team.id, {BudgetName.TURNS: -1}, by="t")
    with pytest.raises(InvalidMessageError):
        router.store.set_limits(team.id, {BudgetName.TURNS: 1.5}, by="t")
    assert router.store.budget(team.id).limits[BudgetName.TURNS] == router.settings.budget_turns


def test_model_calls_stop_at_the_limit_with_one_warning_and_one_event(router: Router) -> None:
    team = router.create_team(budget={BudgetName.MODEL_CALLS: 5})
    sub = router.create_agent(team.id, role="Engineer")
    turn = start_running(router, team.id, sub.display_name)

    for _ in range(5):
        turn.charge_model_call()
    with pytest.raises(BudgetExhaustedError) as raised:
        turn.charge_model_call()
    assert raised.value.budget == "model_calls"
    with pytest.raises(BudgetExhaustedError):  # and stays spent
        turn.charge_model_call()

    budget = router.store.budget(team.id)
    assert budget.used[BudgetName.MODEL_CALLS] == 5 and budget.exhausted is BudgetName.MODEL_CALLS
    (spent,) = events(router, team.id, LedgerAction.BUDGET_EXHAUSTED)
    assert spent["budget"] == "model_calls" and spent["limit"] == 5 and spent["used"] == 5
    (warning,) = events(router, team.id, LedgerAction.BUDGET_WARNING)
    assert warning["budget"] == "model_calls" and warning["used"] == 4  # 80 % of 5
    # Every agent got the one wrap-up notice; it wakes nobody.
    notices = [m for m in router.messages(team.id) if m.type is MessageType.NOTICE]
    assert sorted(m.target_name for m in notices) == sorted(["Team Leader", sub.display_name])
    assert all(not m.wake and "Wrap up" in m.content for m in notices)
    assert WARNING_NOTICE.split("{")[0] in notices[0].content


def test_a_turn_is_refused_when_the_team_is_spent_and_goes_on_after_a_raise(
    router: Router,
) -> None:
    team = router.create_team(budget={BudgetName.TURNS: 1})
    lead = team.lead.display_name
    first = start_running(router, team.id, lead)
    first.append_assistant(assistant("done"))
    first.end()

    router.send(team.id, to=lead, content="more", sender="user")
    assert router.claim_turn(team.id, lead) is None  # refused: the turn budget is spent
    assert router.agent(team.id, lead).state is AgentState.IDLE
    assert router.agent(team.id, lead).mailbox_depth == 1  # the message is kept
    (spent,) = events(router, team.id, LedgerAction.BUDGET_EXHAUSTED)
    assert spent["budget"] == "turns"
    stopped = [t for t in router.store.reads.turns(team.lead.id) if t.status is TurnStatus.STOPPED]
    assert len(stopped) == 1

    budget = set_limits(router, team.id, {BudgetName.TURNS: 3}, by="ops")
    assert budget.exhausted is None
    (changed,) = events(router, team.id, LedgerAction.BUDGET_CHANGED)
    assert changed == {"by": "ops", "limits": {"turns": 3}, "was_exhausted": "turns",
                       "exhausted": None}  # fmt: skip
    # The lead is woken to go on, with the kept message and the operator's notice.
    turn = router.claim_turn(team.id, lead)
    assert turn is not None
    drained = turn.drain()
    assert drained[0].content == "more"
    assert "raised by ops" in drained[-1].content
    assert check_team(router, team.id).ok


def test_a_spent_budget_stops_the_team_cleanly(router: Router) -> None:
    """A blocked asker and a running agent: the question is cancelled, the open tool calls get
    results, every agent rests, the mailboxes are kept."""
    team = router.create_team(budget={BudgetName.MODEL_CALLS: 1})
    a = router.create_agent(team.id, role="Engineer").display_name
    b = router.create_agent(team.id, role="Engineer").display_name
    asker = start_waiting(router, team.id, a, b)
    (qid,) = next(s for s in router.store.reads.agent_statuses(team.id)
                  if s.agent.display_name == a).open_questions  # fmt: skip
    worker = start_running(router, team.id, b)
    worker.charge_model_call()
    worker.append_assistant(assistant(None, tool_call("w1"), tool_call("w2")))
    worker.append_tool_result("w1", "ok")

    with pytest.raises(BudgetExhaustedError):
        worker.charge_model_call()  # the check that spends it stops the team

    assert router.question(qid).status is QuestionStatus.CANCELLED
    # Both running turns stop at their next boundary, as the loop does.
    assert router.agent(team.id, a).stop_requested and router.agent(team.id, b).stop_requested
    asker.finish_stop()
    worker.finish_stop()
    assert router.transcript(team.id, a)[-1]["content"].startswith("cancelled")
    transcript_b = router.transcript(team.id, b)
    assert transcript_b[-1]["tool_call_id"] == "w2"
    assert transcript_b[-1]["content"].startswith("cancelled")
    statuses = router.store.reads.agent_statuses(team.id)
    assert all(not s.open_questions and not s.questions_to_answer for s in statuses)
    assert {s.agent.display_name: s.agent.state for s in statuses} == {
        "Team Leader": AgentState.IDLE, a: AgentState.IDLE, b: AgentState.IDLE}  # fmt: skip
    assert [e["budget"] for e in events(router, team.id, LedgerAction.BUDGET_EXHAUSTED)] == [
        "model_calls"
    ]
    # The stops say why: the budget, not the lead.
    assert [e["reason"] for e in events(router, team.id, LedgerAction.STOPPED)] == [
        "the team's model_calls budget is spent"
    ] * 2
    assert "the team's model_calls budget is spent" in router.transcript(team.id, a)[-1]["content"]
    assert check_team(router, team.id).ok


def test_a_stop_honoured_at_the_end_of_a_turn_says_the_reason_it_was_asked_with(
    router: Router,
) -> None:
    team = router.create_team()
    name = router.create_agent(team.id, role="Engineer").display_name
    turn = start_running(router, team.id, name)
    router.stop(team.id, name, reason="the lead has what it needs")
    turn.append_assistant(assistant("Done."))
    turn.end()
    (stopped,) = events(router, team.id, LedgerAction.STOPPED)
    assert stopped["reason"] == "the lead has what it needs"


def test_sub_agent_budgets_refuse_create_sub_agent(router: Router) -> None:
    team = router.create_team(
        budget={BudgetName.SUB_AGENTS_ACTIVE: 1, BudgetName.SUB_AGENTS_CREATED: 2}
    )
    router.store.charge_sub_agent(team.id, "Engineer")
    first = router.create_agent(team.id, role="Engineer")
    with pytest.raises(BudgetExhaustedError, match="active at once") as active:
        router.store.charge_sub_agent(team.id, "Engineer")
    assert active.value.budget == "sub_agents_active"
    router.terminate(team.id, first.display_name, reason="done")
    router.store.charge_sub_agent(team.id, "Engineer")
    router.create_agent(team.id, role="Engineer")
    with pytest.raises(BudgetExhaustedError, match="created") as created:
        router.store.charge_sub_agent(team.id, "Engineer")
    assert created.value.budget == "sub_agents_created"
    refused = events(router, team.id, LedgerAction.BUDGET_REFUSED)
    assert [r["budget"] for r in refused] == ["sub_agents_active", "sub_agents_created"]
    # A refused creation stops nothing.
    assert router.store.budget(team.id).exhausted is None


def test_usage_is_summed_per_turn_agent_and_team_with_the_price_table(
    settings: Settings,
) -> None:
    priced = settings.model_copy(
        update={"models": {"m": ModelSpec(input=2.5, cached_input=1.25, output=10.0)}}
    )
    router = Router(priced, publisher=RecordingPublisher())
    try:
        team = router.create_team(budget={BudgetName.TOKENS: 10_000})
        sub = router.create_agent(team.id, role="Engineer")
        calls = {team.lead.display_name: [(1000, 100, 800), (1500, 50, 0)],
                 sub.display_name: [(300, 30, 0), (400, 40, 256), (500, 50, 0)]}  # fmt: skip
        turns = {}
        for name, usages in calls.items():
            turn = turns[name] = start_running(router, team.id, name)
            for prompt, completion, cached in usages:
                turn.charge_model_call()
                turn.record_usage(model="m", prompt_tokens=prompt, completion_tokens=completion,
                                  cached_tokens=cached)  # fmt: skip
        unpriced = start_running(
            router, team.id, router.create_agent(team.id, role="X").display_name
        )
        unpriced.record_usage(model="other", prompt_tokens=10, completion_tokens=1, estimated=True)

        def cost(p: int, c: int, cached: int) -> float:
            return ((p - cached) * 2.5 + cached * 1.25 + c * 10.0) / 1e6

        per_agent = router.store.reads.usage_by_agent(team.id)
        # A status page reads the same figures by a range of agent ids, in one query.
        ids = [team.lead.id, unpriced.agent_id]
        assert router.store.reads.usage_of_agents(min(ids), max(ids)) == per_agent
        assert router.store.reads.usage_of_agents(team.lead.id, team.lead.id) == {
            team.lead.id: per_agent[team.lead.id]
        }
        for name, usages in calls.items():
            got = per_agent[router.agent(team.id, name).id]
            assert got.model_calls == len(usages)
            assert got.prompt_tokens == sum(u[0] for u in usages)
            assert got.completion_tokens == sum(u[1] for u in usages)
            assert got.cached_tokens == sum(u[2] for u in usages)
            assert got.cost_usd == pytest.approx(sum(cost(*u) for u in usages), abs=1e-9)
            (per_turn,) = router.store.reads.usage_by_turn(router.agent(team.id, name).id).values()
            assert per_turn == got
        team_usage = router.store.budget(team.id).usage
        everything = [u for us in calls.values() for u in us] + [(10, 1, 0)]
        assert team_usage.prompt_tokens == sum(u[0] for u in everything)
        assert team_usage.completion_tokens == sum(u[1] for u in everything)
        assert team_usage.cost_usd == pytest.approx(sum(cost(*u) for u in everything[:-1]))
        model_calls = events(router, team.id, LedgerAction.MODEL_CALL)
        assert len(model_calls) == 6 and model_calls[-1]["estimated"] is True
        assert model_calls[-1]["cost_usd"] == 0.0  # a model missing from the table costs 0
        # ... and its event says it is unpriced (the ledger's text: "price unknown").
        assert model_calls[-1]["unpriced"] is True
        assert not any("unpriced" in call for call in model_calls[:-1])
        # 3 981 tokens of 10 000: no warning yet; the tokens budget is checked at the next call.
        assert not router.store.budget(team.id).warned
        turns[sub.display_name].record_usage(model="m", prompt_tokens=7000, completion_tokens=0)
        with pytest.raises(BudgetExhaustedError, match="tokens"):
            turns[sub.display_name].charge_model_call()
    finally:
        router.close()


def test_concurrent_checks_never_pass_the_limit(router: Router) -> None:
    """Eight threads race for 20 model calls: exactly 20 are granted."""
    team = router.create_team(budget={BudgetName.MODEL_CALLS: 20})
    turn = start_running(router, team.id, team.lead.display_name)
    granted: list[int] = []
    barrier = threading.Barrier(8)

    def take() -> None:
        barrier.wait()
        for _ in range(10):
            try:
                turn.charge_model_call()
            except BudgetExhaustedError:
                return
            granted.append(1)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(granted) == 20
    assert router.store.budget(team.id).used[BudgetName.MODEL_CALLS] == 20
    assert len(events(router, team.id, LedgerAction.BUDGET_EXHAUSTED)) == 1


def test_the_lead_reads_why_create_sub_agent_was_refused(router: Router) -> None:
    """Through the built-in loop and tools: the third sub-agent is refused in its tool result."""
    team = router.create_team(budget={BudgetName.SUB_AGENTS_ACTIVE: 2})
    task = "\n".join(
        directive("create_sub_agent", role="Full-Stack Engineer", task=f"part {n}")
        for n in range(3)
    )
    router.send(team.id, to="Team Leader", content=task, type=MessageType.TASK)
    turn = router.claim_turn(team.id, "Team Leader")
    assert turn is not None

    outcome = run_turn(router, turn, models=ScriptedModel.for_agent, tools=default_registry())

    assert outcome is TurnOutcome.ENDED
    results = [json.loads(e["content"]) for e in router.transcript(team.id, "Team Leader")
               if e["role"] == "tool"]  # fmt: skip
    assert [r["ok"] for r in results] == [True, True, False], results
    assert results[2]["reason"] == "budget_exhausted"
    assert "2 sub-agents active at once" in results[2]["error"]
    assert len(router.agents(team.id)) == 3  # the lead and two sub-agents
    assert router.store.budget(team.id).exhausted is None  # the team goes on
