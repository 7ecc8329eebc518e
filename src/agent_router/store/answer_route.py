"""An answer to the question its receiver waits on, in two statements on PostgreSQL.

The general way (:func:`agent_router.store.routing.route`) delivers such an answer through the
unit of work in ten statements. Here the first statement locks the receiver (as the general way
does, before the question), then the question (``FOR NO KEY UPDATE``, as the general way locks
it), and reads the sender, the waiting turn and the new message's id; Python decides the outcome
(:func:`decisions.decide`) and renders the tool result around that id; the second statement
writes everything: the message delivered, the question answered, the tool result at the end of
the asker's transcript, the asker ``running``, its wake row and the two ledger events
(``question_resolved``, then ``route``), in that order as the general way writes them.

It takes only the common case: an answer from an agent of the team, no dedup key, to an asker
that is ``waiting`` (not suspended) on the very question answered, from the agent asked. Any
other send (an unknown or closed question, another asker, a suspended one, a refused sender)
writes nothing here and goes the general way in the same transaction, which decides and
refuses; the receiver's row stays locked meanwhile, which changes nothing.
"""

from __future__ import annotations

from typing import Any, cast

import sqlalchemy as sa

from agent_router import domain, formats
from agent_router.constants import wake_token
from agent_router.domain import (
    AgentState,
    Delivery,
    LedgerAction,
    MessageStatus,
    OutboxEntry,
    OutboxKind,
    QuestionKind,
    QuestionStatus,
    RouteOutcome,
)
from agent_router.store import decisions, queries, values
from agent_router.store.models import (
    AgentRow,
    LedgerRow,
    MessageRow,
    OutboxRow,
    QuestionRow,
    TranscriptEntryRow,
    TurnRow,
    utcnow,
)
from agent_router.store.one_statement import constant, live_sender_id, route_detail
from agent_router.store.tx import (
    Tx,
    has_buffered_ledger,
    ledger_row,
    log_event,
    written_published,
)
from agent_router.store.values import SendRequest

_agents = cast("sa.Table", AgentRow.__table__)
_questions = cast("sa.Table", QuestionRow.__table__)
_turns = cast("sa.Table", TurnRow.__table__)
_messages = cast("sa.Table", MessageRow.__table__)
_entries = cast("sa.Table", TranscriptEntryRow.__table__)
_outbox = cast("sa.Table", OutboxRow.__table__)
_ledger = cast("sa.Table", LedgerRow.__table__)

#: The columns of the question the first statement reads: those of a :class:`Question`, and
#: the asker's epoch (which finds the waiting turn).
_QUESTION_COLUMNS = (*values.QUESTION_FIELDS, "asker_epoch")


def eligible(tx: Tx, req: SendRequest) -> bool:
    """Whether ``req`` may take the two statements: on PostgreSQL, an answer naming its
    question, no dedup key, and no ledger event of this transaction still buffered (its events
    keep their order)."""
    return (
        not tx.settings.is_sqlite
        and req.type is domain.MessageType.ANSWER
        and req.question_id is not None
        and req.dedup_key is None
        and not has_buffered_ledger(tx.session)
    )


def route(tx: Tx, req: SendRequest) -> Delivery | None:
    """Deliver the answer ``req`` as the blocked call's result; ``None`` when it wrote nothing
    and the general way must route it."""
    params = {
        "b_team": req.team_id,
        "b_to": req.to,
        "b_sender": req.sender,
        "b_question": req.question_id,
    }
    found = tx.session.connection().execute(_READ, params).mappings().one_or_none()
    if found is None or not _resolves(req, found):
        return None
    message = domain.Message(
        **{name: getattr(req, name) for name in values.SENT_COLUMNS},
        id=found["message_id"],
        seq=found["next_seq"],
        source_name=req.sender,
        source_agent_id=found["source_id"],
        target_agent_id=found["agent_id"],
        target_name=req.to,
        outcome=RouteOutcome.RESOLVED,
        status=MessageStatus.DELIVERED,
        consumed_turn_id=found["turn_id"],
        created_at=utcnow(),
    )
    events = _events(req, found, message)
    wake = {"question_id": req.question_id, "token": wake_token(found["deadline"])}
    outbox_id = (
        tx.session.connection()
        .execute(_WRITE, _write_params(found, message, events, wake))
        .scalar_one()
    )
    for event in events:
        log_event(event)
    tx.entries.append(
        OutboxEntry(
            id=outbox_id,
            kind=OutboxKind.WAKE_WAITER,
            agent_id=message.target_agent_id,
            epoch=found["epoch"],
            payload=wake,
        )
    )
    return Delivery(
        message_id=message.id,
        outcome=message.outcome,
        target=req.to,
        seq=message.seq,
        epoch=found["epoch"],
    )


