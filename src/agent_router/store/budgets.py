"""Team budgets and token usage, in the database so that every worker of a team shares them.

One ``ar_budgets`` row per team holds its limits (NULL: unlimited) and what it used. Every check
locks that row (PostgreSQL ``SELECT ... FOR UPDATE``; SQLite's write lock is taken when the
transaction begins), compares and counts in the same transaction: two workers can never both
take the last model call. Checks happen when a turn starts (turns, and every other budget) and
before each model call (model calls, tokens, cost, wall time). Tokens and cost are known only
after a call, so a call already under way may pass those two limits by its own usage; the next
check then finds them spent.

The first check that finds a budget spent marks the team ``exhausted`` with that budget's name
and writes one ``budget_exhausted`` ledger event; the caller then stops the team. The first
check that finds a budget past ``budget_warning_ratio`` of its limit writes one
``budget_warning`` event and the caller tells the agents to wrap up. An operator's new limits
(:func:`set_limits`) clear the mark when nothing is spent any more.

Usage of every model call is a ``ar_model_calls`` row (tokens, cost, turn, agent) and a
``model_call`` ledger event; the team totals are kept on the budget row. A cost and a total
saturate at their column's range (64 bits) rather than overflow it: a call's cost past it (or
not finite) is recorded as the most the column holds, a team's total stops there, and the
``model_call`` event names what saturated (``saturated``: ``cost_usd`` for the call's cost,
``team_<column>`` for a total). A team whose usage is that absurd has long spent any budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from agent_router.domain import (
    TEAM_STOPPING_BUDGETS,
    AgentState,
    Budget,
    BudgetCheck,
    BudgetName,
    LedgerAction,
    TokenUsage,
)
from agent_router.store import refusals
from agent_router.store.models import AgentRow, BudgetRow, ModelCallRow, TeamRow, utcnow
from agent_router.store.rules import (
    LIMIT_COLUMNS,
    MAX_STORED,
    NANO,
    budget_limit,
    budget_of,
    budget_used,
    call_cost_nano,
    default_limits,
    priced,
    stored_limit,
)
from agent_router.store.tx import Tx
from agent_router.store.values import CallUsage

#: The token counts of a model call: a column each of its ``ar_model_calls`` row and of the
#: team's budget row (the team's sums), and a field each of :class:`TokenUsage`.
_TOKEN_COUNTS = ("prompt_tokens", "completion_tokens", "cached_tokens")


def _row(tx: Tx, team_id: int) -> BudgetRow:
    """The team's budget row, locked; made from the defaults if the team has none yet (a team
    created before budgets existed)."""
    session = tx.session
    stmt = sa.select(BudgetRow).where(BudgetRow.team_id == team_id).with_for_update()
    row = session.scalars(stmt).one_or_none()
    if row is not None:
        return row
    created = session.scalar(sa.select(TeamRow.created_at).where(TeamRow.id == team_id))
    if created is None:
        raise refusals.error("no_team", team_id=team_id)
    values = _new_row(team_id, created, default_limits(tx.settings))
    insert = (sqlite if tx.settings.is_sqlite else postgresql).insert(BudgetRow)
    session.execute(insert.values(**values).on_conflict_do_nothing())
    return session.scalars(stmt.execution_options(populate_existing=True)).one()


def _new_row(
    team_id: int, started_at: datetime, limits: Mapping[BudgetName, float | None]
) -> dict[str, Any]:
    values: dict[str, Any] = {"team_id": team_id, "started_at": started_at}
    for name, column in LIMIT_COLUMNS.items():
        values[column] = stored_limit(name, limits.get(name))
    wall = values["max_wall_seconds"]
    values["deadline_at"] = None if wall is None else started_at + timedelta(seconds=wall)
    for column in ("model_calls", "turns", "prompt_tokens", "completion_tokens"):
        values[column] = 0
    values.update(cached_tokens=0, cost_nano=0, warned=False, exhausted=None)
    return values


def _sub_agents(tx: Tx, team_id: int) -> tuple[int, int]:
    """Sub-agents ever created, and those not terminated."""
    base = sa.select(sa.func.count()).where(
        AgentRow.team_id == team_id, AgentRow.is_lead.is_(False)
    )
    created = tx.session.scalar(base) or 0
    active = tx.session.scalar(base.where(AgentRow.state != AgentState.TERMINATED)) or 0
    return created, active


def _spent(row: BudgetRow, now: datetime, *, turns: bool = True) -> BudgetName | None:
    """The first team-stopping budget with nothing left. The turn budget is checked only when a
    turn starts (a turn that started may make its model calls)."""
    for name in sorted(TEAM_STOPPING_BUDGETS):
        limit = budget_limit(row, name)
        if limit is None or (name is BudgetName.TURNS and not turns):
            continue
        if budget_used(row, name, now, (0, 0)) >= limit:
            return name
    return None


def _warn(tx: Tx, row: BudgetRow, now: datetime, **ids: Any) -> BudgetName | None:
    """Once per team (until its limits change): the budget past the warning threshold."""
    if row.warned:
        return None
    ratio = tx.settings.budget_warning_ratio
    for name in sorted(TEAM_STOPPING_BUDGETS):
        limit = budget_limit(row, name)
        used = budget_used(row, name, now, (0, 0))
        if limit is not None and used >= ratio * limit:
            row.warned = True
            tx.ledger(
                LedgerAction.BUDGET_WARNING,
                team_id=row.team_id,
                budget=name.value,
                used=used,
                limit=limit,
                **ids,
            )
            return name
    return None


def _refused(tx: Tx, row: BudgetRow, now: datetime, spent: BudgetName, **ids: Any) -> BudgetCheck:
    newly = row.exhausted is None
    if newly:
        row.exhausted = spent
        tx.ledger(
            LedgerAction.BUDGET_EXHAUSTED,
            team_id=row.team_id,
            budget=spent.value,
            used=budget_used(row, spent, now, (0, 0)),
            limit=budget_limit(row, spent),
            **ids,
        )
    return BudgetCheck(ok=False, exhausted=row.exhausted, newly_exhausted=newly)


# ---------------------------------------------------------------------------- transitions


def create(tx: Tx, team_id: int, limits: Mapping[BudgetName, float | None] | None) -> None:
    """The team's budget row: the defaults, with ``limits`` overriding some of them."""
    merged = default_limits(tx.settings) | dict(limits or {})
    created = tx.session.scalar(sa.select(TeamRow.created_at).where(TeamRow.id == team_id))
    if created is None:
        raise refusals.error("no_team", team_id=team_id)
    tx.session.add(BudgetRow(**_new_row(team_id, created, merged)))


