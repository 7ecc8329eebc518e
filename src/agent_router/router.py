"""The public facade: teams, agents, ``send``, turns, and reads that explain what happened."""

from __future__ import annotations

import dataclasses
import enum
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from agent_router import budgeting, errors, formats
from agent_router import validation as check
from agent_router.constants import BACKGROUND_DONE, wake_token
from agent_router.domain import (
    LEAD_DISPLAY_NAME,
    LEAD_ROLE,
    Agent,
    AgentState,
    BackgroundJob,
    Budget,
    BudgetName,
    Delivery,
    Delta,
    EndOfTurn,
    FeedItem,
    LedgerEvent,
    Message,
    MessageSubtype,
    MessageType,
    OutboxEntry,
    OutboxKind,
    Question,
    QuestionKind,
    Team,
    TokenUsage,
    UserMessage,
    UserMessageKind,
    WaitOutcome,
)
from agent_router.feed import InProcessSignals, RedisSignals, TeamSignals
from agent_router.hooks import HookChain, RouterHooks
from agent_router.logfields import get_logger
from agent_router.outbox import Publisher
from agent_router.settings import Settings
from agent_router.store import (
    AfterCall,
    Ask,
    BeforeCall,
    CallUsage,
    FirstCall,
    NewAgent,
    Reads,
    Result,
    SendRequest,
    Since,
    Store,
    open_store,
)
from agent_router.store import utcnow as _utcnow
from agent_router.store.transcripts import CachedTranscript
from agent_router.store.values import Deletion
from agent_router.sweeper import SweepReport, sweep
from agent_router.turn import Turn
from agent_router.waker import InProcessWaker, RedisWaker, Waker

logger = get_logger(__name__)


class _Default(enum.Enum):
    FROM_SETTINGS = enum.auto()


#: ``Router(publisher=...)``'s default: turn tasks go to ``Settings.broker_url``.
FROM_SETTINGS = _Default.FROM_SETTINGS


