"""Rows to domain values, and the values the store's callers hand it."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import sqlalchemy as sa

from agent_router.domain import (
    Agent,
    BackgroundJob,
    LedgerEvent,
    Message,
    MessageSubtype,
    MessageType,
    OutboxEntry,
    Question,
    TurnRecord,
)
from agent_router.store.models import (
    AgentRow,
    BackgroundJobRow,
    LedgerRow,
    MessageRow,
    OutboxRow,
    QuestionRow,
    TurnRow,
)


@dataclass(frozen=True, kw_only=True)
class SendRequest:
    team_id: int
    to: str
    content: str
    sender: str
    type: MessageType
    subtype: MessageSubtype | None = None
    question_id: int | None = None
    wake: bool = True
    dedup_key: str | None = None


class Claim(NamedTuple):
    """A claimed turn and whose it is."""

    record: TurnRecord
    team_id: int
    display_name: str


def ledger_event(r: LedgerRow, name: str | None) -> LedgerEvent:
    return LedgerEvent(
        id=r.id,
        team_id=r.team_id,
        agent_id=r.agent_id,
        agent_name=name,
        action=r.action,
        outcome=r.outcome,
        message_id=r.message_id,
        turn_id=r.turn_id,
        epoch=r.epoch,
        detail=dict(r.detail or {}),
        created_at=r.created_at,
    )


def agent(row: AgentRow, mailbox_depth: int = 0) -> Agent:
    return Agent(
        id=row.id,
        team_id=row.team_id,
        display_name=row.display_name,
        role=row.role,
        is_lead=row.is_lead,
        state=row.state,
        suspended=row.suspended,
        epoch=row.epoch,
        pending_trigger=row.pending_trigger,
        mailbox_depth=mailbox_depth,
        stop_requested=row.stop_requested,
        runner=row.runner,
    )


#: The columns a :class:`Message` is made of (all its fields but the target's name).
_MESSAGE_FIELDS = tuple(f.name for f in fields(Message) if f.name != "target_name")


def message(row: MessageRow | sa.RowMapping, target_name: str, **overrides: Any) -> Message:
    """A :class:`Message` from an ORM row or a Core row mapping (the drain's set-based path)."""
    if isinstance(row, MessageRow):
        values = {name: getattr(row, name) for name in _MESSAGE_FIELDS}
    else:
        values = {name: row[name] for name in _MESSAGE_FIELDS}
    return Message(**(values | {"target_name": target_name} | overrides))


def outbox_entry(row: OutboxRow) -> OutboxEntry:
    return OutboxEntry(
        id=row.id, kind=row.kind, agent_id=row.agent_id, epoch=row.epoch, payload=row.payload
    )


def turn(row: TurnRow) -> TurnRecord:
    return TurnRecord(
        id=row.id,
        agent_id=row.agent_id,
        epoch=row.epoch,
        trigger=row.trigger,
        status=row.status,
        started_at=row.started_at,
        ended_at=row.ended_at,
    )


def question(row: QuestionRow) -> Question:
    return Question(
        id=row.id,
        team_id=row.team_id,
        asker_agent_id=row.asker_agent_id,
        target_agent_id=row.target_agent_id,
        tool_call_id=row.tool_call_id,
        status=row.status,
        waiting=row.waiting,
        deadline=row.deadline,
        answer_message_id=row.answer_message_id,
        kind=row.kind,
    )


def job(row: BackgroundJobRow) -> BackgroundJob:
    return BackgroundJob(
        id=row.id,
        team_id=row.team_id,
        agent_id=row.agent_id,
        name=row.name,
        task_id=row.task_id,
        status=row.status,
        created_at=row.created_at,
        finished_at=row.finished_at,
        result=row.result,
        notice_message_id=row.notice_message_id,
    )
