"""``agent-router budget``: a team's budgets and usage, and an operator's new limits."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from agent_router.budgeting import set_limits
from agent_router.domain import Budget, BudgetName
from agent_router.ops.cli.common import (
    BrokerUrlOption,
    DatabaseUrlOption,
    JsonOption,
    TeamArgument,
    _acting_router,
    _one_line_errors,
    app,
)


def _limit(name: str, what: str) -> object:
    return typer.Option(
        f"--{name.replace('_', '-')}",
        envvar=f"AGENT_ROUTER_LIMIT_{name.upper()}",
        help=f"New limit: {what}.",
        show_default=False,
    )


def _amount(name: BudgetName, value: float | None) -> str:
    if value is None:
        return "unlimited"
    if name is BudgetName.COST:
        return f"${value:.4f}"
    return f"{value:.0f}"


def budget_record(budget: Budget) -> dict[str, object]:
    return {
        "team_id": budget.team_id,
        "exhausted": budget.exhausted.value if budget.exhausted else None,
        "warned": budget.warned,
        "limits": {n.value: v for n, v in budget.limits.items()},
        "used": {n.value: v for n, v in budget.used.items()},
        "usage": dataclasses.asdict(budget.usage),
    }


def print_budget(console: Console, budget: Budget) -> None:
    table = Table(title=f"team {budget.team_id} budgets", title_justify="left")
    for column in ("budget", "used", "limit"):
        table.add_column(column, justify="left" if column == "budget" else "right")
    for name in BudgetName:
        spent = name is budget.exhausted
        table.add_row(
            Text(name.value, style="bold red" if spent else ""),
            _amount(name, budget.used[name]),
            _amount(name, budget.limits[name]),
        )
    console.print(table)
    u = budget.usage
    console.print(
        f"tokens: {u.prompt_tokens} prompt ({u.cached_tokens} cached) + {u.completion_tokens} "
        f"completion in {u.model_calls} model calls, ${u.cost_usd:.6f}"
    )
    if budget.exhausted is not None:
        console.print(
            Text(f"stopped: the {budget.exhausted.value} budget is spent", style="bold red")
        )


@app.command()
@_one_line_errors
def budget(  # noqa: PLR0917 - typer options
    team: TeamArgument,
    model_calls: Annotated[int | None, _limit("model_calls", "model calls")] = None,
    turns: Annotated[int | None, _limit("turns", "turns started")] = None,
    tokens: Annotated[int | None, _limit("tokens", "prompt + completion tokens")] = None,
    cost: Annotated[float | None, _limit("cost", "US dollars")] = None,
    wall_seconds: Annotated[
        float | None, _limit("wall_seconds", "seconds since the team was created")
    ] = None,
    sub_agents_created: Annotated[
        int | None, _limit("sub_agents_created", "sub-agents ever created")
    ] = None,
    sub_agents_active: Annotated[
        int | None, _limit("sub_agents_active", "sub-agents not terminated")
    ] = None,
    unlimited: Annotated[
        list[BudgetName] | None,
        typer.Option(envvar="AGENT_ROUTER_UNLIMITED", help="Remove this budget's limit."),
    ] = None,
    database_url: DatabaseUrlOption = None,
    broker_url: BrokerUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """A team's budgets: used and limit of each. With limits given, set them first; a team
    stopped by a budget that is no longer spent goes on (its lead is woken with a notice)."""
    given = {
        BudgetName.MODEL_CALLS: model_calls,
        BudgetName.TURNS: turns,
        BudgetName.TOKENS: tokens,
        BudgetName.COST: cost,
        BudgetName.WALL_SECONDS: wall_seconds,
        BudgetName.SUB_AGENTS_CREATED: sub_agents_created,
        BudgetName.SUB_AGENTS_ACTIVE: sub_agents_active,
    }
    limits: dict[BudgetName, float | None] = {n: v for n, v in given.items() if v is not None}
    limits.update(dict.fromkeys(unlimited or (), None))
    with _acting_router(database_url, broker_url) as router:
        if limits:
            state = set_limits(router, team, limits, by="operator (CLI)")
        else:
            state = router.budget(team)
    if as_json:
        print(json.dumps(budget_record(state)))
    else:
        print_budget(Console(highlight=False), state)
