"""Rows to domain values, and the values the store's callers hand it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa

from agent_router.domain import (
    Agent,
    BackgroundJob,
    BudgetCheck,
    LedgerEvent,
    Message,
    MessageSubtype,
    MessageType,
    OutboxEntry,
    Question,
    TokenUsage,
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


@dataclass(frozen=True, kw_only=True)
class NewAgent:
    """An agent to add (a team's lead or a sub-agent): its role, display name (``None``:
    ``{role}_{n}``), system prompt and runner (the host's Celery task for its turns; ``None``:
    the built-in loop)."""

    role: str
    display_name: str | None = None
    system_prompt: str | None = None
    runner: str | None = None


@dataclass(frozen=True, kw_only=True)
class Ask:
    """A question a turn's agent asks ``target`` in its tool call ``tool_call_id``, open for
    ``timeout_seconds`` (``None``: the question timeout setting)."""

    target: str
    question: str
    tool_call_id: str
    subtype: MessageSubtype
    timeout_seconds: float | None = None

    def message(self, team_id: int, asker: str, question_id: int) -> SendRequest:
        """The question as the message it is routed as, from ``asker``."""
        return SendRequest(
            team_id=team_id,
            to=self.target,
            content=self.question,
            sender=asker,
            type=MessageType.ASK,
            subtype=self.subtype,
            question_id=question_id,
        )


class Claim(NamedTuple):
    """A claimed turn, whose it is, and the turn counted against the team's budgets in the
    claim's transaction (``budget.ok`` false: a budget is spent and the turn must stop); and
    what the turn reads to start, read in the same transaction: its agent, the display name of
    its team's lead, where the agent's request window last stood (its checkpoint) and the tool
    calls of its last reply still without a result."""

    record: TurnRecord
    team_id: int
    display_name: str
    budget: BudgetCheck
    agent: Agent
    lead: str
    checkpoint: dict[str, Any] | None
    open_calls: tuple[str, ...]
    #: The transition before the turn's first model call, when the claim made it too
    #: (:class:`FirstCall`), and the entries its ``rows`` follow (``None``: it read none).
    before: BeforeCall | None = None
    read: Since | None = None


class FirstCall(NamedTuple):
    """A claim (the built-in loop's) that also makes the transition before the turn's first
    model call, so that the call needs no round trip of its own: unless the turn must first
    stop (a budget spent, a stop requested) or run the open tool calls of its agent's last
    reply. It reads back the entries after ``kept`` (those before it are in the request window
    the process kept for the agent); with ``None``, all of them unless the agent has a window
    checkpoint (the window is then restored from it, which reads others)."""

    kept: Since | None


@dataclass(frozen=True, kw_only=True)
class CallUsage:
    """One model call's usage as a turn records it: the model, its tokens and cost, whether
    they were estimated, what the request left out (``context``, on the call where that
    changed), where the agent's request window then stood (``window``) and how long the call
    took (``seconds``, the ``model_call`` event's ``ms``)."""

    model: str | None
    usage: TokenUsage
    estimated: bool
    context: Mapping[str, Any] | None = None
    window: Mapping[str, Any] | None = None
    seconds: float | None = None


class Since(NamedTuple):
    """The transcript entries a turn's transition reads back: those after ``position`` (all of
    them with ``None``)."""

    position: int | None


#: A tool call's result a turn carries into its next transition: (tool call id, content, how
#: the call ran: the transcript entry's ``meta``, see :meth:`~agent_router.domain.ToolRun.meta`).
Result = tuple[str, str, dict[str, Any] | None]


@dataclass(frozen=True, kw_only=True)
class BeforeCall:
    """What a turn's transition before a model call did and read (:func:`turns.before_call`):
    ``stopped``: a stop was requested and the turn honoured it (nothing charged, nothing
    drained, ``budget`` ``None``); ``budget``: the model call's check (not ``ok``: refused,
    nothing drained); the
    messages drained into the transcript and whether more are pending (``more``: past one
    batch); the team's agents (``roster``); the transcript entries asked for (``rows``, with
    their positions; ``None`` when none were asked for)."""

    stopped: bool = False
    budget: BudgetCheck | None
    messages: list[Message]
    more: bool = False
    roster: list[Agent]
    rows: list[tuple[int, dict[str, Any]]] | None = None


@dataclass(frozen=True, kw_only=True)
class AfterCall:
    """What a turn's transition after a model call did and read (:func:`turns.after_call`):
    ``stopped``: a stop was requested, the call's usage is recorded, the reply is not appended
    and the turn honoured the stop; ``budget``: the check of the usage recorded (``None``: no
    usage given); ``questions``: the open questions asked of the agent (with the asker's name)
    when the reply called no tool (the turn is about to end), else empty."""

    stopped: bool = False
    budget: BudgetCheck | None
    questions: list[Question]


def _columns(cls: type[Any], *, but: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The fields of the value class ``cls`` that its row holds in columns of the same names
    (all of them but those in ``but``, which the caller supplies)."""
    return tuple(f.name for f in fields(cls) if f.name not in but)


#: The fields of a send that its message row holds under the same names.
SENT_COLUMNS = _columns(SendRequest, but=("to", "sender"))
_LEDGER_FIELDS = _columns(LedgerEvent, but=("agent_name", "detail"))
AGENT_FIELDS = _columns(Agent, but=("mailbox_depth",))
#: The columns a :class:`Message` is made of (all its fields but the target's name).
MESSAGE_FIELDS = _columns(Message, but=("target_name",))
_OUTBOX_FIELDS = _columns(OutboxEntry)
#: The columns a :class:`TurnRecord` is made of.
TURN_FIELDS = _columns(TurnRecord)
#: A question's asker and target names are not columns: the Router's reads fill them.
QUESTION_FIELDS = _columns(Question, but=("asker", "target"))
JOB_FIELDS = _columns(BackgroundJob)


def _read(row: object, names: tuple[str, ...]) -> dict[str, Any]:
    """The values of the columns ``names`` of an ORM row."""
    return {name: getattr(row, name) for name in names}


def ledger_event(r: LedgerRow, name: str | None) -> LedgerEvent:
    return LedgerEvent(**_read(r, _LEDGER_FIELDS), agent_name=name, detail=dict(r.detail or {}))


def agent(row: AgentRow, mailbox_depth: int = 0) -> Agent:
    return Agent(**_read(row, AGENT_FIELDS), mailbox_depth=mailbox_depth)


def message(row: MessageRow | sa.RowMapping, target_name: str, **overrides: Any) -> Message:
    """A :class:`Message` from an ORM row or a Core row mapping (the drain's set-based path)."""
    if isinstance(row, MessageRow):
        values = _read(row, MESSAGE_FIELDS)
    else:
        values = {name: row[name] for name in MESSAGE_FIELDS}
    return Message(**(values | {"target_name": target_name} | overrides))


def outbox_entry(row: OutboxRow) -> OutboxEntry:
    return OutboxEntry(**_read(row, _OUTBOX_FIELDS))


def turn(row: TurnRow | Mapping[str, Any]) -> TurnRecord:
    """A :class:`TurnRecord` from an ORM row or a row by its column names."""
    if isinstance(row, TurnRow):
        return TurnRecord(**_read(row, TURN_FIELDS))
    return TurnRecord(**{name: row[name] for name in TURN_FIELDS})


def question(row: QuestionRow | sa.RowMapping) -> Question:
    """A :class:`Question` from an ORM row or a Core row mapping with the same column names."""
    if isinstance(row, QuestionRow):
        return Question(**_read(row, QUESTION_FIELDS))
    return Question(**{name: row[name] for name in QUESTION_FIELDS})


def job(row: BackgroundJobRow) -> BackgroundJob:
    return BackgroundJob(**_read(row, JOB_FIELDS))


@dataclass(frozen=True, kw_only=True)
class Scheduled:
    """An agent ``scheduled`` for longer than a delivery window, and its turn task's publishes
    in the current epoch."""

    agent_id: int
    team_id: int
    epoch: int
    runner: str | None  # the host's task (``name@queue``), or None: the built-in loop's
    sent: int  # enqueue rows of the epoch
    unpublished: int  # of them, not yet published (the outbox re-publisher's)
    last_published: datetime | None


@dataclass(frozen=True, kw_only=True)
class Deletion:
    """What a delete or a prune removed (with ``dry_run``: would remove)."""

    teams: tuple[int, ...] = ()
    rows: dict[str, int] = field(default_factory=dict)  # table name -> rows
    questions: tuple[int, ...] = ()  # their wake keys go too
    dry_run: bool = False
    owed: dict[str, int] = field(default_factory=dict)  # owed rows dropped, by kind (OWED)
    kept: tuple[int, ...] = ()  # teams a prune left: they owe something, or a send reached them

    @property
    def total(self) -> int:
        return sum(self.rows.values())
