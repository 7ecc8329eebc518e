"""The route as one statement on PostgreSQL, for the sends that need no question: a message that
is not an answer, carries no dedup key and names no question, to an agent that is idle,
completed, running or scheduled. One data-modifying statement locks the target, takes its
sequence number, moves it (a new turn: next epoch, ``scheduled``), inserts the message, the
turn task's outbox row and the route's ledger event, and returns what the send returns. A send
of its own runs it as its own transaction (:func:`route_alone`, autocommit: one round trip);
inside a larger transaction it is one of that transaction's statements (:func:`route`).

The outcome is not decided here: :func:`decisions.decide` gives it for each of these states
before the statement runs, and the statement only picks the one of the state it locked. A
target in any other state (waiting, terminated), an unknown target, and a sender that is
unknown, terminated or the target itself match no row: nothing is written, and the send goes
the general way (:func:`agent_router.store.routing.route`), which decides and refuses.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Engine

from agent_router.domain import (
    AgentState,
    Delivery,
    LedgerAction,
    MessageStatus,
    MessageSubtype,
    MessageType,
    OutboxEntry,
    OutboxKind,
    RouteOutcome,
    TurnTrigger,
)
from agent_router.settings import Settings
from agent_router.store import decisions, driver
from agent_router.store.models import (
    AgentRow,
    LedgerActionType,
    LedgerRow,
    MessageRow,
    MessageStatusType,
    OutboxKindType,
    OutboxRow,
    RouteOutcomeType,
    utcnow,
)
from agent_router.store.tx import Tx, has_buffered_ledger, log_event
from agent_router.store.values import SendRequest

#: A route's delivery and the outbox rows it wrote (published after its commit).
Routed = tuple[Delivery, list[OutboxEntry]]

#: The states whose delivery depends on nothing but the state and the message.
STATES = (AgentState.IDLE, AgentState.COMPLETED, AgentState.RUNNING, AgentState.SCHEDULED)

_agents = cast("sa.Table", AgentRow.__table__)
_messages = cast("sa.Table", MessageRow.__table__)
_outbox = cast("sa.Table", OutboxRow.__table__)
_ledger = cast("sa.Table", LedgerRow.__table__)


def eligible_alone(settings: Settings, req: SendRequest) -> bool:
    """Whether ``req`` may take the one statement as a transaction of its own
    (:func:`route_alone`): on PostgreSQL, not an answer, no dedup key, no question."""
    return (
        not settings.is_sqlite
        and req.type is not MessageType.ANSWER
        and req.dedup_key is None
        and req.question_id is None
    )


def eligible(tx: Tx, req: SendRequest) -> bool:
    """Whether ``req`` may take the one statement inside the transaction ``tx``: as
    :func:`eligible_alone`, and no ledger event of this transaction still buffered (its events
    keep their order)."""
    return eligible_alone(tx.settings, req) and not has_buffered_ledger(tx.session)


def route_alone(engine: Engine, req: SendRequest, *, external: bool) -> Routed | None:
    """Route ``req`` in one statement that is its own transaction (autocommit), sent on the
    driver's connection: one round trip, no ``BEGIN`` and no ``COMMIT``. ``None`` when it
    wrote nothing (the general way must route it). A connection lost during the statement
    leaves it unknown whether it committed: :class:`~agent_router.errors.CommitUnknownError`,
    never a retry."""
    found = driver.one_row(engine, _STATEMENTS[external], _params(req))
    return None if found is None else _routed(req, found)


def route(tx: Tx, req: SendRequest, *, external: bool) -> Delivery | None:
    """Route ``req`` in one statement of the transaction ``tx``; ``None`` when it wrote nothing
    and the general way must route it. ``external``: the sender is not an agent of the team."""
    found = driver.in_transaction(tx.session, _STATEMENTS[external], _params(req))
    if found is None:
        return None
    delivery, entries = _routed(req, found)
    tx.entries.extend(entries)
    return delivery


def _params(req: SendRequest) -> dict[str, Any]:
    params: dict[str, Any] = {
        "b_team": req.team_id,
        "b_to": req.to,
        "b_sender": req.sender,
        "b_type": req.type,
        "b_type_name": req.type.value,
        "b_subtype": req.subtype,
        "b_content": req.content,
        "b_wake": req.wake,
        "b_now": utcnow(),
    }
    params.update(_outcomes(req.type, req.wake, req.subtype))
    return params


@functools.cache
def _outcomes(
    type_: MessageType, wake: bool, subtype: MessageSubtype | None
) -> dict[str, RouteOutcome | bool]:
    """The outcome :func:`decisions.decide` gives such a message in each of STATES, and
    whether it starts a turn, as the statement's parameters; the same for every such send."""
    params: dict[str, RouteOutcome | bool] = {}
    for state in STATES:
        # The sender's id is read by the statement; for these states it decides nothing.
        outcome = decisions.decide(
            state, None, decisions.Incoming(type=type_, sender_id=None, wake=wake, subtype=subtype)
        )
        params[f"o_{state.value}"] = outcome
        params[f"t_{state.value}"] = outcome is RouteOutcome.TRIGGERED_NEW_TURN
    return params


