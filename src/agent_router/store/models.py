"""SQLAlchemy 2 typed models. Only :mod:`agent_router.store` queries them."""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from agent_router import limits
from agent_router.domain import (
    AgentState,
    BudgetName,
    JobStatus,
    LedgerAction,
    MessageStatus,
    MessageSubtype,
    MessageType,
    OutboxKind,
    QuestionKind,
    QuestionStatus,
    RouteOutcome,
    SweepStep,
    TurnStatus,
    TurnTrigger,
    UserMessageKind,
)


def utcnow() -> datetime:
    """Naive UTC: SQLite keeps no zone, so both backends store the same thing."""
    return datetime.now(UTC).replace(tzinfo=None)


def _enum(cls: type[enum.Enum], name: str) -> sa.Enum:
    return sa.Enum(
        cls,
        name=name,
        values_callable=lambda members: [m.value for m in members],
        create_constraint=True,
        validate_strings=True,
    )


# One instance per enum type: PostgreSQL creates each named type once.
AgentStateType = _enum(AgentState, "ar_agent_state")
TurnTriggerType = _enum(TurnTrigger, "ar_turn_trigger")
MessageTypeType = _enum(MessageType, "ar_message_type")
MessageSubtypeType = _enum(MessageSubtype, "ar_message_subtype")
RouteOutcomeType = _enum(RouteOutcome, "ar_route_outcome")
MessageStatusType = _enum(MessageStatus, "ar_message_status")
QuestionStatusType = _enum(QuestionStatus, "ar_question_status")
QuestionKindType = _enum(QuestionKind, "ar_question_kind")
TurnStatusType = _enum(TurnStatus, "ar_turn_status")
OutboxKindType = _enum(OutboxKind, "ar_outbox_kind")
LedgerActionType = _enum(LedgerAction, "ar_ledger_action")
JobStatusType = _enum(JobStatus, "ar_job_status")
BudgetNameType = _enum(BudgetName, "ar_budget_name")
SweepStepType = _enum(SweepStep, "ar_sweep_step")
UserMessageKindType = _enum(UserMessageKind, "ar_user_message_kind")

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")
# The columns values from outside reach are built from agent_router.limits, which the boundary
# checks against: a column and its check are one declaration.
_LIMIT = limits.BUDGET_LIMITS
BigId = limits.ID


#: The table options of every table whose ``id`` the database gives: on SQLite, AUTOINCREMENT,
#: so an id is never given twice. Without it SQLite gives the largest id present plus one, the
#: id of a row deleted last; a deleted team's ledger events would name the next team, and a
#: host that drops a repeated delivery by its id would drop a new message to the user.
#: PostgreSQL's sequences never give an id twice, and ignore the option.
SQLITE_IDS: dict[str, Any] = {"sqlite_autoincrement": True}


def of_agent(column: str) -> sa.ForeignKeyConstraint:
    """The foreign key of ``column`` and ``team_id`` on the agent's ``(id, team_id)``: the row
    names an agent that exists and that agent's own team, in one check on the agent's row. The
    writers of the hot paths hold that row locked already; a foreign key on ``ar_teams`` would
    lock the team's one row from every concurrent writer of the team instead."""
    return sa.ForeignKeyConstraint([column, "team_id"], ["ar_agents.id", "ar_agents.team_id"])


class Base(DeclarativeBase):
    # Every plain integer column is 32 bits on both databases (limits.COUNTER checks writes).
    type_annotation_map = {int: limits.COUNTER}
    metadata = sa.MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class TeamRow(Base):
    __tablename__ = "ar_teams"
    __table_args__ = (SQLITE_IDS,)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # The model the team's agents run on; NULL: each role's, else the worker's setting.
    model: Mapped[str | None] = mapped_column(sa.String(200), default=None)
    # The host's Celery task (``name`` or ``name@queue``) that receives the team's messages to
    # the user, published through the outbox; NULL: the host reads them.
    user_task: Mapped[str | None] = mapped_column(limits.RUNNER, default=None)


#: How full PostgreSQL fills a page of ar_agents on insert (percent): the rest is left to the
#: updates of the rows in it.
AGENTS_FILLFACTOR = 50


