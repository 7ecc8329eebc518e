"""The nouns of the router: states, outcomes, message kinds, and the frozen values that cross
the store boundary. ORM rows never leave :mod:`agent_router.store`; these do."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

LEAD_DISPLAY_NAME = "Team Leader"
LEAD_ROLE = "Team Leader"


class AgentState(enum.StrEnum):
    """Where an agent is in its life; the router picks a delivery from it."""

    IDLE = "idle"  # created, never ran (or stopped): a wake message starts a turn
    SCHEDULED = "scheduled"  # a turn task for the current epoch is enqueued, not yet claimed
    RUNNING = "running"  # a turn holds the agent and may call the model
    WAITING = "waiting"  # blocked in an ask-style tool call (in a worker, or suspended)
    COMPLETED = "completed"  # the last turn ended naturally; context kept
    TERMINATED = "terminated"  # final: sends are refused, pending messages dropped


#: States in which a wake message starts a new turn.
RESTING_STATES = frozenset({AgentState.IDLE, AgentState.COMPLETED})
#: States in which a turn owns the agent (it may write its transcript).
TURN_STATES = frozenset({AgentState.RUNNING, AgentState.WAITING})
#: States in which no repair of the sweeper applies to an agent (nothing runs or is scheduled).
TERMINATED_AND_RESTING = frozenset({*RESTING_STATES, AgentState.TERMINATED})


class RouteOutcome(enum.StrEnum):
    """How one accepted (or refused) message reached its receiver."""

    RESOLVED = "resolved"  # became the result of the tool call the receiver is blocked in
    INJECTED_INLINE = "injected_inline"  # receiver running: drained before its next model call
    COALESCED = "coalesced"  # a turn is already scheduled: drained when it starts
    TRIGGERED_NEW_TURN = "triggered_new_turn"  # receiver resting: exactly one turn enqueued
    QUEUED = "queued"  # context-only notice (wake=False): seen at the next turn
    REJECTED = "rejected"  # refused with a typed error; nothing written but a ledger event


class MessageType(enum.StrEnum):
    TASK = "task"
    OUTPUT = "output"
    ASK = "ask"
    ANSWER = "answer"
    MESSAGE = "message"
    NOTICE = "notice"


class MessageSubtype(enum.StrEnum):
    PROGRESS_OUTPUT = "progress_output"
    COMPLETION_REPORT = "completion_report"
    ASK_MASTER = "ask_master"
    ASK_OTHER = "ask_other"


class MessageStatus(enum.StrEnum):
    PENDING = "pending"  # in the target's mailbox
    DELIVERED = "delivered"  # in the target's transcript (drained, or as a tool result)
    DROPPED = "dropped"  # target terminated; drop_reason says why


class QuestionStatus(enum.StrEnum):
    OPEN = "open"
    ANSWERED = "answered"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class QuestionKind(enum.StrEnum):
    """What ends a wait: an answer to a question, or the next output of the waited-on agent."""

    ASK = "ask"  # ask_master / ask_other_agent: the asked agent's answer (or message) ends it
    OUTPUT = "output"  # wait_sub_agent_output: only the target's report (not progress) ends it
    USER = "user"  # ask_user: the user's answer (or any message of the user's) ends it


#: Question states that can no longer take an answer.
CLOSED_QUESTION_STATUSES = frozenset(
    {QuestionStatus.ANSWERED, QuestionStatus.EXPIRED, QuestionStatus.CANCELLED}
)


class TurnTrigger(enum.StrEnum):
    NEW = "new"  # a message woke a resting agent
    FOLLOW_UP = "follow_up"  # the end-of-turn hook found wake messages pending
    CONTINUATION = "continuation"  # a suspended ask was answered
    RECOVERY = "recovery"  # the previous turn's worker died and its lease expired


class TurnStatus(enum.StrEnum):
    RUNNING = "running"
    ENDED = "ended"  # ended naturally (reply without tool calls)
    FAILED = "failed"  # the loop raised; the hook still ran
    SUSPENDED = "suspended"  # ended while its ask stays open; a continuation resumes it
    FENCED = "fenced"  # superseded by a newer epoch; can write nothing
    STOPPED = "stopped"  # cooperative stop


class OutboxKind(enum.StrEnum):
    ENQUEUE_TURN = "enqueue_turn"  # publish run_agent_turn(agent_id, epoch)
    WAKE_WAITER = "wake_waiter"  # push to the blocked asker's result key
    DELIVER_USER = "deliver_user"  # a message to the user: publish the host's user task


class LedgerAction(enum.StrEnum):
    TEAM_CREATED = "team_created"
    AGENT_CREATED = "agent_created"
    ROUTE = "route"
    SEND_REJECTED = "send_rejected"
    DUPLICATE_SEND = "duplicate_send"
    TURN_CLAIMED = "turn_claimed"
    CLAIM_REFUSED = "claim_refused"
    DRAIN = "drain"
    TURN_ENDED = "turn_ended"
    FOLLOW_UP = "follow_up"
    ASK = "ask"
    ASK_REFUSED = "ask_refused"
    QUESTION_RESOLVED = "question_resolved"
    TAKE_OVER = "take_over"
    STALE_WRITE_REFUSED = "stale_write_refused"
    SYNTHETIC_TOOL_RESULT = "synthetic_tool_result"
    OUTBOX_PUBLISHED = "outbox_published"
    TERMINATED = "terminated"
    MESSAGE_DROPPED = "message_dropped"
    QUESTION_CANCELLED = "question_cancelled"
    QUESTION_EXPIRED = "question_expired"
    REENQUEUED = "reenqueued"
    JOB_STARTED = "job_started"  # a background job was started on an agent's behalf
    JOB_FINISHED = "job_finished"  # its completion was routed to the agent as a notice
    WAIT_OUTPUT = "wait_output"  # the lead blocks on a sub-agent's next output
    STOP_REQUESTED = "stop_requested"  # a running turn will stop at its next boundary
    STOPPED = "stopped"  # cooperative stop done: open calls cancelled, agent idle
    MODEL_CALL = "model_call"  # one model call: its tokens and cost, counted against the budget
    BUDGET_WARNING = "budget_warning"  # a team budget passed its warning threshold (once)
    BUDGET_EXHAUSTED = "budget_exhausted"  # a team budget is spent: the team stops
    BUDGET_REFUSED = "budget_refused"  # a sub-agent was not created: a sub-agent budget is full
    BUDGET_CHANGED = "budget_changed"  # an operator set a team's limits (the team may go on)
    SWEEP_FAILED = "sweep_failed"  # a sweeper step failed for one agent; the pass went on
    QUARANTINED = "quarantined"  # an agent kept failing sweeper steps: left alone, with backoff
    QUARANTINE_LIFTED = "quarantine_lifted"  # a step succeeded again, or nothing is left to do
    OWED_DROPPED = "owed_dropped"  # a prune or a deletion dropped rows still owed, when asked to
    USER_MESSAGE = "user_message"  # an agent told the user something (answer, progress, question)


class UserMessageKind(enum.StrEnum):
    """What a message to the user is."""

    ANSWER = "answer"  # the lead's final reply of a turn
    PROGRESS = "progress"  # a note while the team works (tell_user)
    QUESTION = "question"  # ask_user: the lead waits for the user's reply


class SweepStep(enum.StrEnum):
    """A repair of a sweeper pass, done for one agent at a time (a bulkhead each)."""

    REPUBLISH = "republish"  # publish an outbox row again
    TAKE_OVER = "take_over"  # fence a turn whose lease ran out, schedule its recovery
    REENQUEUE = "reenqueue"  # enqueue again a turn whose task was lost
    EXPIRE = "expire"  # close a question past its deadline
    POLL_JOB = "poll_job"  # report a background job whose completion callback was lost


@dataclass(frozen=True, kw_only=True)
class Agent:
    id: int
    team_id: int
    display_name: str
    role: str
    is_lead: bool
    state: AgentState
    suspended: bool
    epoch: int
    pending_trigger: TurnTrigger | None
    mailbox_depth: int = 0
    stop_requested: bool = False
    #: The Celery task (``name`` or ``name@queue``) that runs this agent's turns when a host owns
    #: them; ``None``: the built-in loop.
    runner: str | None = None


@dataclass(frozen=True, kw_only=True)
class Team:
    id: int
    lead: Agent
    created_at: datetime
    #: The model every agent of the team runs on (its turns in the built-in loop), whatever
    #: its role names; ``None``: the role's model, else ``Settings.openai_model``.
    model: str | None = None
    #: The host's Celery task (``name`` or ``name@queue``) that receives the team's messages to
    #: the user; ``None``: the host reads them (``Router.user_messages``, ``Router.events``).
    user_task: str | None = None


@dataclass(frozen=True, kw_only=True)
class UserMessage:
    """A message to the user: ``id`` orders a team's messages to the user and is what a host
    drops a repeated delivery by."""

    id: int
    team_id: int
    sender: str  # the display name of the agent that wrote it
    kind: UserMessageKind
    content: str
    question_id: int | None  # a question's: what ``Router.answer`` takes
    created_at: datetime

    def as_payload(self) -> dict[str, Any]:
        """The JSON form a host's task receives and a feed sends."""
        return {
            "id": self.id,
            "team_id": self.team_id,
            "sender": self.sender,
            "kind": self.kind.value,
            "content": self.content,
            "question_id": self.question_id,
            "created_at": self.created_at.isoformat(),
        }