def _routed(req: SendRequest, found: Mapping[str, Any]) -> Routed:
    """The delivery and the outbox rows of the statement's row ``found``."""
    log_event(
        {
            "action": LedgerAction.ROUTE,
            "team_id": req.team_id,
            "agent_id": found["id"],
            "outcome": found["outcome"],
            "message_id": found["message_id"],
            "epoch": found["epoch"],
            "detail": route_detail(req, found["seq"], found["state_before"], found["state"]),
        }
    )
    entries = (
        []
        if found["outbox_id"] is None
        else [
            OutboxEntry(
                id=found["outbox_id"],
                kind=OutboxKind.ENQUEUE_TURN,
                agent_id=found["id"],
                epoch=found["epoch"],
                payload=found["payload"],
            )
        ]
    )
    # The statement returns the delivery's fields by their names.
    delivered = {name: found[name] for name in ("message_id", "outcome", "seq", "epoch")}
    return Delivery(target=req.to, **delivered), entries


def route_detail(
    req: SendRequest, seq: int, before: AgentState, after: AgentState
) -> dict[str, Any]:
    """The detail of a route's ledger event: the message's sequence number, type, sender and
    wake flag, and the receiver's state before and after."""
    return {
        "seq": seq,
        "type": req.type.value,
        "sender": req.sender,
        "wake": req.wake,
        "state_before": before.value,
        "state_after": after.value,
    }


def param(name: str, type_: Any) -> sa.ColumnElement[Any]:
    """A parameter cast to its column's type (PostgreSQL cannot infer it in a SELECT list,
    inside CASE, or as an argument of jsonb_build_object)."""
    return sa.cast(sa.bindparam(name), type_)


def constant(value: Any, type_: sa.Enum | None = None) -> sa.ColumnElement[Any]:
    """A constant written into the statement's text (a key, an enum value), no parameter;
    ``type_`` names the enum type where PostgreSQL cannot infer it (in a SELECT list)."""
    text = f"'{value.value if isinstance(value, enum.Enum) else value}'"
    if type_ is None:
        return sa.literal_column(text)
    return sa.literal_column(f"{text}::{type_.name}", type_)


def insert_from(
    table: sa.Table,
    from_: Any = None,
    *,
    where: sa.ColumnElement[bool] | None = None,
    **columns: sa.ColumnElement[Any],
) -> sa.Insert:
    """``INSERT INTO table (columns) SELECT their values [FROM from_] [WHERE where]``."""
    select = sa.select(*columns.values())
    if from_ is not None:
        select = select.select_from(from_)
    if where is not None:
        select = select.where(where)
    return sa.insert(table).from_select(list(columns), select)


def live_sender_id() -> sa.ScalarSelect[Any]:
    """The id of the agent named ``b_sender`` in team ``b_team``, unless it is terminated
    (``NULL``: no such live agent)."""
    sender = _agents.alias("s")
    return (
        sa.select(sender.c.id)
        .where(
            sender.c.team_id == sa.bindparam("b_team"),
            sender.c.display_name == sa.bindparam("b_sender"),
            sender.c.state != constant(AgentState.TERMINATED),
        )
        .scalar_subquery()
    )


def _locked(*, external: bool) -> sa.CTE:
    """The target, locked as the general way locks it (FOR NO KEY UPDATE), in one of STATES,
    with the sender's id, the outcome decided for its state and whether that outcome starts a
    turn."""
    agent = _agents.c
    source_id = sa.cast(sa.null(), sa.BigInteger) if external else live_sender_id()
    in_state = [(agent.state == constant(s), s) for s in STATES]
    return (
        sa.select(
            agent.id,
            agent.team_id,
            agent.state,
            source_id.label("source_id"),
            # The parameters that more than one row takes, named once.
            param("b_now", sa.DateTime).label("now"),
            param("b_sender", sa.Text).label("sender"),
            param("b_wake", sa.Boolean).label("wake"),
            sa.case(*[(c, param(f"o_{s.value}", RouteOutcomeType)) for c, s in in_state]).label(
                "outcome"
            ),
            sa.case(*[(c, param(f"t_{s.value}", sa.Boolean)) for c, s in in_state]).label(
                "new_turn"
            ),
        )
        .where(
            agent.team_id == sa.bindparam("b_team"),
            agent.display_name == sa.bindparam("b_to"),
            agent.state.in_([constant(s) for s in STATES]),
        )
        .with_for_update(key_share=True)
        .cte("old")
    )


