"""The end of a turn as one statement on PostgreSQL, its own transaction (autocommit): one round
trip.

The general way (:func:`agent_router.store.turns.end_turn`) locks the agent and reads its turn,
reads the question it waits on, the tool calls its last assistant message left open and its
pending wake messages, then writes the turn ended, the agent moved and the ledger events: nine
round trips between ``BEGIN`` and ``COMMIT``. Here one data-modifying statement does the same
for the common end: the agent ``running`` in the turn's epoch with no stop requested (a failed
turn ignores a stop request, as the general way does), the turn ``running``, no question
waiting, and no tool call of the last assistant message without its result, so that none is
left to close. It locks the agent (``FOR NO KEY UPDATE``, as the general way does),
ends the turn, moves the agent to ``completed``, or, when wake messages are pending, schedules
exactly one follow-up turn in the next epoch with its turn task's outbox row, and writes the
``turn_ended`` (and ``follow_up``) events. Any other end writes nothing here and goes the
general way, which decides (a stale turn is refused and ledgered there).

A single statement reads with the snapshot taken when it began, and only its locked row comes
back as it is once the lock is had; what it reads of the mailbox and the questions must be no
older than the lock, or a message routed while the statement waited for the lock would be
missed and the agent left ``completed`` with wake mail pending. Every transaction that routes
a message to the agent, answers its question, appends to its transcript (which bumps the
agent's transcript counter) or moves it changes the agent's row, so the
statement matches only when the locked row is the version its snapshot sees (the same
``xmin``): nothing changed the agent between the two, and its reads are current. Otherwise it
writes nothing and the general way, whose statements each read after the lock, decides.

A connection lost during the statement leaves it unknown whether the turn ended
(:class:`~agent_router.errors.CommitUnknownError`, as a lost ``COMMIT`` does): sent again, the
end finds the turn no longer running and is refused as stale if it did.
"""

from __future__ import annotations

from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Engine

from agent_router.domain import (
    AgentState,
    EndOfTurn,
    LedgerAction,
    MessageStatus,
    OutboxEntry,
    OutboxKind,
    TurnRecord,
    TurnStatus,
    TurnTrigger,
)
from agent_router.settings import Settings
from agent_router.store import driver
from agent_router.store.append_statement import open_tool_call_ids
from agent_router.store.models import (
    AgentRow,
    AgentStateType,
    LedgerActionType,
    LedgerRow,
    MessageRow,
    QuestionRow,
    TurnRow,
    TurnStatusType,
    TurnTriggerType,
)
from agent_router.store.one_statement import constant, insert_from, param, turn_task
from agent_router.store.tx import ledger_row, log_event

_agents, _turns, _ledger, _messages, _questions = (
    cast("sa.Table", r.__table__) for r in (AgentRow, TurnRow, LedgerRow, MessageRow, QuestionRow)
)

#: An ended turn's result and the outbox rows its statement wrote (published after it).
Ended = tuple[EndOfTurn, list[OutboxEntry]]


def eligible(settings: Settings) -> bool:
    """On PostgreSQL."""
    return not settings.is_sqlite


def end_alone(engine: Engine, turn: TurnRecord, *, failed: bool, error: str | None) -> Ended | None:
    """End ``turn`` (``failed``: with ``error``) in one statement that is its own transaction;
    ``None`` when it wrote nothing and the general way must decide."""
    # The turn_ended event's detail as the general way writes it; the statement adds the
    # agent's state after the end.
    ended = ledger_row(
        LedgerAction.TURN_ENDED,
        team_id=None,
        agent_id=turn.agent_id,
        turn_id=turn.id,
        epoch=turn.epoch,
        failed=failed,
        error=error,
        synthetic_results=0,
    )
    params = {
        "b_agent": turn.agent_id,
        "b_turn": turn.id,
        "b_epoch": turn.epoch,
        "b_failed": failed,
        "b_error": error,
        "b_now": ended["created_at"],
        "b_detail": ended["detail"],
    }
    found = driver.one_row(engine, _STATEMENT, params)
    if found is None:
        return None
    state: AgentState = found["state"]
    follow_up = state is AgentState.SCHEDULED
    about = {"team_id": found["team_id"], "agent_id": turn.agent_id, "turn_id": turn.id}
    log_event(ended | about | {"detail": ended["detail"] | {"state": state.value}})
    entries = []
    if follow_up:
        log_event(ledger_row(LedgerAction.FOLLOW_UP, **about, epoch=found["epoch"]))
        entries.append(
            OutboxEntry(
                id=found["outbox_id"],
                kind=OutboxKind.ENQUEUE_TURN,
                agent_id=turn.agent_id,
                epoch=found["epoch"],
                payload=found["payload"],
            )
        )
    return EndOfTurn(follow_up=follow_up, state=state, epoch=found["epoch"]), entries


