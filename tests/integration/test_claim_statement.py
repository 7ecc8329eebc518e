"""On PostgreSQL a turn is claimed by one statement. It must write exactly what the general way
writes: the same turn, agent state, ledger events and budget count, for every state, epoch and
trigger; and every claim it does not take (not scheduled, another epoch, an unknown agent)
must come out of the general way unchanged. Each case is claimed twice, in two teams built
alike: once as it is, once with the one statement switched off."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa

from agent_router import Router
from agent_router.domain import BudgetName, LedgerAction
from agent_router.errors import HostOwnedTurnError
from agent_router.store import claim_statement
from agent_router.store.models import BudgetRow

from .helpers import assistant, start_running, statements_in_autocommit, tool_call

#: How ``Engineer_1`` is left before the claim.
SETUPS = ["scheduled", "continuation", "idle", "running", "terminated"]

#: Scheduled, with the team's budgets as each says: its limits, and the lead's turns before the
#: claim. The claim then counts the turn and nothing more, crosses the warning threshold, finds
#: a budget spent, or finds no budget row (a team made before budgets existed).
BUDGETS: dict[str, tuple[dict[BudgetName, float], int]] = {
    "turns_spent": ({BudgetName.TURNS: 1.0}, 1),
    "turns_warned_now": ({BudgetName.TURNS: 5.0}, 3),
    "turns_warned_before": ({BudgetName.TURNS: 5.0}, 4),
    "all_far": (
        {
            BudgetName.TURNS: 100.0,
            BudgetName.MODEL_CALLS: 100.0,
            BudgetName.TOKENS: 1e6,
            BudgetName.COST: 5.0,
            BudgetName.WALL_SECONDS: 3600.0,
        },
        1,
    ),
    "wall_spent": ({BudgetName.WALL_SECONDS: 0.0}, 0),
    "no_budget_row": ({}, 0),
}


def _team(router: Router, setup: str) -> tuple[int, int]:
    """A team whose ``Engineer_1`` is as ``setup`` says; its id and the agent's id."""
    limits, lead_turns = BUDGETS.get(setup, ({}, 0))
    team = router.create_team(budget=limits or None).id
    agent = router.create_agent(team, role="Engineer").id
    for _ in range(lead_turns):
        router.send(team, to="Team Leader", content="go", sender="user")
        lead = router.claim_turn(team, "Team Leader")
        if lead is not None:
            lead.end()
    if setup == "no_budget_row":
        with router.store.engine.begin() as conn:
            conn.execute(sa.delete(BudgetRow).where(BudgetRow.team_id == team))
    if setup == "scheduled" or setup in BUDGETS:
        router.send(team, to="Engineer_1", content="go", sender="user")
    elif setup == "continuation":
        # A suspended ask answered: its continuation turn is scheduled.
        turn = start_running(router, team, "Engineer_1")
        turn.append_assistant(assistant(None, tool_call("ask-1", "ask_master")))
        question = turn.ask("Team Leader", "?", tool_call_id="ask-1")
        turn.end()
        router.answer(question.id, "yes")
    elif setup == "running":
        start_running(router, team, "Engineer_1")
    elif setup == "terminated":
        router.terminate(team, "Engineer_1", reason="gone")
    return team, agent


def _claimed(router: Router, team: int, agent: int, epoch: int | None) -> dict[str, Any]:
    ledger_before = len(router.ledger(team))
    turn = router.claim(agent, epoch)
    returned = (
        None
        if turn is None
        else (
            turn.team_id,
            turn.display_name,
            turn.record.epoch,
            turn.record.trigger,
            turn.record.status,
            turn.record.ended_at,
        )
    )
    a = router.agent(team, "Engineer_1")
    budget = router.store.budget(team)
    return {
        "returned": returned is not None and (returned[0] == team, *returned[1:]),
        "agent": (a.state, a.epoch, a.pending_trigger, a.suspended),
        "turns": [
            (t.epoch, t.trigger, t.status, t.ended_at is None)
            for t in router.store.reads.turns(agent)
        ],
        "ledger": [
            (e.action, e.agent_name, e.epoch, e.turn_id is not None, _timeless(e.detail))
            for e in router.ledger(team)[ledger_before:]
        ],
        "budget": (budget.used[BudgetName.TURNS], budget.warned, budget.exhausted),
    }


def _timeless(detail: dict[str, Any]) -> dict[str, Any]:
    """A ledger event's detail without the seconds a wall-time budget used (the clock's)."""
    if detail.get("budget") == BudgetName.WALL_SECONDS.value:
        return {k: v for k, v in detail.items() if k != "used"}
    return detail