@dataclass(frozen=True, kw_only=True)
class Delta:
    """A piece of a reply's text as a streamed model call writes it: ``stream`` names the
    call (one per model call), ``seq`` counts its pieces from 0."""

    stream: str
    seq: int
    text: str


@dataclass(frozen=True, kw_only=True)
class FeedItem:
    """One entry of a team's live feed (:meth:`Router.events`): ``cursor`` is what to pass as
    ``after`` to read on from it. ``kind``: ``user`` (a message from the user to the lead),
    a :class:`UserMessageKind` value (a message to the user), ``event`` (another event of
    the lead's, ``action`` its ledger action), or ``delta`` (a piece of a reply the agent
    ``sender`` is writing: ``stream`` and ``seq`` as its :class:`Delta`; never stored, its
    ``cursor`` the reader's own, so reading on from it misses nothing)."""

    cursor: int
    kind: str
    action: str
    sender: str | None
    content: str | None
    question_id: int | None
    message_id: int | None
    created_at: datetime
    stream: str | None = None
    seq: int | None = None

    def as_payload(self) -> dict[str, Any]:
        payload = {
            "cursor": self.cursor,
            "kind": self.kind,
            "action": self.action,
            "sender": self.sender,
            "content": self.content,
            "question_id": self.question_id,
            "message_id": self.message_id,
            "created_at": self.created_at.isoformat(),
        }
        if self.stream is not None:
            payload |= {"stream": self.stream, "seq": self.seq}
        return payload