def charge_turn(tx: Tx, team_id: int, agent_id: int, turn_id: int) -> BudgetCheck:
    """A turn starts: refused when any team budget is spent, else counted."""
    ids: dict[str, Any] = {"agent_id": agent_id, "turn_id": turn_id}
    row, now = _row(tx, team_id), utcnow()
    spent = row.exhausted or _spent(row, now)
    if spent is not None:
        return _refused(tx, row, now, spent, **ids)
    row.turns += 1
    return BudgetCheck(ok=True, warn=_warn(tx, row, now, **ids))


def charge_model_call(tx: Tx, team_id: int, agent_id: int, turn_id: int | None) -> BudgetCheck:
    """A model call is about to be made: refused when a budget is spent, else counted."""
    ids: dict[str, Any] = {"agent_id": agent_id, "turn_id": turn_id}
    row, now = _row(tx, team_id), utcnow()
    spent = row.exhausted or _spent(row, now, turns=False)
    if spent is not None:
        return _refused(tx, row, now, spent, **ids)
    row.model_calls += 1
    return BudgetCheck(ok=True, warn=_warn(tx, row, now, **ids))


def record_usage(
    tx: Tx,
    team_id: int,
    agent_id: int,
    turn_id: int | None,
    call: CallUsage,
    *,
    agent: str | None = None,
) -> BudgetCheck:
    """One model call's usage: a row per call, the team's totals, one ledger event (whose log
    line names ``agent``; with the call's ``context``, what the request left out, when that
    changed, and its ``ms``); the call's ``window``, where the agent's request window then
    stood, is kept on the agent."""
    usage, model, window, estimated = call.usage, call.model, call.window, call.estimated
    ids: dict[str, Any] = {"agent_id": agent_id, "turn_id": turn_id}
    tokens = {name: getattr(usage, name) for name in _TOKEN_COUNTS}
    cost_nano = call_cost_nano(usage.cost_usd)
    saturated = ["cost_usd"] if cost_nano == MAX_STORED else []
    row, now = _row(tx, team_id), utcnow()
    for name, count in (*tokens.items(), ("cost_nano", cost_nano)):
        total = getattr(row, name) + count
        if total > MAX_STORED:
            total = MAX_STORED
            saturated.append(f"team_{name}")
        setattr(row, name, total)
    if window is not None:
        agent_row = tx.session.get(AgentRow, agent_id)
        if agent_row is not None:
            agent_row.context_window = dict(window)
    tx.session.add(
        ModelCallRow(
            team_id=team_id,
            model=model,
            cost_nano=cost_nano,
            estimated=estimated,
            created_at=now,
            **ids,
            **tokens,
        )
    )
    tx.ledger(
        LedgerAction.MODEL_CALL,
        agent=agent,
        team_id=team_id,
        model=model,
        **tokens,
        cost_usd=cost_nano / NANO,
        estimated=estimated,
        **({} if priced(tx.settings, model) else {"unpriced": True}),
        **ids,
        **({} if call.context is None else {"context": dict(call.context)}),
        **({"saturated": saturated} if saturated else {}),
        **({} if call.seconds is None else {"ms": round(call.seconds * 1000)}),
    )
    return BudgetCheck(ok=True, warn=_warn(tx, row, now, **ids))