class Router:
    """Routes messages between the agents of a team by the receiver's state.

    ``publisher`` turns committed turn enqueues into tasks. By default they are sent to
    ``settings.broker_url`` right after each commit (a Celery app for it is built on the first
    publish), unless that is ``memory://``, which reaches only a runtime of this process
    (:mod:`agent_router.worker.runtime` gives its Router a publisher of its own). With
    ``publisher=None`` those outbox rows stay unpublished until :meth:`publish_outbox` is given
    one, or a sweeper publishes them. ``waker`` carries the wake signals of blocked asks
    (default: Redis when ``settings.redis_url`` is set, else in-process). ``hooks`` watch
    routing and turns (metrics, task events); they run after each commit.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        publisher: Publisher | _Default | None = FROM_SETTINGS,
        store: Store | None = None,
        waker: Waker | None = None,
        hooks: RouterHooks | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.store = store or open_store(self.settings)
        self._owned: Publisher | None = None
        if publisher is FROM_SETTINGS:
            publisher = self._owned = _broker_publisher(self.settings)
        self.publisher: Publisher | None = publisher
        # The one after-commit path: every committed transition's outbox rows come here.
        self.store.set_publisher(self._publish_committed)
        self.waker: Waker = waker or (
            RedisWaker(
                self.settings.redis_url,
                max_block_seconds=self.settings.wake_recheck_seconds,
                installation=self.store.installation_id,
            )
            if self.settings.redis_url
            else InProcessWaker()
        )
        #: What wakes the readers of a team's feed (:meth:`events`).
        self.signals: TeamSignals = (
            RedisSignals(self.settings.redis_url, installation=self.store.installation_id)
            if self.settings.redis_url
            else InProcessSignals()
        )
        # Always a chain: a hook that raises is logged, never fails the transition it watches.
        self.hooks: RouterHooks = (
            hooks if isinstance(hooks, HookChain) else HookChain([hooks] if hooks else [])
        )

    # ------------------------------------------------------------------ set-up

    def create_schema(self) -> None:
        """Create the tables directly (embedded use, tests). Production uses ``db upgrade``."""
        self.store.create_schema()

    def close(self) -> None:
        """Release what this router holds: its connection pool, its Redis waker's connections,
        the publisher it built from the settings."""
        self.store.dispose()
        if isinstance(self.waker, RedisWaker):
            self.waker.close()
        if isinstance(self.signals, RedisSignals):
            self.signals.close()
        close = getattr(self._owned, "close", None)
        if close is not None:
            close()

    def create_team(
        self,
        *,
        lead_system_prompt: str | None = None,
        lead_runner: str | None = None,
        budget: Mapping[BudgetName, float | None] | None = None,
        model: str | None = None,
        user_task: str | None = None,
    ) -> Team:
        """A new team with its lead and its budgets. ``lead_runner``: the host's Celery task
        that runs the lead's turns (``name`` or ``name@queue``; default
        ``Settings.runners["Team Leader"]``, else the built-in loop). ``budget`` overrides some
        of the ``budget_*`` settings (``None``: unlimited). ``model``: the model every agent of
        the team runs on, kept with the team (``"scripted"``: the built-in scripted model);
        ``None``: each role's model, else ``Settings.openai_model``. ``user_task``: the host's
        Celery task (``name`` or ``name@queue``) that receives the team's messages to the user,
        each as ``message=`` :meth:`UserMessage.as_payload` through the outbox after its commit,
        at least once (drop a repeat by its ``id``); ``None``: read them with
        :meth:`user_messages` or :meth:`events`."""
        lead = NewAgent(
            role=LEAD_ROLE,
            display_name=LEAD_DISPLAY_NAME,
            system_prompt=check.optional_text(lead_system_prompt, "lead_system_prompt"),
            runner=self._runner(LEAD_ROLE, lead_runner),
        )
        limits = None if budget is None else check.budget_limits(budget)
        return self.store.create_team(
            lead,
            budget=limits,
            model=check.model_name(model),
            user_task=None if user_task is None else self._runner(LEAD_ROLE, user_task),
        )

    def create_agent(
        self,
        team_id: int,
        *,
        role: str,
        display_name: str | None = None,
        system_prompt: str | None = None,
        runner: str | None = None,
    ) -> Agent:
        """Add a sub-agent; its display name is ``{role}_{n}`` unless given. ``runner``: the
        host's Celery task for its turns (default ``Settings.runners[role]``, else the built-in
        loop)."""
        role = check.role(role)
        new = _new_agent(role, display_name, system_prompt, self._runner(role, runner))
        agent, _ = self.store.create_agent(_team_id(team_id), new)
        return agent

    def create_agent_with_task(
        self,
        team_id: int,
        *,
        role: str,
        task: str,
        sender: str = "user",
        display_name: str | None = None,
        system_prompt: str | None = None,
        runner: str | None = None,
    ) -> tuple[Agent, Delivery]:
        """Add a sub-agent and send it its first ``task`` in one transaction: a crash or a
        refused task (too large, unknown sender, ...) leaves neither behind. The task wakes the
        new agent like any message to an idle one (``triggered_new_turn``)."""
        role = check.role(role)
        new = _new_agent(role, display_name, system_prompt, self._runner(role, runner))
        # `to` is replaced by the new agent's display name.
        task_fields = {
            "to": new.display_name or new.role,
            "content": task,
            "type": MessageType.TASK,
        }
        request = self._validate(team_id, {**check.SEND_FIELDS, **task_fields, "sender": sender})
        with self._refusals_reported(team_id, sender):
            agent, delivery = self.store.create_agent(team_id, new, task=request)
        assert delivery is not None
        return agent, self._delivered(team_id, sender, delivery)

    def _runner(self, role: str, runner: str | None) -> str | None:
        """The runner recorded with a new agent: the one given, else the role's setting. One
        named without a queue gets the queue this router's app routes it to, when that app has
        a route for it (a host's ``task_routes``): a process that publishes the turn through
        another app (the CLI, the router's own worker) then sends it to the same queue."""
        chosen = runner if runner is not None else self.settings.runners.get(role)
        if chosen is None:
            return None
        chosen = check.runner(chosen)
        routed = getattr(self.publisher, "routed_runner", None)
        return str(routed(chosen)) if routed is not None else chosen

    def after_fork(self) -> None:
        """In a forked child (a prefork pool's): drop the connection pool copied from the
        parent without closing its connections, which stay the parent's; the child opens its
        own on first use."""
        self.store.dispose(close=False)

    def seed_mailbox(
        self, agent_id: int, count: int, *, content: str, sender: str = "system"
    ) -> None:
        """Benchmark and load-test set-up: queue ``count`` context-only notices from
        ``sender`` in an agent's mailbox in one transaction. It bypasses the routing decisions,
        so it wakes nobody: the messages wait for the agent's next drain."""
        check.integer(count, "count", minimum=0, maximum=check.MAX_INT32)
        self.store.seed_mailbox(
            check.row_id(agent_id, "agent", errors.UnknownAgentError),
            count,
            content=_text(self.settings, content, "content"),
            sender=check.sender(sender),
        )

    # ------------------------------------------------------------------ reads

    @property
    def reads(self) -> Reads:
        """Every read-only view of the database (:class:`~agent_router.store.Reads`): what the
        CLI, the checks, the web view, the metrics and the loops read. Each read is one short
        session, takes no lock and raises only the library's errors. The methods below are the
        ones a host usually needs, with their arguments checked."""
        return self.store.reads

    def team(self, team_id: int) -> Team:
        return self.store.reads.team(_team_id(team_id))

    def agent(self, team_id: int, display_name: str) -> Agent:
        return self.store.reads.agent(_team_id(team_id), check.name(display_name))

    def agents(self, team_id: int) -> list[Agent]:
        return self.store.reads.agents(_team_id(team_id))

    def transcript(self, team_id: int, display_name: str) -> list[dict[str, Any]]:
        return self.store.reads.transcript(self.agent(team_id, display_name).id)

    def ledger(self, team_id: int, *, after: int = 0) -> list[LedgerEvent]:
        """The team's ledger in order; ``after``: only the events after that one (its id)."""
        return self.store.reads.ledger(_team_id(team_id), after_id=_cursor(after))

    def messages(self, team_id: int) -> list[Message]:
        return self.store.reads.messages(_team_id(team_id))

    def user_messages(self, team_id: int, *, after: int = 0, limit: int = 500) -> list[UserMessage]:
        """The team's messages to the user after the one whose id is ``after``, in order: what
        its agents answered, reported and asked the user. Ids are in commit order within a
        team, so reading on from the last id seen misses none and repeats none."""
        return self.store.reads.user_messages(
            _team_id(team_id), after_id=_cursor(after), limit=_limit(limit)
        )

    def events(
        self, team_id: int, *, after: int = 0, wait: float = 0.0, limit: int = 500
    ) -> list[FeedItem]:
        """The team's live feed after the cursor ``after`` (an item's ``cursor``): the messages
        to its lead (the user's among them), its messages to the user, the lead's turns and
        resolved waits, in commit order. Returns at once when there are some; otherwise waits
        up to ``wait`` seconds for the team's signal (Redis pub/sub, or in-process), sending the
        database nothing while it waits, then reads once more. While the signals are down
        (Redis unreachable) it re-reads every ``wake_recheck_seconds`` instead. What an SSE
        endpoint serves, with ``Last-Event-ID`` as ``after``."""
        team_id = _team_id(team_id)
        after, limit = _cursor(after), _limit(limit)
        wait = check.seconds(wait, "wait", maximum=3600.0) if wait else 0.0
        if wait <= 0:
            return self.store.reads.feed(team_id, after_id=after, limit=limit)
        deadline = time.monotonic() + wait
        with self.signals.listen(team_id) as listener:
            found = self.store.reads.feed(team_id, after_id=after, limit=limit)
            while not found and (left := deadline - time.monotonic()) > 0:
                if not listener.live:
                    time.sleep(min(left, self.settings.wake_recheck_seconds))
                    found = self.store.reads.feed(team_id, after_id=after, limit=limit)
                    continue
                wake = listener.wait(left)
                if wake is None:
                    if listener.live:  # waited out: nothing was committed
                        return found
                    continue  # the signals broke while it waited: re-read on the timer
                if wake.deltas:  # what came after them is read at the next call, from `after`
                    now = _utcnow()
                    return [_delta_item(after, delta, now) for delta in wake.deltas]
                return self.store.reads.feed(team_id, after_id=after, limit=limit)
        return found

    def delta_sink(self, team_id: int, agent: str) -> Callable[[Delta], None]:
        """Where a streamed model call of ``agent`` hands the pieces of its reply: to the
        team's feed readers waiting at that moment (:meth:`events` items of kind ``delta``;
        nothing is stored) and to the hooks' :meth:`RouterHooks.after_delta`."""
        team_id = _team_id(team_id)

        def sink(delta: Delta) -> None:
            payload = {"agent": agent, "stream": delta.stream, "seq": delta.seq}
            self.signals.say(team_id, payload | {"text": delta.text})
            self.hooks.after_delta(team_id, agent, delta)

        return sink

    def tell_user(
        self,
        turn: Turn,
        content: str,
        *,
        kind: UserMessageKind = UserMessageKind.PROGRESS,
        dedup_key: str | None = None,
    ) -> UserMessage:
        """A message from the turn's agent to the user (``progress``, or its ``answer``),
        written and delivered as :meth:`create_team`'s ``user_task`` says; ``dedup_key``: a
        retried call writes nothing twice."""
        try:
            kind = UserMessageKind(kind)
        except ValueError:
            raise errors.InvalidArgumentError(
                f"unknown kind of message to the user: {kind!r} (answer or progress)"
            ) from None
        if kind is UserMessageKind.QUESTION:
            raise errors.InvalidArgumentError("a question to the user is asked with ask_user")
        said, _duplicate = self.store.tell_user(
            turn.record,
            kind,
            _text(self.settings, content, "content"),
            dedup_key=check.optional_key(dedup_key, "`dedup_key`"),
        )
        return said

    def ask_user(
        self,
        turn: Turn,
        question: str,
        *,
        tool_call_id: str,
        timeout_seconds: float | None = None,
    ) -> tuple[Question, UserMessage]:
        """The turn's agent asks the user and its turn suspends at once (no worker waits):
        the question reaches the user as a message of kind ``question`` with its
        ``question_id``; the user's reply (:meth:`answer` with ``sender="user"``, or any
        message of the user's to the agent) becomes the tool call's result and resumes the
        agent with a continuation turn. Past its deadline it resolves as ``expired``."""
        _text(self.settings, question, "question")
        check.key(tool_call_id, "tool_call_id")
        if timeout_seconds is not None:
            check.seconds(timeout_seconds, "timeout_seconds")
        asked, said = self.store.ask_user(
            turn.record, question, tool_call_id=tool_call_id, timeout_seconds=timeout_seconds
        )
        return dataclasses.replace(asked, asker=turn.display_name, target="user"), said

    def budget(self, team_id: int) -> Budget:
        """The team's budgets: each limit, what is used of it, which one is spent."""
        return self.store.budget(_team_id(team_id))

    def question(self, question_id: int) -> Question:
        """The question, with the display names of who asked (``asker``) and who was asked
        (``target``)."""
        return self.store.reads.named_question(
            check.row_id(question_id, "question", errors.UnknownQuestionError)
        )

    def answer(self, question_id: int, text: str, *, sender: str | None = None) -> Delivery:
        """Answer a question by its id: the answer goes to whoever asked it (resolving their
        wait), from ``sender`` (default: the agent it was asked of; ``"user"`` for a person,
        and for a question an agent asked the user). Answering a closed question raises
        :class:`~agent_router.errors.QuestionClosedError` and changes nothing."""
        question = self.question(question_id)
        return self.send(
            question.team_id,
            to=question.asker,
            content=text,
            sender=sender or ("user" if question.kind is QuestionKind.USER else question.target),
            type=MessageType.ANSWER,
            question_id=question_id,
        )

    # ------------------------------------------------------------------ routing

    def send(
        self,
        team_id: int,
        *,
        to: str,
        content: str,
        sender: str = "user",
        type: MessageType | str = MessageType.MESSAGE,
        subtype: MessageSubtype | str | None = None,
        question_id: int | None = None,
        wake: bool = True,
        dedup_key: str | None = None,
    ) -> Delivery:
        """Accept a message for ``to`` and deliver it by its state. Returns once committed.

        Refusals raise a subclass of :class:`~agent_router.errors.RefusedError` and write only a
        ledger event."""
        fields = {
            "to": to,
            "content": content,
            "sender": sender,
            "type": type,
            "subtype": subtype,
            "question_id": question_id,
            "wake": wake,
            "dedup_key": dedup_key,
        }
        request = self._validate(team_id, fields)
        with self._refusals_reported(team_id, sender):
            delivery = self.store.send(request)
        return self._delivered(team_id, sender, delivery)

    def send_many(
        self, team_id: int, messages: Sequence[Mapping[str, Any]], *, sender: str = "user"
    ) -> list[Delivery]:
        """Send several messages from ``sender`` in one transaction (a lead briefing its
        sub-agents): each routed as :meth:`send` routes it, all committed together, then their
        turns published. Each message is a mapping of :meth:`send`'s keyword arguments but
        ``sender`` (``to`` and ``content`` required). Deliveries come back in the order given.
        One bad or refused message refuses the whole batch: nothing is written but the
        refusal's ledger event."""
        if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
            raise errors.InvalidMessageError("send_many takes a list of messages")
        requests = [
            self._validate(team_id, {**check.send_fields(m), "sender": sender}) for m in messages
        ]
        with self._refusals_reported(team_id, sender):
            deliveries = self.store.send_many(requests)
        return [self._delivered(team_id, sender, d) for d in deliveries]

    @contextmanager
    def _refusals_reported(self, team_id: int, sender: str) -> Iterator[None]:
        """A refused send reaches the hooks (metrics, task events), then the caller."""
        try:
            yield
        except errors.RefusedError as exc:
            self.hooks.after_reject(team_id, sender, exc)
            raise

    def _delivered(self, team_id: int, sender: str, delivery: Delivery) -> Delivery:
        """After the commit (and its publish): tell the hooks, and the team's feed when the
        message went to its lead (the feed shows what the lead is told)."""
        self.hooks.after_route(team_id, sender, delivery)
        if delivery.target == LEAD_DISPLAY_NAME and not delivery.duplicate:
            self.signals.notify(team_id)
        return delivery

    def _validate(self, team_id: int, fields: Mapping[str, Any]) -> SendRequest:
        """Every field of a send (``check.SEND_FIELDS`` and ``sender``) checked before the
        database sees it; a refusal is ledgered (when the team exists) and reaches the hooks."""
        to, sender, subtype = fields["to"], fields["sender"], fields["subtype"]
        try:
            try:
                msg_type = MessageType(fields["type"])
                msg_subtype = MessageSubtype(subtype) if subtype is not None else None
            except ValueError as exc:
                raise errors.InvalidArgumentError(
                    f"unknown message type or subtype: {exc}"
                ) from None
            _text(self.settings, fields["content"], "content")
            check.name(to, "`to`")
            check.sender(sender)
            if not isinstance(fields["wake"], bool):
                raise errors.InvalidArgumentError("`wake` must be a bool")
            if fields["question_id"] is not None:
                check.row_id(fields["question_id"], "question", errors.UnknownQuestionError)
            check.optional_key(fields["dedup_key"], "`dedup_key`")
        except errors.RefusedError as problem:
            valid_team = isinstance(team_id, int) and 1 <= team_id <= check.MAX_ID
            self.hooks.after_reject(team_id if valid_team else None, str(sender)[:200], problem)
            if valid_team and self.store.reads.team_exists(team_id):
                self.store.record_refusal(
                    team_id,
                    "invalid_message",
                    error=check.scrub(str(problem))[:1000],
                    to=check.scrub(str(to))[:200],
                )
            raise
        checked = {**fields, "type": msg_type, "subtype": msg_subtype}
        return SendRequest(team_id=_team_id(team_id), **checked)

    # ------------------------------------------------------------------ turns

    def claim_turn(
        self, team_id: int, display_name: str, *, epoch: int | None = None
    ) -> Turn | None:
        """Claim the agent's scheduled turn; ``None`` when there is nothing (or nothing current)
        to claim."""
        agent = self.agent(team_id, display_name)
        return self.claim(agent.id, epoch)

    def claim(
        self,
        agent_id: int,
        epoch: int | None = None,
        *,
        builtin: bool = False,
        first: FirstCall | None = None,
    ) -> Turn | None:
        """Claim by id and epoch, as a turn task does; duplicates and stale epochs get ``None``.
        ``builtin``: the built-in loop's claim, refused with ``HostOwnedTurnError`` (nothing
        claimed) for an agent whose turns a host's task runs. ``first``: the claim makes the
        transition before the turn's first model call too (:class:`FirstCall`), which the
        turn's first :meth:`Turn.before_call` then returns."""
        if not 1 <= check.integer(agent_id, "agent id") <= check.MAX_ID:
            return None  # no such agent: nothing to claim
        if (
            epoch is not None
            and not check.MIN_INT32 <= check.integer(epoch, "epoch") <= check.MAX_INT32
        ):
            return None  # no turn ever had that epoch
        claim = self.store.claim(agent_id, epoch, builtin=builtin, first=first)
        if claim is None:
            return None
        turn = Turn(self, claim)
        if not budgeting.admit_turn(self, turn, claim.budget):
            return None  # a team budget is spent: the turn stopped at once
        self.hooks.after_claim(turn)
        return turn

    def kept(self, agent_id: int) -> CachedTranscript:
        """This process's copy of the agent's transcript as it is, read or not (as
        :meth:`Turn.kept`): what a loop keeps beside it, before it claims a turn."""
        return self.store.transcripts.get(agent_id)

    def before_call(
        self,
        turn: Turn,
        *,
        results: Sequence[Result] = (),
        since: Since | None = None,
        made: BeforeCall | None = None,
    ) -> BeforeCall:
        """What ``turn`` does before a model call, in one transition (see
        :meth:`Turn.before_call`): the call charged to the team's budgets, acted on as
        :meth:`charge_model_call` acts (a spent budget raises
        :class:`~agent_router.errors.BudgetExhaustedError`), unless the turn stopped.
        ``made``: the transition the turn's claim made already, only acted on."""
        if made is None:
            made = self.store.before_call(turn.record, results=results, since=since)
        before = made
        if before.budget is not None:
            budgeting.model_call_charged(self, turn, before.budget)
        return before

    def after_call(
        self, turn: Turn, message: dict[str, Any], *, usage: Mapping[str, Any] | None = None
    ) -> AfterCall:
        """What ``turn`` does after a model call, in one transition (see
        :meth:`Turn.after_call`): ``usage`` (the arguments of :meth:`record_usage`) recorded
        as :meth:`record_usage` records it, and the reply appended."""
        counted = None if usage is None else self._counted(**usage)
        after = self.store.after_call(turn.record, message, usage=counted)
        if counted is not None and after.budget is not None:
            budgeting.usage_recorded(self, turn, counted, after.budget)
        return after

    def priced_usage(
        self,
        *,
        model: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        **_rest: Any,
    ) -> tuple[str | None, TokenUsage]:
        """A model call's model name and tokens checked, and priced by ``Settings.models``
        (what :meth:`record_usage` records); the other arguments of :meth:`record_usage`
        are ignored."""
        counts = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": cached_tokens,
        }
        for what, count in counts.items():
            check.integer(count, what, minimum=0, maximum=check.MAX_TOKENS_PER_CALL)
        model = check.model_name(model)
        return model, budgeting.priced(self.settings, model, **counts)

    def _counted(
        self,
        *,
        estimated: bool = False,
        context: Mapping[str, Any] | None = None,
        window: Mapping[str, Any] | None = None,
        seconds: float | None = None,
        **counts: Any,
    ) -> CallUsage:
        """A model call's usage (the arguments of :meth:`record_usage`) as the store records
        it: checked and priced (:meth:`priced_usage`)."""
        model, usage = self.priced_usage(**counts)
        return CallUsage(
            model=model,
            usage=usage,
            estimated=bool(estimated),
            context=_storable(context),
            window=_storable(window),
            seconds=_seconds(seconds),
        )

    def end_turn(
        self,
        turn: Turn,
        *,
        failed: bool = False,
        error: str | None = None,
        results: Sequence[Result] = (),
        output: str | None = None,
    ) -> EndOfTurn:
        """End ``turn`` (see :meth:`Turn.end`); ``output``: its final reply, written with the
        end in its one transaction."""
        # What failed is told as it was (an exception's text may quote a model's NUL).
        error = None if error is None else check.scrub(str(error))
        answers: list[tuple[str, str]] = []
        reports: list[SendRequest] = []
        if output is not None and output.strip():
            limit = self.settings.max_content_bytes
            if turn.agent.is_lead:  # its answer to the user
                answers = formats.keyed_parts(check.scrub(output), limit, f"answer:{turn.id}")
            else:  # its completion report to its lead; only the last part wakes the lead
                parts = formats.keyed_parts(check.scrub(output), limit, f"report:{turn.id}")
                reports = [
                    self._validate(
                        turn.team_id,
                        {
                            "to": turn.lead,
                            "content": part,
                            "sender": turn.display_name,
                            "type": MessageType.OUTPUT,
                            "subtype": MessageSubtype.COMPLETION_REPORT,
                            "question_id": None,
                            "wake": number == len(parts),
                            "dedup_key": key,
                        },
                    )
                    for number, (part, key) in enumerate(parts, 1)
                ]
        try:
            result = self.store.end(
                turn.record,
                failed=failed,
                error=error,
                results=results,
                answers=answers,
                reports=reports,
            )
        except errors.RefusedError as exc:
            if reports and not isinstance(exc, errors.TurnError):
                self.hooks.after_reject(turn.team_id, turn.display_name, exc)
            raise
        for delivery in result.deliveries:
            self._delivered(turn.team_id, turn.display_name, delivery)
        seconds = (_utcnow() - turn.record.started_at) / timedelta(seconds=1)
        self.hooks.after_end_turn(turn, result, seconds, failed=failed)
        return result

    def charge_model_call(self, turn: Turn) -> None:
        """Count the model call ``turn`` is about to make against its team's budgets; raises
        :class:`~agent_router.errors.BudgetExhaustedError` when one is spent (see
        :meth:`Turn.charge_model_call`)."""
        budgeting.charge_model_call(self, turn)

    def record_usage(
        self,
        turn: Turn,
        *,
        model: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        estimated: bool = False,
        context: Mapping[str, Any] | None = None,
        window: Mapping[str, Any] | None = None,
        seconds: float | None = None,
    ) -> TokenUsage:
        """Record one model call's tokens for ``turn``, priced by ``Settings.models``, against
        its team's budgets; the hooks hear of it (see :meth:`Turn.record_usage`). ``context``:
        what the request left out of the transcript, on the call where that changed;
        ``window``: where the request window then stood, kept on the agent; ``seconds``: how
        long the call took."""
        counted = self._counted(
            model=model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            estimated=estimated,
            context=context,
            window=window,
            seconds=seconds,
        )
        check = self.store.record_usage(
            turn.team_id, turn.agent_id, turn.id, counted, agent=turn.display_name
        )
        budgeting.usage_recorded(self, turn, counted, check)
        return counted.usage

    def charge_sub_agent(self, team_id: int, role: str) -> None:
        """Count a sub-agent about to be created against the team's sub-agent budgets
        (created, active at once): refused with
        :class:`~agent_router.errors.BudgetExhaustedError`, and a ``budget_refused`` event,
        when the team is at either limit. Nothing else stops."""
        self.store.charge_sub_agent(_team_id(team_id), check.role(role))

    def ask(
        self,
        turn: Turn,
        target: str,
        question: str,
        *,
        tool_call_id: str,
        subtype: MessageSubtype | None = None,
        timeout_seconds: float | None = None,
    ) -> Question:
        _text(self.settings, question, "question")
        check.name(target, "target")
        check.key(tool_call_id, "tool_call_id")
        if timeout_seconds is not None:
            check.seconds(timeout_seconds, "timeout_seconds")
        lead = self.team(turn.team_id).lead.display_name
        asked = Ask(
            target=target,
            question=question,
            tool_call_id=tool_call_id,
            subtype=subtype
            or (MessageSubtype.ASK_MASTER if target == lead else MessageSubtype.ASK_OTHER),
            timeout_seconds=timeout_seconds,
        )
        q, delivery = self.store.ask(turn.record, asked)
        self._delivered(turn.team_id, turn.display_name, delivery)
        return dataclasses.replace(q, asker=turn.display_name, target=target)

    def wait_for(
        self, turn: Turn, question: Question, *, block_seconds: float | None = None
    ) -> WaitOutcome:
        """Block the turn's worker until ``question`` stops blocking it (answered, released,
        expired), then suspend: after at most ``block_seconds`` (default
        ``Settings.ask_block_seconds``) while the agent asked is at work (a turn of its holds a
        worker), and after ``Settings.ask_grace_seconds`` once it is not (idle, or its turn
        queued behind others): a slot held for an answerer that needs a slot itself could be
        the one it waits for. The database decides: the question and its target's state are
        read first and again every ``wake_recheck_seconds``; a wake signal is sent only after
        the transaction that ended the wait committed (its row is written there), so a signal
        popped ends the wait without a read; and whether the answer or the suspension came first
        is settled under the agent lock."""
        block = self.settings.ask_block_seconds if block_seconds is None else block_seconds
        started = time.monotonic()
        outcome = self._wait(
            turn,
            question,
            give_up_at=started + block,
            idle_give_up_at=started + min(block, self.settings.ask_grace_seconds),
        )
        self.hooks.after_wait(turn, outcome, time.monotonic() - started)
        return outcome

    def _wait(
        self, turn: Turn, question: Question, *, give_up_at: float, idle_give_up_at: float
    ) -> WaitOutcome:
        try:
            while True:
                waiting, deadline, target_at_work = self.store.reads.wait_state(question.id)
                if not waiting:
                    return WaitOutcome.RESOLVED
                until_deadline = (deadline - _utcnow()) / timedelta(seconds=1)
                if until_deadline <= 0:
                    self.store.expire_questions(question_id=question.id)
                    continue
                remaining = (give_up_at if target_at_work else idle_give_up_at) - time.monotonic()
                if remaining <= 0:
                    if self.store.suspend(turn.record):
                        return WaitOutcome.SUSPENDED
                    continue  # the answer won the race: it is in the transcript
                if self.waker.wait(
                    question.id,
                    min(remaining, until_deadline, self.settings.wake_recheck_seconds),
                    wake_token(question.deadline),
                ):
                    return WaitOutcome.RESOLVED  # committed before it was sent
        finally:
            self.waker.forget(question.id)

    def expire_questions(self) -> int:
        """Resolve every open question past its deadline with an ``expired`` result."""
        return self.store.expire_questions()

    def remind_user(self) -> int:
        """Send the user once more each question to the user still open at half its time (a
        message of kind ``question``, the same question id and text); each once. How many. The
        sweeper does it on every pass."""
        return self.store.remind_user()

    def take_over(self, team_id: int, display_name: str, *, reason: str) -> int:
        """Fence the agent's running turn (it can write nothing more) and schedule recovery."""
        agent = self.agent(team_id, display_name)
        return self.store.take_over(agent.id, reason=_text(self.settings, reason, "reason"))

    def terminate(self, team_id: int, display_name: str, *, reason: str) -> None:
        """Final: later sends are refused, pending messages dropped with ``reason``."""
        agent = self.agent(team_id, display_name)
        self.store.terminate(agent.id, reason=_text(self.settings, reason, "reason"))

    def stop(self, team_id: int, display_name: str, *, reason: str) -> AgentState:
        """Cooperative stop: the agent ends up ``idle`` with its mailbox kept; a running turn
        stops at its next boundary (the returned state is then still ``running``/``waiting``)."""
        agent = self.agent(team_id, display_name)
        return self.store.request_stop(agent.id, reason=_text(self.settings, reason, "reason"))

    def interrupt(self, team_id: int, content: str, *, dedup_key: str | None = None) -> Delivery:
        """The user's message to the lead, interrupting its work: routed as :meth:`send`
        routes it, and a turn the lead is running is asked to stop at its next boundary (open
        tool calls get ``cancelled`` results, as :meth:`stop` does); that stop starts one new
        turn, whose first model request holds this message. A lead not running a turn just
        gets the message."""
        fields = {"to": LEAD_DISPLAY_NAME, "content": content, "dedup_key": dedup_key}
        request = self._validate(team_id, {**check.send_fields(fields), "sender": "user"})
        with self._refusals_reported(team_id, "user"):
            delivery = self.store.interrupt(request)
        return self._delivered(team_id, "user", delivery)

    def wait_output(
        self,
        turn: Turn,
        target: str,
        *,
        tool_call_id: str,
        timeout_seconds: float | None = None,
    ) -> Question:
        """Open a wait of the turn's agent for ``target``'s next output (block on it with
        :meth:`wait_for`). Refused with :class:`~agent_router.errors.AskRefusedError` if it would
        deadlock or ``target`` has nothing to work on."""
        check.name(target, "target")
        check.key(tool_call_id, "tool_call_id")
        if timeout_seconds is not None:
            check.seconds(timeout_seconds, "timeout_seconds")
        return self.store.wait_output(
            turn.record, target=target, tool_call_id=tool_call_id, timeout_seconds=timeout_seconds
        )

    # ------------------------------------------------------------------ lifecycle

    def delete_team(
        self, team_id: int, *, dry_run: bool = False, include_undelivered: bool = False
    ) -> Deletion:
        """Delete a team: every row it owns (agents, messages, transcripts, turns, questions,
        jobs, outbox, ledger) and the wake keys of its open questions. A team that still owes
        something (undelivered mail, open questions, a spent budget it waits to have raised,
        unpublished outbox rows, a turn at work) is refused with
        :class:`~agent_router.errors.OwedRowsError`, unless ``include_undelivered``: then what
        it owed is ledgered (``owed_dropped``, kept after the team is gone). Its queued turn
        tasks claim nothing and a turn still running writes nothing more. ``dry_run``: count
        only."""
        _flag(include_undelivered, "include_undelivered")
        deletion = self.store.delete_team(
            _team_id(team_id),
            dry_run=_flag(dry_run, "dry_run"),
            include_undelivered=include_undelivered,
        )
        _forget(self.waker, deletion)
        return deletion

    def prune(
        self,
        *,
        older_than_seconds: float,
        dry_run: bool = False,
        include_undelivered: bool = False,
        ledger_older_than_seconds: float | None = None,
    ) -> Deletion:
        """Retention: delete every finished team (no agent scheduled, running or waiting, and
        no message, turn, model call or ledger event for ``older_than_seconds``: the ledger's
        own retention never makes a live team look idle) that owes nothing
        (``include_undelivered``: those that do too, what they owed ledgered) and published
        outbox rows that old. Teams kept because they owe something, or because a send reached
        them while the prune ran, are listed in ``Deletion.kept``. Then the routine
        ledger events of the teams left older than ``ledger_older_than_seconds`` (default:
        ``Settings.ledger_retention_days``; unset: none), counted in ``rows["ar_ledger"]``."""
        older = check.seconds(older_than_seconds, "older_than_seconds", maximum=1e10)
        dry_run = _flag(dry_run, "dry_run")
        if ledger_older_than_seconds is None and self.settings.ledger_retention_days is not None:
            ledger_older_than_seconds = self.settings.ledger_retention_days * 86400
        if ledger_older_than_seconds is not None:
            ledger_older_than_seconds = check.seconds(
                ledger_older_than_seconds, "ledger_older_than_seconds", maximum=1e10
            )
        deletion = self.store.prune(
            older_than_seconds=older,
            dry_run=dry_run,
            include_undelivered=_flag(include_undelivered, "include_undelivered"),
        )
        if ledger_older_than_seconds is not None:
            ledger = self.store.prune_ledger(
                older_than_seconds=ledger_older_than_seconds, dry_run=dry_run
            )
            rows = dict(deletion.rows)
            rows["ar_ledger"] = rows.get("ar_ledger", 0) + ledger
            deletion = dataclasses.replace(deletion, rows=rows)
        _forget(self.waker, deletion)
        return deletion

    # ------------------------------------------------------------------ background jobs

    def track_background(self, team_id: int, agent: str, signature: Any) -> BackgroundJob:
        """Start the Celery task ``signature`` on ``agent``'s behalf, with a notification when it
        completes. The job is recorded first; its completion becomes one ``notice``
        from ``job:<task name>`` to the agent, through a link / link_error callback at once, or
        through the sweeper's poller (which reads the result backend) if the callback is lost.
        Completions within ``Settings.background_batch_seconds`` wake the agent once.

        If the task cannot be sent (broker down), the job is reported failed and the error
        raised."""
        app = getattr(self.publisher, "app", None) or signature.app
        name = check.job_name(str(signature.task))
        job = self.store.start_job(
            _team_id(team_id), check.name(agent), name=name, task_id=str(uuid.uuid4())
        )
        done = app.signature(BACKGROUND_DONE, kwargs={"job_id": job.id})
        failed = app.signature(BACKGROUND_DONE, kwargs={"job_id": job.id, "failed": True})
        try:
            # ignore_result=False: the poller needs the result if the callback is lost.
            signature.apply_async(
                task_id=job.task_id, link=done, link_error=failed, ignore_result=False
            )
        except Exception as exc:
            self.finish_background(job.id, ok=False, result=f"could not be started: {exc!r}")
            raise
        return job

    def finish_background(self, job_id: int, *, ok: bool, result: str) -> BackgroundJob:
        """Report a job's completion to its agent (idempotent: a second report is a no-op)."""
        check.row_id(job_id, "background job", errors.RefusedError)
        limit = self.settings.max_content_bytes // 4  # room for the envelope; UTF-8 is <= 4x
        result = check.scrub(str(result))  # what a job returned is reported, never refused
        text = result if len(result) <= limit else result[: limit - 1] + "…"
        return self.store.finish_job(
            job_id, ok=ok, result=text, batch_seconds=self.settings.background_batch_seconds
        )

    def background_jobs(self, team_id: int) -> list[BackgroundJob]:
        return self.store.reads.jobs(_team_id(team_id))

    # ------------------------------------------------------------------ outbox

    def _publish_committed(self, entries: list[OutboxEntry]) -> None:
        """The store's after-commit path: what a transition committed, published at once. Its
        wake rows were written marked published (``store.tx.written_published``): only their
        signals are sent."""
        self._publish_entries(self.publisher, entries, wakes_marked=True)

    def sweep(self, *, takeovers_only: bool = False) -> SweepReport:
        """One sweeper pass (see :mod:`agent_router.sweeper`); ``takeovers_only``: only take
        over expired leases."""
        return sweep(self, takeovers_only=takeovers_only)

    def _publish_entries(
        self, publisher: Publisher | None, entries: list[OutboxEntry], *, wakes_marked: bool = False
    ) -> int:
        """Wake signals go to the waker, turn tasks to the publisher; what was sent is marked
        published (wake rows not, when ``wakes_marked``: they were written so). Without a
        publisher, turn rows stay unpublished for a later :meth:`publish_outbox`."""
        published: list[int] = []
        signalled = 0
        try:
            for entry in entries:
                if entry.kind is OutboxKind.DELIVER_USER:
                    self.signals.notify(int(entry.payload["message"]["team_id"]))
                    if not entry.payload.get("task"):
                        # Written published: its signal was all it had to send.
                        signalled += 1
                        continue
                if entry.kind is OutboxKind.WAKE_WAITER:
                    # A row written before signals carried a token: its waiter re-reads.
                    self.waker.notify(
                        int(entry.payload["question_id"]), entry.payload.get("token", "")
                    )
                    if wakes_marked:
                        signalled += 1
                        continue
                elif publisher is not None:
                    publisher.publish(entry)
                else:
                    continue
                published.append(entry.id)
        except Exception:
            # The row stays unpublished; the sweeper publishes it again.
            logger.exception("outbox publish failed", extra={"action": "publish"})
        finally:
            try:
                self.store.mark_published(published)
            except errors.StoreError:
                # What was sent committed: the caller's transition stands. The rows stay
                # unpublished and the sweeper sends them again (every turn task is fenced).
                logger.exception("outbox mark failed", extra={"action": "publish"})
        return len(published) + signalled

    def republish(self, entry: OutboxEntry) -> None:
        """Publish one outbox row again (a sweeper's repair) and mark it published; what the
        publisher raises reaches the caller, and the row stays unpublished."""
        if entry.kind is OutboxKind.WAKE_WAITER:
            self.waker.notify(int(entry.payload["question_id"]), entry.payload.get("token", ""))
        elif self.publisher is not None:
            self.publisher.publish(entry)
        else:
            return
        self.store.mark_published([entry.id])

    def publish_outbox(
        self, publisher: Publisher | None = None, *, older_than_seconds: float = 0.0
    ) -> int:
        """Publish outbox rows still unpublished (those a crash or broker loss left behind)."""
        target = publisher or self.publisher
        if target is None:
            raise errors.ConfigurationError("no publisher to publish the outbox with")
        return self._publish_entries(
            target, self.store.claim_unpublished(older_than_seconds=older_than_seconds)
        )

    def outbox(self, team_id: int) -> list[OutboxEntry]:
        return self.store.reads.outbox(_team_id(team_id))


def _broker_publisher(settings: Settings) -> Publisher | None:
    """The publisher of a Router given none: the settings' broker, unless ``memory://``."""
    if settings.broker_url.startswith("memory://"):
        return None
    # At call time: a process that never publishes (a Router on memory://, a read-only
    # command) never loads Celery. One that only sends (a script, a web app) publishes the turn
    # tasks it commits, as the README shows.
    from agent_router.broker import BrokerPublisher

    return BrokerPublisher(settings)


def _storable(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A model call's ``context`` or ``window`` as the store keeps it."""
    return None if value is None else check.storable(dict(value))


def _seconds(seconds: float | None) -> float | None:
    """How long a model call took, as its ``model_call`` event keeps it (``ms``)."""
    return None if seconds is None else check.seconds(seconds, "a model call's seconds")


def _cursor(after: Any) -> int:
    return check.integer(after, "after", minimum=0, maximum=check.MAX_ID)


def _limit(limit: Any) -> int:
    return check.integer(limit, "limit", minimum=1, maximum=10_000)


def _delta_item(cursor: int, delta: Mapping[str, Any], now: datetime) -> FeedItem:
    """A delta a team's signal carried as a feed item at the reader's cursor."""
    return FeedItem(
        cursor=cursor,
        kind="delta",
        action="delta",
        sender=delta["agent"],
        content=delta["text"],
        question_id=None,
        message_id=None,
        created_at=now,
        stream=delta["stream"],
        seq=delta["seq"],
    )


def _team_id(team_id: Any) -> int:
    return check.row_id(team_id, "team", errors.UnknownTeamError)


def _text(settings: Settings, value: Any, what: str) -> str:
    """Message content, a question or a reason: non-blank text within the message limit."""
    return check.text(value, what, max_bytes=settings.max_content_bytes)


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise errors.InvalidArgumentError(f"`{what}` must be a bool")
    return value


def _forget(waker: Waker, deletion: Deletion) -> None:
    """Drop the wake keys of a deleted team's open questions."""
    if not deletion.dry_run:
        for question_id in deletion.questions:
            waker.forget(question_id)


def _new_agent(
    role: str, display_name: str | None, system_prompt: str | None, runner: str | None
) -> NewAgent:
    """The checked definition of a sub-agent to add (``role`` and ``runner`` already checked)."""
    return NewAgent(
        role=role,
        display_name=None if display_name is None else check.display_name(display_name),
        system_prompt=check.optional_text(system_prompt, "system_prompt"),
        runner=runner,
    )