@dataclass(frozen=True, kw_only=True)
class Message:
    id: int
    team_id: int
    seq: int
    source_name: str
    source_agent_id: int | None
    target_agent_id: int
    target_name: str
    type: MessageType
    subtype: MessageSubtype | None
    content: str
    question_id: int | None
    wake: bool
    dedup_key: str | None
    created_at: datetime
    outcome: RouteOutcome
    status: MessageStatus
    consumed_turn_id: int | None = None
    drop_reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class Delivery:
    """What :meth:`Router.send` returns once the message is committed."""

    message_id: int
    outcome: RouteOutcome
    target: str
    seq: int
    epoch: int
    duplicate: bool = False  # a retried send with the same dedup_key: this is the first delivery


@dataclass(frozen=True, kw_only=True)
class Question:
    id: int
    team_id: int
    asker_agent_id: int
    target_agent_id: int
    tool_call_id: str
    status: QuestionStatus
    waiting: bool  # the asker is still blocked on it (a waits-for edge)
    deadline: datetime
    answer_message_id: int | None = None
    kind: QuestionKind = QuestionKind.ASK
    #: Display names of the asker and of the agent asked (filled by the Router's reads).
    asker: str = ""
    target: str = ""


class JobStatus(enum.StrEnum):
    """Where a background job is. Its completion reaches its agent exactly once."""

    RUNNING = "running"  # started; no completion seen yet (callback or poller)
    SUCCEEDED = "succeeded"  # returned; the notice is routed
    FAILED = "failed"  # raised, or could not be started; the notice is routed


@dataclass(frozen=True, kw_only=True)
class BackgroundJob:
    """A Celery task started on an agent's behalf; its completion becomes a ``notice``."""

    id: int
    team_id: int
    agent_id: int
    name: str  # the task's name; the notice's sender is ``job:<name>``
    task_id: str  # the Celery task id (and result-backend key)
    status: JobStatus
    created_at: datetime
    finished_at: datetime | None = None
    result: str | None = None
    notice_message_id: int | None = None


class WaitOutcome(enum.StrEnum):
    """How a blocked ask ended, for the loop that called it."""

    RESOLVED = "resolved"  # the tool result is in the transcript; this turn continues
    SUSPENDED = "suspended"  # the turn gave up its worker; a continuation turn will resume


@dataclass(frozen=True, kw_only=True)
class TurnRecord:
    id: int
    agent_id: int
    epoch: int
    trigger: TurnTrigger
    status: TurnStatus
    started_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True, kw_only=True)
class EndOfTurn:
    """Result of the end-of-turn hook."""

    follow_up: bool  # one follow-up turn was scheduled for wake messages still pending
    state: AgentState
    epoch: int
    synthetic_results: int = 0  # dangling tool calls closed with an `interrupted` result
    deliveries: tuple[Delivery, ...] = ()  # the report to the lead the end wrote, in parts


