"""A turn's claim as one statement on PostgreSQL, its own transaction (autocommit): one round
trip.

The general way (:func:`agent_router.store.turns.claim_turn`) locks the agent, inserts the turn
through the unit of work, moves the agent, writes the ledger event and charges the team's
budget row: six statements between ``BEGIN`` and ``COMMIT``. Here one data-modifying statement
does the same for an agent that is ``scheduled`` in the epoch claimed (and, for the built-in
loop, whose turns no host's task runs) when counting the turn is all the budget check would do
(:func:`~agent_router.store.budgets.quiet_turn_charge`): it locks the agent (``FOR NO KEY
UPDATE``, as the general way does), counts the turn on the team's budget row (the agent's lock
is taken first, as in the general way), and only if it counted it, moves the agent to
``running`` with no pending trigger and inserts the turn with its lease and the
``turn_claimed`` event; it returns the turn with the agent's team and name. Any other claim (an
agent in another state or epoch, an unknown one, a budget spent, a warning due, a team without
a budget row): nothing is written, and the general way decides (a refused claim is ledgered
there).

A connection lost during the statement leaves it unknown whether the turn was claimed
(:class:`~agent_router.errors.CommitUnknownError`, as a lost ``COMMIT`` does): the turn is left
to recovery (a claimed turn's lease lapses and the sweeper takes it over).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from agent_router.domain import AgentState, LedgerAction, TurnStatus, TurnTrigger
from agent_router.settings import Settings
from agent_router.store import budgets, driver, values
from agent_router.store.models import (
    AgentRow,
    LedgerActionType,
    LedgerRow,
    TurnRow,
    TurnStatusType,
    utcnow,
)
from agent_router.store.one_statement import constant, insert_from
from agent_router.store.tx import ledger_row, log_event
from agent_router.store.values import Claim

_agents, _turns, _ledger = (cast("sa.Table", r.__table__) for r in (AgentRow, TurnRow, LedgerRow))


def eligible(settings: Settings) -> bool:
    """On PostgreSQL."""
    return not settings.is_sqlite


def claim_alone(
    engine: Engine, settings: Settings, agent_id: int, epoch: int | None, *, builtin: bool
) -> Claim | None:
    """The claimed turn, counted on the team's budget; ``None`` when nothing was claimed (nor
    written) and the general way must decide. ``builtin``: an agent whose turns a host's task
    runs matches nothing."""
    now = utcnow()
    params = {
        "b_agent": agent_id,
        "b_epoch": epoch,
        "b_builtin": builtin,
        "b_now": now,
        "b_lease": now + timedelta(seconds=settings.lease_seconds),
        "b_ratio": settings.budget_warning_ratio,
    }
    found = driver.one_row(engine, _STATEMENT, params)
    if found is None:
        return None
    record = values.turn(found)
    log_event(
        ledger_row(
            LedgerAction.TURN_CLAIMED,
            team_id=found["team_id"],
            agent_id=agent_id,
            turn_id=record.id,
            epoch=record.epoch,
            trigger=record.trigger.value,
        )
    )
    return Claim(record, found["team_id"], found["display_name"], budgets.COUNTED)


def _locked() -> sa.CTE:
    """The agent, locked, if it is scheduled in the epoch claimed (any, when none is given),
    with the trigger of the turn it is scheduled for."""
    agent = _agents.c
    return (
        sa.select(
            agent.id,
            agent.team_id,
            agent.display_name,
            agent.epoch,
            sa.func.coalesce(agent.pending_trigger, constant(TurnTrigger.NEW)).label("trigger"),
        )
        .where(
            agent.id == sa.bindparam("b_agent"),
            agent.state == constant(AgentState.SCHEDULED),
            sa.or_(sa.not_(sa.bindparam("b_builtin", type_=sa.Boolean)), agent.runner.is_(None)),
            sa.or_(
                sa.bindparam("b_epoch", type_=sa.Integer).is_(None),
                agent.epoch == sa.bindparam("b_epoch", type_=sa.Integer),
            ),
        )
        .with_for_update(key_share=True)
        # Materialized: the agent is locked as the CTE is read, before anything is written.
        .cte("old")
        .prefix_with("MATERIALIZED")
    )


def _statement() -> sa.Select[Any]:
    agent = _agents.c
    old = _locked()
    # The team's id comes from the locked agent: the agent is locked before the budget row.
    charged = (
        budgets.quiet_turn_charge(sa.select(old.c.team_id).scalar_subquery())
        .returning(sa.literal(1).label("one"))
        .cte("charged")
    )
    counted = sa.exists(sa.select(charged.c.one))
    moved = (
        sa.update(_agents)
        .where(agent.id == sa.select(old.c.id).scalar_subquery(), counted)
        .values(state=constant(AgentState.RUNNING), pending_trigger=sa.null())
        .cte("moved")
    )
    turn = (
        insert_from(
            _turns,
            where=counted,
            team_id=old.c.team_id,
            agent_id=old.c.id,
            epoch=old.c.epoch,
            trigger=old.c.trigger,
            status=constant(TurnStatus.RUNNING, TurnStatusType),
            started_at=sa.bindparam("b_now", type_=sa.DateTime),
            lease_expires_at=sa.bindparam("b_lease", type_=sa.DateTime),
        )
        .returning(*[_turns.c[name] for name in values.TURN_FIELDS])
        .cte("turn")
    )
    event = insert_from(
        _ledger,
        old.join(turn, sa.true()),
        team_id=old.c.team_id,
        agent_id=old.c.id,
        action=constant(LedgerAction.TURN_CLAIMED, LedgerActionType),
        turn_id=turn.c.id,
        epoch=turn.c.epoch,
        detail=sa.func.jsonb_build_object(constant("trigger"), turn.c.trigger),
        created_at=sa.bindparam("b_now", type_=sa.DateTime),
    ).cte("event")
    return (
        sa.select(turn, old.c.team_id, old.c.display_name)
        .select_from(turn.join(old, sa.true()))
        .add_cte(moved, event)
    )


#: Built once: every turn starts with it.
_STATEMENT = _statement()
