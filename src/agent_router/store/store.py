"""The store: the only way to the database, and the contract of its two implementations.

Every public write is one transition: one transaction, guarded by the target agent's row lock
(PostgreSQL ``SELECT ... FOR UPDATE``; SQLite ``BEGIN IMMEDIATE``, which takes the database's
write lock up front), and one or more ledger events. Locks are taken in one canonical order:
the team row, then agent rows by ascending id. Side effects (enqueue a turn, wake a waiter) are
written as outbox rows in the same transaction and handed, after commit, to the publisher the
router installs (:meth:`Store.set_publisher`). Read views are on :attr:`Store.reads`.

:class:`Store` is abstract: it holds what both databases share (the engine and its sessions,
the reads, the transcript cache, the after-commit path, the schema) and declares every
transition, its docstring the contract. Two siblings implement them, neither built on the other:
:class:`~agent_router.store.sqlite.SqliteStore` runs each as Python over SQLAlchemy (the
modules ``routing``, ``turns``, ``waits``, ...), :class:`~agent_router.store.postgres.PostgresStore`
calls each as one PostgreSQL function. A sibling that lacks a transition is refused when its
class is made (:meth:`Store.__init_subclass__`), at import, not when it is first used.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from agent_router.domain import (
    Agent,
    AgentState,
    BackgroundJob,
    Budget,
    BudgetCheck,
    BudgetName,
    Delivery,
    EndOfTurn,
    LedgerAction,
    Message,
    OutboxEntry,
    Quarantine,
    Question,
    SweepStep,
    Team,
    TurnRecord,
    UserMessage,
    UserMessageKind,
)
from agent_router.settings import Settings
from agent_router.store import faults, functions
from agent_router.store.engine import make_engine
from agent_router.store.models import Base, InstallationRow, new_installation_id, utcnow
from agent_router.store.reads import Reads
from agent_router.store.transcripts import TranscriptCache
from agent_router.store.tx import (
    Tx,
    aggregate_refusal,
    drop_ledger_buffer,
    write_ledger_buffer,
)
from agent_router.store.values import (
    AfterCall,
    Ask,
    BeforeCall,
    CallUsage,
    Claim,
    Deletion,
    FirstCall,
    NewAgent,
    Result,
    Scheduled,
    SendRequest,
    Since,
)

#: Called after a commit with the outbox entries the transaction wrote.
AfterCommit = Callable[[list[OutboxEntry]], object]


@faults.boundary
class Store(abc.ABC):
    """The store's public surface: every method raises only the library's errors
    (:func:`faults.boundary`), each sibling's too."""

    #: The transitions every sibling defines (the abstract methods below), filled in once the
    #: class is made.
    TRANSITIONS: frozenset[str] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        missing = sorted(name for name in Store.TRANSITIONS if _abstract(getattr(cls, name, None)))
        if missing:
            raise TypeError(
                f"{cls.__qualname__} is a store without the transitions {', '.join(missing)}: "
                "each sibling of Store defines every one"
            )
        faults.boundary(cls)

    def __init__(self, settings: Settings, engine: Engine | None = None) -> None:
        self.settings = settings
        self.engine = engine or make_engine(settings)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        event.listen(self._sessions, "before_commit", write_ledger_buffer)
        event.listen(self._sessions, "after_transaction_end", drop_ledger_buffer)
        self.reads = Reads(self._sessions, self.engine)
        # What turns in this process read of transcripts: a model call reads what is new.
        self.transcripts = TranscriptCache(
            settings.transcript_cache_agents,
            settings.transcript_cache_entries,
            settings.transcript_cache_bytes,
        )
        self._after_commit: AfterCommit | None = None
        self._installation: str | None = None

    # ------------------------------------------------------------------ plumbing

    def set_publisher(self, after_commit: AfterCommit | None) -> None:
        """Install the one after-commit path: every transaction that wrote outbox rows hands
        them to ``after_commit`` once it committed. Without one, the rows stay unpublished
        for a later re-publish."""
        self._after_commit = after_commit

    def create_schema(self) -> None:
        """The tables (and on PostgreSQL the store's functions), created directly, and the
        installation id, as migration 0015 writes it (kept if the database has one)."""
        Base.metadata.create_all(self.engine)
        with self.engine.begin() as conn:
            if conn.execute(sa.select(InstallationRow.id)).first() is None:
                conn.execute(
                    sa.insert(InstallationRow),
                    {"id": new_installation_id(), "created_at": utcnow()},
                )
        if not self.settings.is_sqlite:
            with self.engine.begin() as conn:
                # Room in each page of ar_agents for the new versions of its rows: every send
                # and append bumps a counter (next_seq, next_position), no indexed column, so
                # the update is HOT as long as the page has room (models.AGENTS_FILLFACTOR; set
                # here, as migration 0010 sets it, for the table options SQLAlchemy 2.0 lacks).
                conn.execute(sa.text("ALTER TABLE ar_agents SET (fillfactor = 50)"))
                functions.install(conn)

    def installation_id(self) -> str:
        """The database's installation id (:class:`~agent_router.store.models.InstallationRow`),
        read once by this store (one statement) and kept: it never changes. It names the
        database's Redis channels and wake keys (:mod:`agent_router.constants`). Two threads
        reading it at once both read the same id."""
        found = self._installation
        if found is None:
            found = self._installation = self.reads.installation()
        return found

    def dispose(self, *, close: bool = True) -> None:
        """Drop the connection pool; ``close=False`` in a forked child leaves the parent's
        connections alone."""
        self.engine.dispose(close=close)

    def _published(self, entries: list[OutboxEntry]) -> None:
        """Hand the outbox rows a committed transaction wrote to the after-commit path."""
        if entries and self._after_commit is not None:
            self._after_commit(entries)

    @faults.retrying
    def _write_ledger(self, action: LedgerAction, **fields: Any) -> None:
        with self._sessions() as session, session.begin():
            tx = Tx(session, self.settings)
            if action is LedgerAction.SEND_REJECTED and aggregate_refusal(tx, fields):
                return
            tx.ledger(action, **fields)

    # ------------------------------------------------------------------ teams and agents

    @abc.abstractmethod
    def create_team(
        self,
        lead: NewAgent,
        *,
        budget: Mapping[BudgetName, float | None] | None = None,
        model: str | None = None,
        user_task: str | None = None,
    ) -> Team:
        """A team, its ``lead`` and its budget row (the defaults, ``budget`` overriding some);
        its agents run on ``model`` when it is given; ``user_task`` receives its messages to
        the user."""

    @abc.abstractmethod
    def create_agent(
        self, team_id: int, new: NewAgent, *, task: SendRequest | None = None
    ) -> tuple[Agent, Delivery | None]:
        """Add a sub-agent (its role checked by :func:`rules.check_role`, its display name by
        :func:`rules.check_display_name`) and, when ``task`` is given, route that message to
        it in the same transaction: both exist, or neither."""

    @abc.abstractmethod
    def terminate(self, agent_id: int, *, reason: str) -> None:
        """Final: fence any running turn, drop pending messages with ``reason``, cancel the
        questions it asked, and release agents blocked on a question to it."""

    @abc.abstractmethod
    def request_stop(self, agent_id: int, *, reason: str) -> AgentState:
        """Stop a sub-agent cooperatively; the state after the request."""

    @abc.abstractmethod
    def seed_mailbox(
        self, agent_id: int, count: int, *, content: str, sender: str = "system"
    ) -> None:
        """Fill the agent's mailbox with ``count`` pending messages of ``content`` from
        ``sender`` in one transaction, scheduling nothing (benchmarks: a backlog to drain)."""

    # ------------------------------------------------------------------ routing

    @abc.abstractmethod
    def send(self, req: SendRequest) -> Delivery:
        """Accept one message and deliver it by the receiver's state."""

    @abc.abstractmethod
    def interrupt(self, req: SendRequest) -> Delivery:
        """The user's message to the lead; a running turn of the lead stops at its next
        boundary (its ``stop_requested`` event says :data:`rules.INTERRUPT_REASON`) and one
        new turn starts for the message."""

    @abc.abstractmethod
    def send_many(self, reqs: Sequence[SendRequest]) -> list[Delivery]:
        """Route several messages of one team in one transaction: all of them, or none (the
        first refusal is raised and only it is ledgered)."""

    @abc.abstractmethod
    def record_refusal(self, team_id: int | None, reason: str, **detail: Any) -> None:
        """Ledger a send refused before it reached the store (malformed input)."""

    # ------------------------------------------------------------------ turns

    @abc.abstractmethod
    def claim(
        self,
        agent_id: int,
        epoch: int | None = None,
        *,
        builtin: bool = False,
        first: FirstCall | None = None,
    ) -> Claim | None:
        """Claim the agent's scheduled turn at ``epoch`` (``None``: the current one), the turn
        counted against the team's budgets in the same transaction; ``None`` when there is
        nothing (or nothing current) to claim. ``builtin``: for the built-in loop, which claims
        no turn of an agent a host's task runs (``HostOwnedTurnError``). ``first``: the
        transition before the turn's first model call made too, in the same transaction
        (:class:`FirstCall`; the claim's ``before``)."""

    @abc.abstractmethod
    def drain(self, turn: TurnRecord, *, limit: int | None = None) -> list[Message]:
        """Move up to ``limit`` (default ``drain_batch_size``) pending messages, in sequence
        order, into the turn's transcript; refused while the last reply's tool calls lack
        results."""

    @abc.abstractmethod
    def append_assistant(self, turn: TurnRecord, message: dict[str, Any]) -> None:
        """Append the model's reply (checked by :func:`rules.validate_assistant`) to the
        turn's transcript; refused while earlier tool calls lack results."""

    @abc.abstractmethod
    def append_tool_result(
        self,
        turn: TurnRecord,
        tool_call_id: str,
        content: str,
        *,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        """Append the result of an open tool call; ``meta``: how the call ran
        (:class:`~agent_router.domain.ToolRun`), kept with it."""

    @abc.abstractmethod
    def before_call(
        self, turn: TurnRecord, *, results: Sequence[Result] = (), since: Since | None = None
    ) -> BeforeCall:
        """What a turn does before a model call, in one transaction: the carried tool
        ``results`` appended, a requested stop honoured, the call charged to the team's
        budgets, the mailbox drained (one batch) and, with ``since``, the transcript read after
        it."""

    @abc.abstractmethod
    def after_call(
        self, turn: TurnRecord, message: dict[str, Any], *, usage: CallUsage | None
    ) -> AfterCall:
        """What a turn does after a model call, in one transaction: ``usage`` recorded (as
        :meth:`record_usage` records it), then a requested stop honoured and the reply left
        out, or the reply appended and the lease renewed; a reply that calls no tool reads the
        questions open to the agent."""

    @abc.abstractmethod
    def end(
        self,
        turn: TurnRecord,
        *,
        failed: bool = False,
        error: str | None = None,
        results: Sequence[Result] = (),
        answers: Sequence[tuple[str, str]] = (),
        reports: Sequence[SendRequest] = (),
    ) -> EndOfTurn:
        """End the turn, its final output written first in the same transaction: ``answers``
        (content and dedup key of each part) to the user as :meth:`tell_user` writes them, or
        ``reports`` to the lead as :meth:`send_many` routes them. A refused output refuses the
        end. Open tool calls get a synthetic result; pending wake messages schedule one
        follow-up turn."""

    @abc.abstractmethod
    def renew_lease(self, turn: TurnRecord) -> bool:
        """Extend the running turn's lease by ``lease_seconds``; ``False`` when the turn is
        no longer the agent's running one."""

    @abc.abstractmethod
    def suspend(self, turn: TurnRecord) -> bool:
        """Suspend a turn blocked in an ask (it ends; the answer schedules a continuation);
        ``False`` when the question was answered meanwhile."""

    @abc.abstractmethod
    def finish_stop(self, turn: TurnRecord, *, reason: str | None = None) -> None:
        """Honour a stop: open tool calls get :data:`rules.STOPPED_RESULT`, the rest of the
        batch is cancelled, the agent idle; the ``stopped`` event says ``reason`` (by default
        the one the stop was requested with)."""

    # ------------------------------------------------------------------ waits

    @abc.abstractmethod
    def ask(self, turn: TurnRecord, asked: Ask) -> tuple[Question, Delivery]:
        """Ask another agent of the team and wait for its answer: the question and the message
        that carries it; refused when the wait would close a cycle."""

    @abc.abstractmethod
    def wait_output(
        self,
        turn: TurnRecord,
        *,
        target: str,
        tool_call_id: str,
        timeout_seconds: float | None = None,
    ) -> Question:
        """Wait for ``target``'s next output (a question answered by its report)."""

    # ------------------------------------------------------------------ the user

    @abc.abstractmethod
    def tell_user(
        self,
        turn: TurnRecord,
        kind: UserMessageKind,
        content: str,
        *,
        dedup_key: str | None = None,
    ) -> tuple[UserMessage, bool]:
        """A message to the user from the turn's agent; with whether it was a duplicate of one
        already written under ``dedup_key``."""

    @abc.abstractmethod
    def ask_user(
        self,
        turn: TurnRecord,
        question: str,
        *,
        tool_call_id: str,
        timeout_seconds: float | None = None,
    ) -> tuple[Question, UserMessage]:
        """Ask the user and suspend the turn."""

    @abc.abstractmethod
    def expire_questions(self, *, question_id: int | None = None) -> int:
        """Expire open questions past their deadline (only ``question_id`` when given), each
        asker released with :data:`rules.EXPIRED_RESULT`; how many were expired."""

    @abc.abstractmethod
    def remind_user(self) -> int:
        """Send the user once more each question to the user open at half its time (dedup key
        :data:`rules.REMINDER_PREFIX` and its id); how many."""

    # ------------------------------------------------------------------ recovery

    @abc.abstractmethod
    def take_over(
        self,
        agent_id: int,
        *,
        reason: str,
        expected_turn_id: int | None = None,
        lease_check: bool = False,
    ) -> int:
        """Fence a running agent whose turn is presumed dead (its open tool calls get
        :data:`rules.INTERRUPTED_RESULT`); the new epoch."""

    @abc.abstractmethod
    def take_over_expired(self, agent_id: int) -> int | None:
        """:meth:`take_over`, but only if the lease is still expired under the lock (a heartbeat
        may have renewed it since it was listed); the new epoch, or ``None``."""

    @abc.abstractmethod
    def reenqueue(self, agent: Scheduled, *, windows: int) -> bool:
        """Enqueue again the turn task of an agent found lost (:func:`recovery.reenqueue`)."""

    @abc.abstractmethod
    def record_sweep_failure(
        self, agent_id: int, step: SweepStep, error: str, *, period_seconds: float
    ) -> Quarantine | None:
        """A sweeper repair failed for the agent; its quarantine once it failed often enough
        (:func:`quarantine.record_failure`)."""

    @abc.abstractmethod
    def lift_quarantine(self, agent_id: int, *, reason: str) -> bool:
        """A repair succeeded for the agent: its failures are behind it."""

    @abc.abstractmethod
    def lift_settled_quarantines(self, *, keep: set[int]) -> list[int]:
        """Lift the agents no repair needs any more (:func:`quarantine.settled`)."""

    @abc.abstractmethod
    def claim_unpublished(
        self, *, older_than_seconds: float = 0.0, limit: int = 500
    ) -> list[OutboxEntry]:
        """Take up to ``limit`` outbox rows left unpublished for ``older_than_seconds``, to
        publish them again (:func:`recovery.claim_unpublished`)."""

    @abc.abstractmethod
    def mark_published(self, ids: Sequence[int]) -> None:
        """Mark outbox rows published, after their publish."""

    # ------------------------------------------------------------------ budgets and usage

    @abc.abstractmethod
    def charge_model_call(self, team_id: int, agent_id: int, turn_id: int) -> BudgetCheck:
        """Count a model call against the team's budgets; refused (nothing counted) when one is
        spent. (A turn is counted by its claim.)"""

    @abc.abstractmethod
    def record_usage(
        self,
        team_id: int,
        agent_id: int,
        turn_id: int | None,
        usage: CallUsage,
        *,
        agent: str | None = None,
    ) -> BudgetCheck:
        """One model call's ``usage``: a row per call, the team's totals, one ``model_call``
        event (its ``context``: what the request left out, on the call where that changed;
        its ``ms``: how long the call took, ending at the event's time), and where the agent's
        request window then stood kept on the agent (its ``context_window``). ``agent``: the
        display name the event's log line shows."""

    @abc.abstractmethod
    def charge_sub_agent(self, team_id: int, role: str) -> None:
        """Before a sub-agent is created: refused (a ``budget_refused`` event) when the team
        has created, or has active, as many as its limits allow."""

    @abc.abstractmethod
    def set_limits(
        self, team_id: int, limits: Mapping[BudgetName, float | None], *, by: str
    ) -> Budget:
        """Change some of the team's limits (``by``: who, in the event); the budget after."""

    @abc.abstractmethod
    def budget(self, team_id: int) -> Budget:
        """A team's limits and usage (a locked read: the row is made if the team has none)."""

    # ------------------------------------------------------------------ background jobs

    @abc.abstractmethod
    def start_job(self, team_id: int, agent: str, *, name: str, task_id: str) -> BackgroundJob:
        """Record a background job of ``agent`` before its task is sent."""

    @abc.abstractmethod
    def finish_job(
        self, job_id: int, *, ok: bool, result: str, batch_seconds: float = 0.0
    ) -> BackgroundJob:
        """A job's completion: its result to its agent as a message from ``job:<name>``, the
        agent's turn delayed by up to ``batch_seconds`` so that a burst wakes it once."""

    # ------------------------------------------------------------------ lifecycle

    @abc.abstractmethod
    def delete_team(
        self, team_id: int, *, dry_run: bool = False, include_undelivered: bool = False
    ) -> Deletion:
        """Delete a team and every row it owns (``dry_run``: count them, delete nothing); one
        that still owes rows is refused unless ``include_undelivered`` (then ledgered)."""

    @abc.abstractmethod
    def prune_ledger(
        self, *, older_than_seconds: float, dry_run: bool = False, batches: int | None = None
    ) -> int:
        """Retention of live teams' ledgers: delete routine ledger events
        (:data:`~agent_router.store.lifecycle.ROUTINE_LEDGER`) older than
        ``older_than_seconds``, a batch per transaction, at most ``batches`` of them (``None``:
        until none is left); how many."""

    @abc.abstractmethod
    def prune(
        self, *, older_than_seconds: float, dry_run: bool = False, include_undelivered: bool = False
    ) -> Deletion:
        """Retention: delete finished teams (nothing in flight, no activity within
        ``older_than_seconds``: no message, turn, model call or ledger event) that owe nothing
        (with ``include_undelivered``: those that do too, their drop ledgered) and published
        outbox rows older than that, in batches. A team that a send reaches while the prune
        runs is kept (in the result's ``kept``), never deleted nor a reason to fail."""


Store.TRANSITIONS = frozenset(Store.__abstractmethods__)


def _abstract(member: object) -> bool:
    """Whether a class's ``member`` is missing or still the abstract declaration."""
    return member is None or bool(getattr(member, "__isabstractmethod__", False))


__all__ = ["SendRequest", "Store", "make_engine", "utcnow"]