def _locked() -> sa.CTE:
    """The agent, locked, if the turn's end may be written here: ``running`` in the turn's
    epoch, no stop requested (unless the turn failed), no question waiting, no tool call open,
    and its row unchanged since the statement's snapshot; with whether wake messages wait."""
    agent = _agents.c
    seen = _agents.alias("seen")
    message, question = _messages.c, _questions.c
    pending_wake = sa.exists().where(
        message.target_agent_id == agent.id,
        message.status == constant(MessageStatus.PENDING),
        message.wake.is_(True),
    )
    return (
        sa.select(
            agent.id,
            agent.team_id,
            agent.display_name,
            param("b_now", sa.DateTime).label("now"),
            pending_wake.label("follow_up"),
        )
        .where(
            agent.id == sa.bindparam("b_agent"),
            agent.epoch == sa.bindparam("b_epoch"),
            agent.state == constant(AgentState.RUNNING),
            sa.or_(agent.stop_requested.is_(False), param("b_failed", sa.Boolean)),
            # The row locked is the row the snapshot sees: the reads below are current.
            sa.literal_column("ar_agents.xmin")
            == sa.select(sa.literal_column("seen.xmin"))
            .where(seen.c.id == sa.bindparam("b_agent"))
            .scalar_subquery(),
            ~sa.exists().where(question.asker_agent_id == agent.id, question.waiting.is_(True)),
            ~sa.exists(open_tool_call_ids(sa.bindparam("b_agent"))),
        )
        .with_for_update(of=_agents, key_share=True)
        # Materialized: the agent is locked as the CTE is read, before anything is written.
        .cte("old")
        .prefix_with("MATERIALIZED")
    )


def _ended(old: sa.CTE) -> sa.CTE:
    """The turn ended (or failed), if it still runs."""
    turn = _turns.c
    return (
        sa.update(_turns)
        .where(
            turn.id == sa.bindparam("b_turn"),
            turn.agent_id == old.c.id,
            turn.status == constant(TurnStatus.RUNNING),
        )
        .values(
            status=sa.case(
                (param("b_failed", sa.Boolean), constant(TurnStatus.FAILED, TurnStatusType)),
                else_=constant(TurnStatus.ENDED, TurnStatusType),
            ),
            ended_at=old.c.now,
            error=param("b_error", sa.Text),
        )
        .returning(turn.id)
        .cte("ended")
    )


def _moved(old: sa.CTE, ended: sa.CTE) -> sa.CTE:
    """The agent, once its turn ended: ``completed``, or ``scheduled`` for one follow-up turn
    in the next epoch when wake messages wait."""
    agent = _agents.c
    follow_up, now = old.c.follow_up, old.c.now
    return (
        sa.update(_agents)
        .where(agent.id == old.c.id, sa.exists(sa.select(ended.c.id)))
        .values(
            state=sa.case(
                (follow_up, constant(AgentState.SCHEDULED, AgentStateType)),
                else_=constant(AgentState.COMPLETED, AgentStateType),
            ),
            epoch=sa.case((follow_up, agent.epoch + 1), else_=agent.epoch),
            pending_trigger=sa.case(
                (follow_up, constant(TurnTrigger.FOLLOW_UP, TurnTriggerType)),
                else_=agent.pending_trigger,
            ),
            scheduled_at=sa.case((follow_up, now), else_=agent.scheduled_at),
        )
        .returning(
            agent.id,
            agent.team_id,
            agent.epoch,
            agent.state,
            agent.runner,
            old.c.display_name,
            now,
            follow_up,
        )
        .cte("moved")
    )


def _events(moved: sa.CTE) -> tuple[sa.CTE, sa.CTE]:
    """The ``turn_ended`` event, and the ``follow_up`` event when a follow-up was scheduled:
    two INSERTs, the second reading the first's RETURNING, so that the first row gets its id
    first and their ids keep the order the general way writes them in."""
    about = {
        "team_id": moved.c.team_id,
        "agent_id": moved.c.id,
        "turn_id": param("b_turn", sa.BigInteger),
        "created_at": moved.c.now,
    }
    state = sa.func.jsonb_build_object(constant("state"), sa.cast(moved.c.state, sa.Text))
    turn_ended = (
        insert_from(
            _ledger,
            moved,
            **about,
            action=constant(LedgerAction.TURN_ENDED, LedgerActionType),
            epoch=param("b_epoch", sa.Integer),
            detail=sa.bindparam("b_detail", type_=JSONB).op("||")(state),
        )
        .returning(_ledger.c.id)
        .cte("turn_ended")
    )
    followed = insert_from(
        _ledger,
        moved.join(turn_ended, sa.true()),
        where=moved.c.follow_up,
        **about,
        action=constant(LedgerAction.FOLLOW_UP, LedgerActionType),
        epoch=moved.c.epoch,
        detail=sa.literal_column("'{}'::jsonb", JSONB),
    ).cte("followed")
    return turn_ended, followed


def _statement() -> sa.Select[Any]:
    old = _locked()
    moved = _moved(old, _ended(old))
    outbox = turn_task(
        moved, name=moved.c.display_name, trigger=TurnTrigger.FOLLOW_UP, where=moved.c.follow_up
    )
    return (
        sa.select(
            moved.c.team_id,
            moved.c.epoch,
            moved.c.state,
            outbox.c.id.label("outbox_id"),
            outbox.c.payload,
        )
        .select_from(moved.outerjoin(outbox, sa.true()))
        .add_cte(*_events(moved))
    )


#: Built once: every turn ends with it.
_STATEMENT = _statement()
