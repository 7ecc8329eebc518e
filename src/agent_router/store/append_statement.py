"""A turn's transcript append as one statement on PostgreSQL, its own transaction (autocommit):
one round trip.

The general way (:func:`agent_router.store.turns.append_assistant` and
:func:`~agent_router.store.turns.append_tool_result`) locks the agent and reads its turn, reads
the tool calls the last assistant message left open, and inserts the entry at the end of the
transcript: five round trips or more between ``BEGIN`` and ``COMMIT``. Here one statement locks
the agent (``FOR NO KEY UPDATE``, as the general way does) if the turn is current (the agent
``running`` or ``waiting`` in the turn's epoch, the turn ``running``) and the entry may follow:
an assistant message when no tool call is open, a tool result when its call is one of the open
ones; then it inserts the entry at the transcript's next position. Anything else writes nothing
here and goes the general way, which refuses it (ledgered there).

The entry's position is the agent's transcript counter (``next_position``), which the
statement's UPDATE bumps as it locks the agent. What the statement reads of the transcript is
as its snapshot shows it, and only the locked row comes back as it is once the lock is had.
Every writer of an agent's transcript (an
append, an answer's tool result, a drain) holds the agent's lock and bumps that counter in the
same transaction, so the statement matches only when the locked row is the version its
snapshot sees (the same ``xmin``): the transcript it read, and so the open tool calls, are
then the current ones.

A connection lost during the statement leaves it unknown whether the entry was appended
(:class:`~agent_router.errors.CommitUnknownError`): the built-in loop leaves the turn to
recovery, which reads what committed.
"""

from __future__ import annotations

from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Engine

from agent_router.domain import AgentState, TurnRecord, TurnStatus
from agent_router.settings import Settings
from agent_router.store import driver
from agent_router.store.models import AgentRow, TranscriptEntryRow, TurnRow, utcnow
from agent_router.store.one_statement import constant, insert_from, param

_agents, _turns, _transcript = (
    cast("sa.Table", r.__table__) for r in (AgentRow, TurnRow, TranscriptEntryRow)
)


def eligible(settings: Settings) -> bool:
    """On PostgreSQL."""
    return not settings.is_sqlite


def append_alone(
    engine: Engine, turn: TurnRecord, payload: dict[str, Any], *, tool_call_id: str | None
) -> bool:
    """Append ``payload`` (an assistant message, or the result of ``tool_call_id``) to the
    turn's transcript in one statement that is its own transaction; ``False`` when it wrote
    nothing and the general way must decide."""
    params = {
        "b_agent": turn.agent_id,
        "b_turn": turn.id,
        "b_epoch": turn.epoch,
        "b_call": tool_call_id,
        "b_role": payload["role"],
        "b_payload": payload,
        "b_now": utcnow(),
    }
    return driver.one_row(engine, _STATEMENT, params) is not None


def open_tool_call_ids(agent_id: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """The ids of the tool calls of ``agent_id``'s last assistant message that have no result
    after it (:func:`agent_router.store.queries.open_tool_calls`, in SQL), as column ``id``."""
    entry, later = _transcript.c, _transcript.alias("later").c
    last = (
        sa.select(entry.position, entry.payload)
        .where(entry.agent_id == agent_id, entry.role == constant("assistant"))
        .order_by(entry.position.desc())
        .limit(1)
        .subquery("la")
    )
    calls = sa.type_coerce(last.c.payload, JSONB).op("->")(constant("tool_calls"))
    listed = sa.case(
        (sa.func.jsonb_typeof(calls) == constant("array"), calls),
        else_=sa.literal_column("'[]'::jsonb", JSONB),
    )
    call = sa.func.jsonb_array_elements(listed).table_valued("value").render_derived("c")
    call_id = call.c.value.op("->>")(constant("id"))
    answered = sa.exists().where(
        later.agent_id == agent_id,
        later.position > last.c.position,
        later.role == constant("tool"),
        later.tool_call_id == call_id,
    )
    return sa.select(call_id.label("id")).select_from(last).join(call, sa.true()).where(~answered)


def _statement() -> sa.Select[Any]:
    agent, turn = _agents.c, _turns.c
    seen = _agents.alias("seen")
    open_calls = open_tool_call_ids(sa.bindparam("b_agent")).subquery("oc")
    call = sa.bindparam("b_call", type_=sa.String)
    # An assistant message follows no open call; a tool result is one open call's (the ids of
    # one message are distinct).
    matching = (
        sa.select(sa.func.count())
        .select_from(open_calls)
        .where(sa.or_(call.is_(None), open_calls.c.id == call))
        .scalar_subquery()
    )
    may_follow = matching == sa.case((call.is_(None), 0), else_=1)
    # The counter bumped by an UPDATE, which locks the agent (FOR NO KEY UPDATE) and returns
    # the position it held: the entry's.
    taken = (
        sa.update(_agents)
        .where(
            agent.id == sa.bindparam("b_agent"),
            agent.epoch == sa.bindparam("b_epoch"),
            agent.state.in_([constant(AgentState.RUNNING), constant(AgentState.WAITING)]),
            # The row locked is the row the snapshot sees: the transcript read is current.
            sa.literal_column("ar_agents.xmin")
            == sa.select(sa.literal_column("seen.xmin"))
            .where(seen.c.id == sa.bindparam("b_agent"))
            .scalar_subquery(),
            sa.exists().where(
                turn.id == sa.bindparam("b_turn"),
                turn.agent_id == agent.id,
                turn.status == constant(TurnStatus.RUNNING),
            ),
            may_follow,
        )
        .values(next_position=agent.next_position + sa.literal_column("1", sa.Integer))
        .returning(agent.id, (agent.next_position - sa.literal_column("1")).label("position"))
        .cte("taken")
    )
    entry = (
        insert_from(
            _transcript,
            taken,
            agent_id=taken.c.id,
            position=taken.c.position,
            role=param("b_role", sa.String),
            payload=sa.bindparam("b_payload", type_=JSONB),
            tool_call_id=param("b_call", sa.String),
            turn_id=param("b_turn", sa.BigInteger),
            created_at=param("b_now", sa.DateTime),
        )
        .returning(_transcript.c.id)
        .cte("entry")
    )
    return sa.select(entry.c.id)


#: Built once: every model reply and tool result is appended with it.
_STATEMENT = _statement()