@pytest.mark.parametrize("setup", SETUPS + list(BUDGETS))
def test_the_one_statement_claims_as_the_general_way_claims(
    pg_router: Router, monkeypatch: pytest.MonkeyPatch, setup: str
) -> None:
    for epoch in (None, "current", "next"):
        written = []
        for general in (False, True):
            team, agent = _team(pg_router, setup)
            current = pg_router.agent(team, "Engineer_1").epoch
            asked = {None: None, "current": current, "next": current + 1}[epoch]
            with monkeypatch.context() as patch:
                if general:
                    patch.setattr(claim_statement, "eligible", lambda tx: False)
                written.append(_claimed(pg_router, team, agent, asked))
        fast, general_way = written
        assert fast == general_way, (setup, epoch)
        claimed = setup in ("scheduled", "continuation", *BUDGETS) and epoch != "next"
        spent = setup in ("turns_spent", "wall_spent")
        assert bool(fast["returned"]) is (claimed and not spent)
        assert (LedgerAction.TURN_CLAIMED in [e[0] for e in fast["ledger"]]) is claimed


@pytest.mark.parametrize(
    ("setup", "quiet"),
    [
        ("scheduled", True),
        ("all_far", True),
        ("turns_warned_before", True),
        ("turns_warned_now", False),
        ("no_budget_row", False),
    ],
)
def test_a_claim_that_only_counts_the_turn_is_one_statement(
    pg_router: Router, setup: str, quiet: bool
) -> None:
    """Counting the turn on the budget row is part of the statement, which is its own
    transaction (autocommit: no BEGIN, no COMMIT). A claim whose budget check does more (a
    warning due, no budget row yet) is not taken by it: it wrote nothing, and the general way
    claims in a transaction, the budget row read locked (made first when missing) and written."""
    team, agent = _team(pg_router, setup)
    with statements_in_autocommit(pg_router) as seen:
        assert pg_router.claim(agent) is not None
    (claim, autocommit), *general = seen
    assert claim.lstrip().startswith('WITH "old" AS MATERIALIZED')
    assert "UPDATE ar_budgets" in claim
    assert autocommit
    if quiet:
        assert general == []
    else:
        # In a transaction (a warning due is then sent to the lead, a send of its own).
        for written in ("INSERT INTO ar_turns", "UPDATE ar_budgets"):
            assert any(s.lstrip().startswith(written) and not a for s, a in general), written
    lead_turns = BUDGETS.get(setup, ({}, 0))[1]
    assert pg_router.store.budget(team).used[BudgetName.TURNS] == lead_turns + 1
    assert [t.status.value for t in pg_router.store.reads.turns(agent)] == ["running"]


def test_racing_claims_of_one_turn_claim_it_once(pg_router: Router) -> None:
    """Duplicate deliveries of one turn task race on the statement, many times: one claims,
    the others get nothing, and the turn and the budget are counted once."""
    for _ in range(20):
        team, agent = _team(pg_router, "scheduled")
        epoch = pg_router.agent(team, "Engineer_1").epoch
        barrier = threading.Barrier(4)
        claimed: list[Any] = []

        def claim(
            barrier: threading.Barrier = barrier,
            claimed: list[Any] = claimed,
            agent: int = agent,
            epoch: int = epoch,
        ) -> None:
            barrier.wait()
            claimed.append(pg_router.claim(agent, epoch))

        threads = [threading.Thread(target=claim) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(turn is not None for turn in claimed) == 1
        assert len(pg_router.store.reads.turns(agent)) == 1
        assert pg_router.store.budget(team).used[BudgetName.TURNS] == 1
        refused = [e for e in pg_router.ledger(team) if e.action is LedgerAction.CLAIM_REFUSED]
        assert len(refused) == 3


@pytest.mark.parametrize("general", [False, True], ids=["one statement", "general way"])
def test_the_built_in_loop_claims_no_turn_a_host_runs(
    pg_router: Router, monkeypatch: pytest.MonkeyPatch, general: bool
) -> None:
    """Both ways: the built-in loop's claim of a host-owned agent's turn names the host's task
    and writes nothing; the host's own claim of it then succeeds."""
    if general:
        monkeypatch.setattr(claim_statement, "eligible", lambda tx: False)
    team = pg_router.create_team().id
    agent = pg_router.create_agent(team, role="Engineer", runner="chat.engineer_turn").id
    pg_router.send(team, to="Engineer_1", content="go", sender="user")
    before = len(pg_router.ledger(team))
    with pytest.raises(HostOwnedTurnError) as owned:
        pg_router.claim(agent, builtin=True)
    assert owned.value.runner == "chat.engineer_turn"
    assert len(pg_router.ledger(team)) == before
    assert pg_router.agent(team, "Engineer_1").state.value == "scheduled"
    assert pg_router.claim(agent) is not None