def _resolves(req: SendRequest, found: sa.RowMapping) -> bool:
    """Whether the answer, read with its receiver and question, resolves the receiver's wait:
    a sender of the team that is not the receiver, the question open and waited on, and the
    routing table's outcome ``resolved``."""
    if found["source_id"] is None or found["source_id"] == found["agent_id"]:
        return False
    question = values.question(found)
    if (
        question.kind is not QuestionKind.ASK
        or question.status is not QuestionStatus.OPEN
        or not question.waiting
    ):
        return False
    incoming = decisions.Incoming(
        type=req.type,
        sender_id=found["source_id"],
        wake=req.wake,
        answers=question.id,
        subtype=req.subtype,
    )
    return decisions.decide(AgentState.WAITING, question, incoming) is RouteOutcome.RESOLVED


def _events(
    req: SendRequest, found: sa.RowMapping, message: domain.Message
) -> list[dict[str, Any]]:
    """The two ledger events, in the order the general way writes them."""
    about = {
        "team_id": req.team_id,
        "agent_id": message.target_agent_id,
        "message_id": message.id,
        "epoch": found["epoch"],
    }
    detail = route_detail(req, message.seq, AgentState.WAITING, AgentState.RUNNING)
    return [
        ledger_row(
            LedgerAction.QUESTION_RESOLVED, **about, question_id=req.question_id, suspended=False
        ),
        ledger_row(LedgerAction.ROUTE, **about, outcome=message.outcome, **detail),
    ]


def _write_params(
    found: sa.RowMapping,
    message: domain.Message,
    events: list[dict[str, Any]],
    wake: dict[str, Any],
) -> dict[str, Any]:
    """The second statement's parameters: the message, the tool result that renders it, the
    wake row and the ledger events."""
    tool_call_id = found["tool_call_id"]
    return {
        **{f"m_{name}": getattr(message, name) for name in _MESSAGE_PARAMS},
        "m_status": message.status,
        "b_agent": message.target_agent_id,
        "b_question": message.question_id,
        "b_now": message.created_at,
        "e_payload": {
            "role": "tool",
            "tool_call_id": tool_call_id,
            "content": formats.render(formats.envelope_of(message)),
        },
        "e_meta": formats.metadata(message),
        "e_tool_call_id": tool_call_id,
        "o_epoch": found["epoch"],
        "o_payload": wake,
        **{f"l{i}_{key}": event[key] for i, event in enumerate(events) for key in _LEDGER_KEYS},
    }


def _read_statement() -> sa.Select[Any]:
    """Lock the receiver (waiting, not suspended), then the question it asked, and read the
    sender's id, the waiting turn and the next message id."""
    agent = _agents.c
    target = (
        sa.select(
            agent.id.label("agent_id"),
            agent.epoch,
            agent.next_seq,
            live_sender_id().label("source_id"),
        )
        .where(
            agent.team_id == sa.bindparam("b_team"),
            agent.display_name == sa.bindparam("b_to"),
            agent.state == constant(AgentState.WAITING),
            agent.suspended.is_(False),
        )
        .with_for_update(key_share=True)
        # Materialized: the receiver's row is locked as the CTE is read, before the lateral
        # read of the question (the lock order of the general way: agent, then question).
        .cte("target")
        .prefix_with("MATERIALIZED")
    )
    q = _questions.c
    question = (
        sa.select(*[q[name] for name in _QUESTION_COLUMNS])
        .where(
            q.id == sa.bindparam("b_question"),
            q.asker_agent_id == target.c.agent_id,
            q.team_id == sa.bindparam("b_team"),
        )
        .with_for_update(key_share=True)
        .lateral("question")
    )
    turn = (
        sa.select(_turns.c.id)
        .where(_turns.c.agent_id == target.c.agent_id, _turns.c.epoch == question.c.asker_epoch)
        .scalar_subquery()
    )
    return sa.select(
        target,
        question,
        turn.label("turn_id"),
        sa.func.nextval(sa.func.pg_get_serial_sequence("ar_messages", "id")).label("message_id"),
    ).select_from(target.join(question, sa.true()))


