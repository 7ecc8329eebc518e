"""What a router does around the budget checks: stop a team whose budget is spent, and tell its
agents to wrap up when a budget runs low.

The checks themselves are store transitions (:mod:`agent_router.store.budgets`). Here:

- a turn is admitted only while every team budget has something left; a refused turn stops at
  once (agent ``idle``, mailbox kept);
- before each model call the call is counted; a refused call raises
  :class:`~agent_router.errors.BudgetExhaustedError` and the loop stops the turn (open tool calls
  get ``cancelled`` results, its questions are cancelled);
- the check that spends a budget stops the whole team: every sub-agent that is scheduled,
  running or waiting is stopped (questions asked of it and by it are cancelled, blocked askers
  get a result), and a lead that is scheduled is refused its turn;
- the check that first passes the warning threshold sends every agent one ``notice`` (context
  only) asking it to wrap up;
- an operator's new limits (:func:`set_limits`) let a stopped team go on.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from agent_router import errors, validation
from agent_router.domain import (
    Agent,
    AgentState,
    Budget,
    BudgetCheck,
    BudgetName,
    CallSpan,
    Delivery,
    MessageType,
    Team,
    TokenUsage,
)
from agent_router.hooks import RouterHooks
from agent_router.logfields import get_logger
from agent_router.turn import Turn

if TYPE_CHECKING:
    from agent_router.settings import Settings
    from agent_router.store import Store
    from agent_router.store.values import CallUsage


class Budgeted(Protocol):
    """What the budget checks need of the router (:class:`~agent_router.router.Router` is one):
    its store and hooks, and the sends and stops a spent or nearly spent budget makes. The
    router depends on this module, never the other way round."""

    store: Store
    hooks: RouterHooks

    def team(self, team_id: int) -> Team: ...

    def agents(self, team_id: int) -> list[Agent]: ...

    def send(
        self,
        team_id: int,
        *,
        to: str,
        content: str,
        sender: str = "user",
        type: MessageType | str = MessageType.MESSAGE,
        wake: bool = True,
    ) -> Delivery: ...

    def stop(self, team_id: int, display_name: str, *, reason: str) -> AgentState: ...


logger = get_logger(__name__)

#: What every agent reads once a team budget passes its warning threshold.
WARNING_NOTICE = (
    "The team has used {percent}% of its {budget} budget ({used} of {limit}). Wrap up: finish "
    "the step you are on, report what you have, and start nothing new."
)

#: Limits that lift every budget (``create_team(budget=NO_LIMITS)``): a soak test, a benchmark.
NO_LIMITS: Mapping[BudgetName, float | None] = dict.fromkeys(BudgetName)

#: Why a turn or a model call was refused.
SPENT = "the team's {budget} budget is spent"

_ACTIVE = (AgentState.SCHEDULED, AgentState.RUNNING, AgentState.WAITING)

#: What a process says once per model the price table does not list, while a cost budget is set.
UNPRICED = (
    "model {model!r} has no price in AGENT_ROUTER_MODELS: its calls count as $0, so the "
    "${limit:g} cost budget (AGENT_ROUTER_BUDGET_COST_USD) never stops a team; add the model's "
    "prices to AGENT_ROUTER_MODELS"
)


class _Said:
    """The models this process has said :data:`UNPRICED` of."""

    lock = threading.Lock()
    models: set[str] = set()


def admit_turn(router: Budgeted, turn: Turn, check: BudgetCheck) -> bool:
    """Act on a claimed turn's budget ``check`` (counted in the claim's transaction): warn or
    stop the team as it says; ``False`` (the turn already stopped) when a budget is spent."""
    _after(router, turn.team_id, check)
    if check.ok:
        return True
    assert check.exhausted is not None
    turn.finish_stop(reason=SPENT.format(budget=check.exhausted.value))
    return False


def charge_model_call(router: Budgeted, turn: Turn) -> None:
    """Count a model call; raises :class:`BudgetExhaustedError` when a budget is spent."""
    model_call_charged(
        router, turn, router.store.charge_model_call(turn.team_id, turn.agent_id, turn.id)
    )


def model_call_charged(router: Budgeted, turn: Turn, check: BudgetCheck) -> None:
    """Act on a model call's ``check`` (counted by the store): warn or stop the team as it
    says; raises :class:`BudgetExhaustedError` when a budget is spent."""
    _after(router, turn.team_id, check)
    if not check.ok:
        assert check.exhausted is not None
        raise errors.BudgetExhaustedError(
            SPENT.format(budget=check.exhausted.value), budget=check.exhausted.value
        )


def priced(
    settings: Settings,
    model: str | None,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
) -> TokenUsage:
    """One model call's usage: its tokens and their cost by the ``models`` price table (0 for a
    model the table does not list, said once per process and model while a cost budget is
    set)."""
    spec = settings.models.get(model or "")
    if spec is None and model and settings.budget_cost_usd is not None:
        with _Said.lock:
            first = model not in _Said.models
            _Said.models.add(model)
        if first:
            logger.warning(
                UNPRICED.format(model=model, limit=settings.budget_cost_usd),
                extra={"action": "model_unpriced", "model": model},
            )
    cost = spec.cost(prompt_tokens, completion_tokens, cached_tokens) if spec else 0.0
    return TokenUsage(
        model_calls=1,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached_tokens,
        cost_usd=cost,
    )


def usage_recorded(router: Budgeted, turn: Turn, call: CallUsage, check: BudgetCheck) -> None:
    """After a model ``call``'s usage is recorded (its budget ``check``): the hooks hear of it
    (with how long it took, as a span too), and the team is warned or stopped as the check
    says."""
    model, usage, seconds = call.model, call.usage, call.seconds
    router.hooks.after_model_call(turn, model, usage)
    if seconds is not None:
        router.hooks.after_call(
            turn,
            CallSpan.ended_now(
                "model",
                model or "model",
                seconds,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                cached_tokens=usage.cached_tokens,
                cost_usd=usage.cost_usd,
                estimated=call.estimated,
            ),
        )
    _after(router, turn.team_id, check)


def _after(router: Budgeted, team_id: int, check: BudgetCheck) -> None:
    if check.warn is not None:
        warn_team(router, team_id, check.warn)
    if check.newly_exhausted and check.exhausted is not None:
        router.hooks.after_budget_exhausted(team_id, check.exhausted)
        stop_team(router, team_id, check.exhausted)


def warn_team(router: Budgeted, team_id: int, budget: BudgetName) -> None:
    """One wrap-up notice (context only, it wakes nobody) to every agent of the team."""
    state = router.store.budget(team_id)
    limit, used = state.limits[budget], state.used[budget]
    text = WARNING_NOTICE.format(
        percent=round(100 * used / limit) if limit else 100,
        budget=budget.value,
        used=_number(used),
        limit=_number(limit or 0),
    )
    for agent in router.agents(team_id):
        if agent.state is AgentState.TERMINATED:
            continue
        try:
            router.send(
                team_id,
                to=agent.display_name,
                content=text,
                sender="system",
                type=MessageType.NOTICE,
                wake=False,
            )
        except errors.AgentRouterError:
            logger.exception("budget warning not sent", extra={"action": "budget_warning"})


def stop_team(router: Budgeted, team_id: int, budget: BudgetName) -> None:
    """Stop every sub-agent that is scheduled, running or waiting (running ones at their next
    boundary); the lead stops at its next model call or turn, both refused."""
    reason = SPENT.format(budget=budget.value)
    for agent in router.agents(team_id):
        if agent.is_lead or agent.state not in _ACTIVE:
            continue
        try:
            router.stop(team_id, agent.display_name, reason=reason)
        except errors.RefusedError:  # terminated meanwhile: nothing left to stop
            continue
    logger.warning(
        "team budget spent: team stopped",
        extra={"action": "budget_exhausted", "team_id": team_id, "budget": budget.value},
    )


def set_limits(
    router: Budgeted, team_id: int, limits: Mapping[BudgetName, float | None], *, by: str
) -> Budget:
    """An operator's new limits for a team (``None``: unlimited). A team stopped by a budget
    that is no longer spent goes on: its lead is woken with a notice saying so."""
    limits = validation.budget_limits(limits)
    by = validation.label(by, "by")
    team_id = validation.row_id(team_id, "team", errors.UnknownTeamError)
    before = router.store.budget(team_id).exhausted
    budget = router.store.set_limits(team_id, limits, by=by)
    if before is not None and budget.exhausted is None:
        router.send(
            team_id,
            to=router.team(team_id).lead.display_name,
            content=f"The {before.value} budget was raised by {by}: the team may go on. "
            "Resume the work that was stopped.",
            sender="system",
            type=MessageType.NOTICE,
        )
    return budget


def _number(value: float) -> str:
    return f"{value:.4g}" if value != int(value) else str(int(value))