def _moved(old: sa.CTE, *, external: bool) -> sa.CTE:
    """The target's sequence number taken and, when its outcome starts a turn, the target
    moved to ``scheduled`` in a new epoch; a sender that is the target matches nothing."""
    agent = _agents.c
    sender_ok = (
        sa.true()
        if external
        else sa.and_(old.c.source_id.is_not(None), old.c.source_id != old.c.id)
    )
    new_turn = old.c.new_turn
    return (
        sa.update(_agents)
        .where(agent.id == old.c.id, sender_ok)
        .values(
            next_seq=agent.next_seq + 1,
            epoch=sa.case((new_turn, agent.epoch + 1), else_=agent.epoch),
            state=sa.case((new_turn, constant(AgentState.SCHEDULED)), else_=agent.state),
            pending_trigger=sa.case(
                (new_turn, constant(TurnTrigger.NEW)),
                else_=agent.pending_trigger,
            ),
            scheduled_at=sa.case((new_turn, old.c.now), else_=agent.scheduled_at),
        )
        .returning(
            agent.id,
            agent.team_id,
            old.c.now,
            old.c.sender,
            old.c.wake,
            agent.epoch,
            agent.state,
            agent.runner,
            (agent.next_seq - 1).label("seq"),
            old.c.state.label("state_before"),
            old.c.source_id,
            old.c.outcome,
            new_turn,
        )
        .cte("target")
    )


def _message(target: sa.CTE) -> sa.CTE:
    return (
        sa.insert(_messages)
        .from_select(
            [
                "team_id",
                "seq",
                "source_name",
                "source_agent_id",
                "target_agent_id",
                "type",
                "subtype",
                "content",
                "wake",
                "outcome",
                "status",
                "created_at",
            ],
            sa.select(
                target.c.team_id,
                target.c.seq,
                target.c.sender,
                target.c.source_id,
                target.c.id,
                param("b_type", _messages.c.type.type),
                param("b_subtype", _messages.c.subtype.type),
                param("b_content", sa.Text),
                target.c.wake,
                target.c.outcome,
                constant(MessageStatus.PENDING, MessageStatusType),
                target.c.now,
            ),
        )
        .returning(_messages.c.id)
        .cte("message")
    )


def turn_task(
    target: sa.CTE,
    *,
    name: sa.ColumnElement[Any],
    trigger: TurnTrigger,
    where: sa.ColumnElement[bool],
) -> sa.CTE:
    """The outbox row of the turn task of ``target`` (an agent moved to ``scheduled``: its
    ``id``, ``team_id``, new ``epoch``, ``runner`` and ``now``) named ``name``, for a turn of
    ``trigger``, when ``where`` holds."""
    # The turn task's payload, as Tx.outbox writes it: the agent's name and team for monitors,
    # the trigger, and the host's task when a host owns the agent's turns.
    payload = sa.func.jsonb_build_object(
        constant("agent"),
        name,
        constant("team_id"),
        target.c.team_id,
        constant("trigger"),
        constant(trigger),
    ).op("||")(
        sa.case(
            (
                target.c.runner.is_not(None),
                sa.func.jsonb_build_object(constant("task"), target.c.runner),
            ),
            else_=sa.literal_column("'{}'::jsonb", JSONB),
        )
    )
    return (
        sa.insert(_outbox)
        .from_select(
            ["team_id", "agent_id", "kind", "epoch", "payload", "created_at", "attempts"],
            sa.select(
                target.c.team_id,
                target.c.id,
                constant(OutboxKind.ENQUEUE_TURN, OutboxKindType),
                target.c.epoch,
                sa.type_coerce(payload, JSONB),
                target.c.now,
                sa.literal_column("0"),
            ).where(where),
        )
        .returning(_outbox.c.id, _outbox.c.payload)
        .cte("outbox")
    )


def _route_event(target: sa.CTE, message: sa.CTE) -> sa.CTE:
    """The route's ledger event, with the detail the general way writes."""
    detail = {
        "seq": target.c.seq,
        "type": param("b_type_name", sa.Text),
        "sender": target.c.sender,
        "wake": target.c.wake,
        "state_before": sa.cast(target.c.state_before, sa.Text),
        "state_after": sa.cast(target.c.state, sa.Text),
    }
    return (
        sa.insert(_ledger)
        .from_select(
            [
                "team_id",
                "agent_id",
                "action",
                "outcome",
                "message_id",
                "epoch",
                "detail",
                "created_at",
            ],
            sa.select(
                target.c.team_id,
                target.c.id,
                constant(LedgerAction.ROUTE, LedgerActionType),
                target.c.outcome,
                message.c.id,
                target.c.epoch,
                sa.func.jsonb_build_object(
                    *[part for key, value in detail.items() for part in (constant(key), value)]
                ),
                target.c.now,
            ).select_from(target.join(message, sa.true())),
        )
        .cte("ledger")
    )


def _statement(*, external: bool) -> sa.Select[Any]:
    target = _moved(_locked(external=external), external=external)
    message = _message(target)
    outbox = turn_task(
        target, name=param("b_to", sa.Text), trigger=TurnTrigger.NEW, where=target.c.new_turn
    )
    return (
        sa.select(
            target.c.id,
            target.c.epoch,
            target.c.state,
            target.c.seq,
            target.c.state_before,
            target.c.outcome,
            message.c.id.label("message_id"),
            outbox.c.id.label("outbox_id"),
            outbox.c.payload,
        )
        .select_from(target.join(message, sa.true()).outerjoin(outbox, sa.true()))
        .add_cte(_route_event(target, message))
    )


#: Built once, by whether the sender is external (``user``, ``system``, a job): then no sender
#: row is read.
_STATEMENTS = {external: _statement(external=external) for external in (False, True)}