#: The message's fields the second statement takes from the message value.
_MESSAGE_PARAMS = (
    *values.SENT_COLUMNS,
    *("id", "seq", "source_name", "source_agent_id", "target_agent_id"),
    *("outcome", "consumed_turn_id"),
)

_LEDGER_KEYS = (
    "team_id",
    "agent_id",
    "action",
    "outcome",
    "message_id",
    "turn_id",
    "epoch",
    "detail",
    "created_at",
)


def _typed(name: str, type_: Any) -> sa.ColumnElement[Any]:
    """A parameter of a column's type, cast to it (PostgreSQL cannot infer it in a SELECT
    list)."""
    return sa.cast(sa.bindparam(name, type_=type_), type_)


def _tool_result() -> sa.CTE:
    """The tool result at the end of the asker's transcript (the asker's row is locked: no
    other append runs meanwhile)."""
    return (
        sa.insert(_entries)
        .values(
            agent_id=sa.bindparam("b_agent"),
            position=queries.next_position(sa.bindparam("b_agent")),
            role=constant("tool"),
            payload=sa.bindparam("e_payload"),
            meta=sa.bindparam("e_meta"),
            message_id=sa.bindparam("m_id"),
            tool_call_id=sa.bindparam("e_tool_call_id"),
            turn_id=sa.bindparam("m_consumed_turn_id"),
            created_at=sa.bindparam("b_now"),
        )
        .cte("entry")
    )


def _ledger_events() -> tuple[sa.CTE, sa.CTE]:
    # The two events in two INSERTs, the second reading the first's RETURNING: the first row
    # gets its id first, so their ids keep the order the general way writes them in.
    resolved = (
        sa.insert(_ledger)
        .values({key: sa.bindparam(f"l0_{key}") for key in _LEDGER_KEYS})
        .returning(_ledger.c.id)
        .cte("resolved")
    )
    routed = (
        sa.insert(_ledger)
        .from_select(
            list(_LEDGER_KEYS),
            sa.select(
                *[_typed(f"l1_{key}", _ledger.c[key].type) for key in _LEDGER_KEYS]
            ).select_from(resolved),
        )
        .cte("routed")
    )
    return resolved, routed


def _write_statement() -> sa.Insert:
    agent, question = _agents.c, _questions.c
    moved = (
        sa.update(_agents)
        .where(agent.id == sa.bindparam("b_agent"))
        .values(
            next_seq=agent.next_seq + 1,
            state=constant(AgentState.RUNNING),
        )
        .cte("moved")
    )
    message = (
        sa.insert(_messages)
        .values(
            {name: sa.bindparam(f"m_{name}") for name in (*_MESSAGE_PARAMS, "status")}
            | {"consumed_at": sa.bindparam("b_now"), "created_at": sa.bindparam("b_now")}
        )
        .cte("message")
    )
    answered = (
        sa.update(_questions)
        .where(question.id == sa.bindparam("b_question"))
        .values(
            status=constant(QuestionStatus.ANSWERED),
            waiting=sa.false(),
            answer_message_id=sa.bindparam("m_id"),
            closed_at=sa.bindparam("b_now"),
        )
        .cte("answered")
    )
    entry = _tool_result()
    resolved, routed = _ledger_events()
    return (
        sa.insert(_outbox)
        .values(
            team_id=sa.bindparam("m_team_id"),
            agent_id=sa.bindparam("b_agent"),
            kind=constant(OutboxKind.WAKE_WAITER),
            epoch=sa.bindparam("o_epoch"),
            payload=sa.bindparam("o_payload"),
            created_at=sa.bindparam("b_now"),
            **written_published(OutboxKind.WAKE_WAITER, sa.bindparam("b_now")),
        )
        .returning(_outbox.c.id)
        .add_cte(moved, message, answered, entry, resolved, routed)
    )


#: Built once: the two statements run on the hot path of every answer.
_READ = _read_statement()
_WRITE = _write_statement()