def charge_sub_agent(tx: Tx, team_id: int, role: str) -> None:
    """Before a sub-agent is created: refused with :class:`BudgetExhaustedError` (and a
    ``budget_refused`` event) when the team has created, or has active, as many as its limits
    allow. Nothing else stops: the lead reads why in its tool result."""
    row, now = _row(tx, team_id), utcnow()
    counts = _sub_agents(tx, team_id)
    for name in (BudgetName.SUB_AGENTS_CREATED, BudgetName.SUB_AGENTS_ACTIVE):
        limit, used = budget_limit(row, name), budget_used(row, name, now, counts)
        if limit is None or used < limit:
            continue
        raise tx.refuse(
            refusals.error("sub_agents_spent", budget=name.value, limit=int(limit), used=int(used)),
            LedgerAction.BUDGET_REFUSED,
            team_id=team_id,
            budget=name.value,
            limit=limit,
            used=used,
            role=role,
        )


def set_limits(
    tx: Tx, team_id: int, limits: Mapping[BudgetName, float | None], *, by: str
) -> Budget:
    """An operator's new limits (``None``: unlimited; budgets not named keep theirs). The warning
    may be given again; a team stopped by a budget that is no longer spent may go on
    (``exhausted`` cleared)."""
    row, now = _row(tx, team_id), utcnow()
    for name, value in limits.items():
        setattr(row, LIMIT_COLUMNS[name], stored_limit(name, value))
    wall = row.max_wall_seconds
    row.deadline_at = None if wall is None else row.started_at + timedelta(seconds=wall)
    row.warned = False
    before = row.exhausted
    if row.exhausted is not None and _spent(row, now) is None:
        row.exhausted = None
    tx.ledger(
        LedgerAction.BUDGET_CHANGED,
        team_id=team_id,
        by=by,
        limits={n.value: v for n, v in limits.items()},
        was_exhausted=before.value if before else None,
        exhausted=row.exhausted.value if row.exhausted else None,
    )
    return _budget(tx, row, now)


def budget(tx: Tx, team_id: int) -> Budget:
    """The team's limits and what it used."""
    return _budget(tx, _row(tx, team_id), utcnow())


def _budget(tx: Tx, row: BudgetRow, now: datetime) -> Budget:
    return budget_of(row, _sub_agents(tx, row.team_id), now)


# ---------------------------------------------------------------------------- reads


def usage_sums(session: Session, where: Any, key: Any) -> dict[int, TokenUsage]:
    """Usage of model calls matching ``where``, summed per ``key`` (a column)."""
    m = ModelCallRow
    stmt = (
        sa.select(
            key,
            sa.func.count(),
            sa.func.sum(m.prompt_tokens),
            sa.func.sum(m.completion_tokens),
            sa.func.sum(m.cached_tokens),
            # A sum of costs may pass 64 bits (each saturates at them): SQLite's integer sum
            # would refuse it, so costs are summed as floating point on both databases.
            sa.func.sum(sa.cast(m.cost_nano, sa.Float)),
        )
        .where(where)
        .group_by(key)
    )
    return {
        int(k): TokenUsage(
            model_calls=int(n),
            prompt_tokens=int(p),
            completion_tokens=int(c),
            cached_tokens=int(cached),
            cost_usd=float(cost) / NANO,
        )
        for k, n, p, c, cached, cost in session.execute(stmt)
        if k is not None
    }