class AgentRow(Base):
    __tablename__ = "ar_agents"
    __table_args__ = (
        sa.UniqueConstraint("team_id", "display_name", name="uq_ar_agents_team_display_name"),
        # What the rows of an agent refer to (of_agent).
        sa.Index("ix_ar_agents_id_team", "id", "team_id", unique=True),
        # The sweeper's scan for agents left scheduled.
        sa.Index("ix_ar_agents_state_scheduled", "state", "scheduled_at"),
        SQLITE_IDS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    team_id: Mapped[int] = mapped_column(sa.ForeignKey("ar_teams.id"), index=True)
    display_name: Mapped[str] = mapped_column(limits.NAME)
    role: Mapped[str] = mapped_column(limits.NAME)
    is_lead: Mapped[bool] = mapped_column(default=False)
    state: Mapped[AgentState] = mapped_column(AgentStateType)
    # A waiting agent either blocks in a worker (False) or holds no worker (True).
    suspended: Mapped[bool] = mapped_column(default=False)
    epoch: Mapped[int] = mapped_column(default=0)
    pending_trigger: Mapped[TurnTrigger | None] = mapped_column(TurnTriggerType)
    # Next per-target sequence number; bumped under the agent's row lock.
    next_seq: Mapped[int] = mapped_column(default=1)
    # The position of the next entry of the agent's transcript; bumped under the agent's row
    # lock by every append, so a writer that holds the lock reads the free position here.
    next_position: Mapped[int] = mapped_column(default=0, server_default="0")
    system_prompt: Mapped[str | None] = mapped_column(sa.Text)
    # The lead asked a running turn to stop; the turn honours it at its next boundary.
    stop_requested: Mapped[bool] = mapped_column(default=False)
    scheduled_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # The Celery task (``name`` or ``name@queue``) that runs this agent's turns when a host owns
    # them; NULL: the built-in loop (``agent_router.run_agent_turn``).
    runner: Mapped[str | None] = mapped_column(limits.RUNNER)
    # Where the built-in loop's request window stood when what it leaves out last moved (its
    # cut, the entries before it every request keeps): a process that has not kept the window
    # builds it again from here and the entries from the cut on, not from the whole transcript.
    context_window: Mapped[dict[str, Any] | None] = mapped_column(JSONType)


class MessageRow(Base):
    __tablename__ = "ar_messages"
    __table_args__ = (
        sa.UniqueConstraint("target_agent_id", "seq", name="uq_ar_messages_target_seq"),
        sa.UniqueConstraint("target_agent_id", "dedup_key", name="uq_ar_messages_target_dedup"),
        sa.Index("ix_ar_messages_mailbox", "target_agent_id", "status", "seq"),
        of_agent("source_agent_id"),
        of_agent("target_agent_id"),
        SQLITE_IDS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    team_id: Mapped[int] = mapped_column(BigId, index=True)
    seq: Mapped[int]
    source_name: Mapped[str] = mapped_column(limits.NAME)
    source_agent_id: Mapped[int | None] = mapped_column(BigId)
    target_agent_id: Mapped[int] = mapped_column(BigId)
    type: Mapped[MessageType] = mapped_column(MessageTypeType)
    subtype: Mapped[MessageSubtype | None] = mapped_column(MessageSubtypeType)
    content: Mapped[str] = mapped_column(sa.Text)
    # The content as it appears inside the router's envelope (formats.escape), written when the
    # message is accepted where the two differ; NULL: the content itself.
    body: Mapped[str | None] = mapped_column(sa.Text)
    question_id: Mapped[int | None] = mapped_column(sa.ForeignKey("ar_questions.id"))
    wake: Mapped[bool] = mapped_column(default=True)
    dedup_key: Mapped[str | None] = mapped_column(limits.KEY)
    outcome: Mapped[RouteOutcome] = mapped_column(RouteOutcomeType)
    status: Mapped[MessageStatus] = mapped_column(MessageStatusType)
    consumed_turn_id: Mapped[int | None] = mapped_column(sa.ForeignKey("ar_turns.id"))
    consumed_at: Mapped[datetime | None]
    drop_reason: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class UserMessageRow(Base):
    """A message to the user. Every one of a team is written under its lead's row lock (the
    lead's own, or a sub-agent's after the lead's, in id order), so a team's ids are in
    commit order: a reader that reads on from the last id it saw misses none."""

    __tablename__ = "ar_user_messages"
    __table_args__ = (
        sa.UniqueConstraint("team_id", "dedup_key", name="uq_ar_user_messages_team_dedup"),
        sa.Index("ix_ar_user_messages_team_id", "team_id", "id"),
        of_agent("agent_id"),
        SQLITE_IDS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    team_id: Mapped[int] = mapped_column(BigId)
    agent_id: Mapped[int] = mapped_column(BigId)  # who wrote it
    kind: Mapped[UserMessageKind] = mapped_column(UserMessageKindType)
    content: Mapped[str] = mapped_column(sa.Text)
    question_id: Mapped[int | None] = mapped_column(BigId)
    turn_id: Mapped[int | None] = mapped_column(BigId)
    # The writer's key: a retried write (a continuation running its call again, a retried
    # end of turn) finds the first and writes nothing.
    dedup_key: Mapped[str | None] = mapped_column(limits.KEY)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class QuestionRow(Base):
    __tablename__ = "ar_questions"
    __table_args__ = (
        # The sweeper's scan for open questions past their deadline.
        sa.Index("ix_ar_questions_status_deadline", "status", "deadline"),
        of_agent("asker_agent_id"),
        of_agent("target_agent_id"),
        SQLITE_IDS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    team_id: Mapped[int] = mapped_column(BigId, index=True)
    asker_agent_id: Mapped[int] = mapped_column(BigId, index=True)
    target_agent_id: Mapped[int] = mapped_column(BigId)
    tool_call_id: Mapped[str] = mapped_column(limits.KEY)
    asker_epoch: Mapped[int]
    status: Mapped[QuestionStatus] = mapped_column(QuestionStatusType)
    kind: Mapped[QuestionKind] = mapped_column(QuestionKindType, default=QuestionKind.ASK)
    # The asker is still blocked on this question: an edge of the team's waits-for graph.
    waiting: Mapped[bool] = mapped_column(default=True)
    answer_message_id: Mapped[int | None] = mapped_column(BigId)
    deadline: Mapped[datetime]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    closed_at: Mapped[datetime | None]


class TurnRow(Base):
    __tablename__ = "ar_turns"
    # One claim per epoch: the database itself refuses a second turn for the same fence.
    # The sweeper's scan for running turns whose lease ran out.
    __table_args__ = (
        sa.UniqueConstraint("agent_id", "epoch", name="uq_ar_turns_agent_epoch"),
        sa.Index("ix_ar_turns_status_lease", "status", "lease_expires_at"),
        of_agent("agent_id"),
        SQLITE_IDS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    team_id: Mapped[int] = mapped_column(BigId, index=True)
    agent_id: Mapped[int] = mapped_column(BigId)
    epoch: Mapped[int]
    trigger: Mapped[TurnTrigger] = mapped_column(TurnTriggerType)
    status: Mapped[TurnStatus] = mapped_column(TurnStatusType)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None]
    lease_expires_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(sa.Text)


class TranscriptEntryRow(Base):
    __tablename__ = "ar_transcript_entries"
    __table_args__ = (
        sa.UniqueConstraint("agent_id", "position", name="uq_ar_transcript_agent_position"),
        SQLITE_IDS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    agent_id: Mapped[int] = mapped_column(sa.ForeignKey("ar_agents.id"))
    position: Mapped[int]
    role: Mapped[str] = mapped_column(sa.String(20))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONType)
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # A message enters a transcript at most once: the database refuses a second copy.
    message_id: Mapped[int | None] = mapped_column(sa.ForeignKey("ar_messages.id"), unique=True)
    tool_call_id: Mapped[str | None] = mapped_column(limits.KEY)
    turn_id: Mapped[int | None] = mapped_column(sa.ForeignKey("ar_turns.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class OutboxRow(Base):
    __tablename__ = "ar_outbox"
    __table_args__ = (
        sa.Index("ix_ar_outbox_unpublished", "published_at", "id"),
        # The sweeper's check of an agent's turn tasks of one epoch.
        sa.Index("ix_ar_outbox_agent_epoch", "agent_id", "epoch"),
        of_agent("agent_id"),
        SQLITE_IDS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    team_id: Mapped[int] = mapped_column(BigId, index=True)
    agent_id: Mapped[int] = mapped_column(BigId)
    kind: Mapped[OutboxKind] = mapped_column(OutboxKindType)
    epoch: Mapped[int]
    payload: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    published_at: Mapped[datetime | None]
    attempts: Mapped[int] = mapped_column(default=0)
    # When a sweeper last took the row to publish it again (concurrent sweepers skip it).
    attempted_at: Mapped[datetime | None]


class BackgroundJobRow(Base):
    __tablename__ = "ar_background_jobs"
    __table_args__ = (
        # The poller's scan: jobs still running, oldest first.
        sa.Index("ix_ar_background_jobs_status", "status", "created_at"),
        of_agent("agent_id"),
        SQLITE_IDS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    team_id: Mapped[int] = mapped_column(BigId, index=True)
    agent_id: Mapped[int] = mapped_column(BigId)
    name: Mapped[str] = mapped_column(limits.NAME)
    task_id: Mapped[str] = mapped_column(limits.KEY, unique=True)
    status: Mapped[JobStatus] = mapped_column(JobStatusType)
    result: Mapped[str | None] = mapped_column(sa.Text)
    # The notice that told the agent; set once, under the job's row lock.
    notice_message_id: Mapped[int | None] = mapped_column(BigId)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]


class LedgerRow(Base):
    __tablename__ = "ar_ledger"
    # An event of an agent names it and its team; an event of a team alone (a refusal, a
    # budget's) is written only after its team was read, and a refusal of an unknown team
    # names none.
    __table_args__ = (
        of_agent("agent_id"),
        # A team's events in time order: the timeline's windows and its latest event read a
        # range of it, whatever the size of the team's history.
        sa.Index("ix_ar_ledger_team_time", "team_id", "created_at", "id"),
        SQLITE_IDS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    team_id: Mapped[int | None] = mapped_column(BigId)
    agent_id: Mapped[int | None] = mapped_column(BigId)
    action: Mapped[LedgerAction] = mapped_column(LedgerActionType)
    outcome: Mapped[RouteOutcome | None] = mapped_column(RouteOutcomeType)
    message_id: Mapped[int | None] = mapped_column(BigId)
    turn_id: Mapped[int | None] = mapped_column(BigId)
    epoch: Mapped[int | None]
    detail: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class BudgetRow(Base):
    """A team's budgets: limits (NULL: unlimited) and usage, in one row that every check locks
    or updates with a guard, so that all workers of the team share it."""

    __tablename__ = "ar_budgets"

    team_id: Mapped[int] = mapped_column(sa.ForeignKey("ar_teams.id"), primary_key=True)
    max_model_calls: Mapped[int | None] = mapped_column(_LIMIT[BudgetName.MODEL_CALLS])
    max_turns: Mapped[int | None] = mapped_column(_LIMIT[BudgetName.TURNS])
    max_tokens: Mapped[int | None] = mapped_column(_LIMIT[BudgetName.TOKENS])
    max_cost_nano: Mapped[int | None] = mapped_column(_LIMIT[BudgetName.COST])  # 1e-9 USD
    max_wall_seconds: Mapped[float | None] = mapped_column(_LIMIT[BudgetName.WALL_SECONDS])
    max_sub_agents_created: Mapped[int | None] = mapped_column(
        _LIMIT[BudgetName.SUB_AGENTS_CREATED]
    )
    max_sub_agents_active: Mapped[int | None] = mapped_column(_LIMIT[BudgetName.SUB_AGENTS_ACTIVE])
    model_calls: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    turns: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    prompt_tokens: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    cost_nano: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    deadline_at: Mapped[datetime | None]  # started_at + max_wall_seconds
    warned: Mapped[bool] = mapped_column(default=False)
    exhausted: Mapped[BudgetName | None] = mapped_column(BudgetNameType)


class ModelCallRow(Base):
    """One model call's usage, per turn (and so per agent and team)."""

    __tablename__ = "ar_model_calls"
    __table_args__ = (of_agent("agent_id"), SQLITE_IDS)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    team_id: Mapped[int] = mapped_column(BigId, index=True)
    agent_id: Mapped[int] = mapped_column(BigId, index=True)
    turn_id: Mapped[int | None] = mapped_column(BigId)
    model: Mapped[str | None] = mapped_column(limits.NAME)
    prompt_tokens: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    cost_nano: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    estimated: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class QuarantineRow(Base):
    """An agent a sweeper step kept failing for (one row per agent): the passes leave it alone
    until ``until``, then try again; a step that succeeds for it deletes the row."""

    __tablename__ = "ar_quarantine"
    __table_args__ = (
        of_agent("agent_id"),
        # The passes' read of the agents to leave alone, and check's of a team's.
        sa.Index("ix_ar_quarantine_until", "until"),
    )

    agent_id: Mapped[int] = mapped_column(BigId, primary_key=True)
    team_id: Mapped[int] = mapped_column(BigId, index=True)
    step: Mapped[SweepStep] = mapped_column(SweepStepType)
    failures: Mapped[int]
    error: Mapped[str] = mapped_column(sa.Text)
    first_failed_at: Mapped[datetime]
    last_failed_at: Mapped[datetime]
    until: Mapped[datetime]


class InstallationRow(Base):
    """The database's installation id, one row written when the schema is made (by migration
    0015 or :meth:`~agent_router.store.store.Store.create_schema`) and never changed: it names
    the database's Redis channels and wake keys (:mod:`agent_router.constants`), so that
    deployments sharing a Redis server never hear each other's signals."""

    __tablename__ = "ar_installation"

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


def new_installation_id() -> str:
    """A random installation id (128 bits, as 32 hexadecimal digits)."""
    return uuid.uuid4().hex