@dataclass(frozen=True, kw_only=True)
class OutboxEntry:
    id: int
    kind: OutboxKind
    agent_id: int
    epoch: int
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class LedgerEvent:
    id: int
    team_id: int | None
    agent_id: int | None
    agent_name: str | None
    action: LedgerAction
    outcome: RouteOutcome | None
    message_id: int | None
    turn_id: int | None
    epoch: int | None
    detail: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class AgentStatus:
    """One agent as ``agent-router status`` shows it: state, mailbox, questions, lease."""

    agent: Agent
    open_questions: tuple[int, ...] = ()  # questions it asked that are still open
    questions_to_answer: tuple[int, ...] = ()  # open questions addressed to it
    turn_id: int | None = None  # its running turn, if any
    lease_expires_at: datetime | None = None  # naive UTC; past it the sweeper takes over
    last_error: str | None = None  # why its last turn failed, when it did


class BudgetName(enum.StrEnum):
    """A team budget. Each has a limit (``None``: unlimited) and what the team used so far."""

    MODEL_CALLS = "model_calls"  # model calls, retries and reminders included
    TURNS = "turns"  # turns started (claimed)
    TOKENS = "tokens"  # prompt + completion tokens
    COST = "cost"  # US dollars, by the price table
    WALL_SECONDS = "wall_seconds"  # seconds since the team was created
    SUB_AGENTS_CREATED = "sub_agents_created"  # sub-agents ever created
    SUB_AGENTS_ACTIVE = "sub_agents_active"  # sub-agents not terminated, at one time


#: Budgets whose end stops the team. The sub-agent budgets refuse a creation instead.
TEAM_STOPPING_BUDGETS = frozenset(
    {
        BudgetName.MODEL_CALLS,
        BudgetName.TURNS,
        BudgetName.TOKENS,
        BudgetName.COST,
        BudgetName.WALL_SECONDS,
    }
)


@dataclass(frozen=True, kw_only=True)
class TokenUsage:
    """Tokens and cost summed over model calls (of one turn, agent or team)."""

    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ToolOutcome(enum.StrEnum):
    """How a tool call ended, as its result says."""

    OK = "ok"
    ERROR = "error"  # the result is an error the model reads (a failing tool, a bad call)


@dataclass(frozen=True, kw_only=True)
class ToolRun:
    """One tool call as it ran: the tool, the MCP server it belongs to (``None``: a built-in
    tool or a host function), how it ended, and how long it took. It is kept with its result
    in the transcript entry's metadata, where the timeline reads it."""

    tool: str
    server: str | None
    outcome: ToolOutcome
    seconds: float

    def meta(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "server": self.server,
            "outcome": self.outcome.value,
            "ms": round(self.seconds * 1000),
        }


@dataclass(frozen=True, kw_only=True)
class CallSpan:
    """A model call or a tool call of a turn, with when it started and how long it took: what
    :meth:`~agent_router.hooks.RouterHooks.after_call` reports (a tracer's span)."""

    kind: str  # "model" or "tool"
    name: str  # the model (or "model" when its server named none), or the tool
    started: datetime
    seconds: float
    fields: dict[str, Any] = field(default_factory=dict)  # tokens and cost; server, outcome

    @classmethod
    def ended_now(cls, kind: str, name: str, seconds: float, **fields: Any) -> CallSpan:
        """A call that has just ended, after ``seconds``."""
        started = datetime.now(UTC).replace(tzinfo=None) - timedelta(seconds=seconds)
        return cls(kind=kind, name=name, started=started, seconds=seconds, fields=fields)


@dataclass(frozen=True, kw_only=True)
class Budget:
    """A team's limits (``None``: unlimited) and what it used; ``exhausted`` names the budget
    that stopped it, until an operator raises that limit."""

    team_id: int
    limits: dict[BudgetName, float | None]
    used: dict[BudgetName, float]
    usage: TokenUsage
    warned: bool
    exhausted: BudgetName | None
    started_at: datetime


@dataclass(frozen=True, kw_only=True)
class BudgetCheck:
    """The answer of a budget check: go on, or the budget that is spent; ``warn`` names a
    budget that just passed the warning threshold (reported once per team)."""

    ok: bool
    exhausted: BudgetName | None = None
    warn: BudgetName | None = None
    newly_exhausted: bool = False  # this check spent it: the caller stops the team


@dataclass(frozen=True, kw_only=True)
class Quarantine:
    """An agent a sweeper step failed for, ``failures`` passes in a row: passes leave it alone
    until ``until`` (a backoff that doubles with each failure); from ``QUARANTINE_AFTER``
    failures it is quarantined, which ``check`` reports. A step that succeeds for it again
    lifts it."""

    agent_id: int
    team_id: int
    step: SweepStep
    failures: int
    error: str
    first_failed_at: datetime
    last_failed_at: datetime
    until: datetime
