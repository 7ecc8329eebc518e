"""A claimed turn: the handle an agent loop (ours or a host's) writes its transcript through."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from agent_router import errors
from agent_router import validation as check
from agent_router.domain import (
    AgentState,
    BackgroundJob,
    CallSpan,
    EndOfTurn,
    Message,
    MessageSubtype,
    Question,
    TokenUsage,
    ToolRun,
    TurnTrigger,
    UserMessage,
    UserMessageKind,
    WaitOutcome,
)

if TYPE_CHECKING:
    from agent_router.settings import Settings
    from agent_router.store import AfterCall, BeforeCall, Store
    from agent_router.store.transcripts import CachedTranscript
    from agent_router.store.values import Claim, Result, Since

T = TypeVar("T")


class CallHooks(Protocol):
    """What a turn tells the router's hooks itself (:class:`~agent_router.hooks.RouterHooks`
    is one): a tool call it ran."""

    def after_call(self, turn: Turn, span: CallSpan) -> None: ...


class TurnHost(Protocol):
    """What a turn needs of the router that claimed it (:class:`~agent_router.router.Router` is
    one): its settings, store and hooks, and the transitions that reach beyond the turn's own
    agent (an ask routes a message, a model call counts against the team's budgets). The router
    depends on the turn, never the other way round."""

    settings: Settings
    store: Store

    @property
    def hooks(self) -> CallHooks: ...

    def ask(
        self,
        turn: Turn,
        target: str,
        question: str,
        *,
        tool_call_id: str,
        subtype: MessageSubtype | None = None,
        timeout_seconds: float | None = None,
    ) -> Question: ...

    def wait_for(
        self, turn: Turn, question: Question, *, block_seconds: float | None = None
    ) -> WaitOutcome: ...

    def wait_output(
        self,
        turn: Turn,
        target: str,
        *,
        tool_call_id: str,
        timeout_seconds: float | None = None,
    ) -> Question: ...

    def tell_user(
        self,
        turn: Turn,
        content: str,
        *,
        kind: UserMessageKind = UserMessageKind.PROGRESS,
        dedup_key: str | None = None,
    ) -> UserMessage: ...

    def ask_user(
        self,
        turn: Turn,
        question: str,
        *,
        tool_call_id: str,
        timeout_seconds: float | None = None,
    ) -> tuple[Question, UserMessage]: ...

    def end_turn(
        self,
        turn: Turn,
        *,
        failed: bool = False,
        error: str | None = None,
        results: Sequence[Result] = (),
        output: str | None = None,
    ) -> EndOfTurn: ...

    def before_call(
        self,
        turn: Turn,
        *,
        results: Sequence[Result] = (),
        since: Since | None = None,
        made: BeforeCall | None = None,
    ) -> BeforeCall: ...

    def after_call(
        self, turn: Turn, message: dict[str, Any], *, usage: Mapping[str, Any] | None = None
    ) -> AfterCall: ...

    def charge_model_call(self, turn: Turn) -> None: ...

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
    ) -> TokenUsage: ...

    def track_background(self, team_id: int, agent: str, signature: Any) -> BackgroundJob: ...


class Turn:
    """One fenced run of an agent's loop. Every write is refused with
    :class:`~agent_router.errors.StaleTurnError` once a newer epoch supersedes this one."""

    def __init__(self, router: TurnHost, claim: Claim) -> None:
        self._router = router
        self.record = claim.record
        self.team_id = claim.team_id
        self.display_name = claim.display_name
        #: The agent as the claim found it, and its team lead's display name.
        self.agent = claim.agent
        self.lead = claim.lead
        self._checkpoint = claim.checkpoint
        #: The tool calls of the agent's last reply without a result when the turn was
        #: claimed (a continuation runs them first).
        self.claimed_open_calls = claim.open_calls
        #: Tool call results not yet written: they go with the turn's next transition.
        self._carried: list[Result] = []
        # Transcript entries the last before_call read: (the position they follow, entries).
        self._prefetched: tuple[int | None, list[tuple[int, dict[str, Any]]]] | None = None
        # The transition before the first model call, when the claim made it, and what it read.
        self._first = None if claim.before is None else (claim.before, claim.read)
        #: When (time.monotonic) a transition of this turn last renewed its lease.
        self.renewed_at = time.monotonic()
        self._history: list[dict[str, Any]] = []
        self._kept: CachedTranscript | None = None
        self._generation = 0  # of the process's copy _history was taken from

    @property
    def id(self) -> int:
        return self.record.id

    @property
    def agent_id(self) -> int:
        return self.record.agent_id

    @property
    def epoch(self) -> int:
        return self.record.epoch

    @property
    def trigger(self) -> TurnTrigger:
        return self.record.trigger

    @property
    def settings(self) -> Settings:
        """The router's settings: the limits a loop works within."""
        return self._router.settings

    def drain(self, *, limit: int | None = None) -> list[Message]:
        """Move pending messages into the transcript (sequence order), after the tool call
        results the turn carries; returns them."""
        self.flush()
        self._prefetched = None  # the entries drained follow those it holds
        return self._router.store.drain(self.record, limit=limit)

    def append_assistant(self, message: dict[str, Any]) -> dict[str, Any]:
        """Store the model's reply as the transcript can hold it (:func:`check.model_reply`):
        a NUL or lone surrogate in what the model wrote (in its arguments' JSON escapes too)
        becomes U+FFFD, a tool call id no column holds (longer than 200 characters, blank,
        with control characters) is replaced by one the router makes from it, an id repeated
        within the reply is renamed, arguments over ``Settings.max_tool_argument_bytes`` are
        not kept. The reply is never refused for what the model wrote; returns it as stored
        (its calls are answered under the ids it holds)."""
        limit = self.settings.max_tool_argument_bytes
        stored = check.model_reply(message, max_argument_bytes=limit)
        self._router.store.append_assistant(self.record, stored)
        return stored

    def append_tool_result(
        self, tool_call_id: str, content: str, *, run: ToolRun | None = None
    ) -> None:
        """The result of the open call ``tool_call_id``: the model's own id, or the one the
        router stored it under (:func:`check.call_id` maps the one to the other). ``run``:
        the tool, its server, its outcome and how long it took, kept with the result (the
        timeline draws the call; the hooks hear of it as a span)."""
        self.flush()
        content = check.scrub(content) if isinstance(content, str) else content
        self._router.store.append_tool_result(
            self.record, check.call_id(tool_call_id), content, meta=self._ran(run)
        )

    def carry_tool_result(
        self, tool_call_id: str, content: str, *, run: ToolRun | None = None
    ) -> None:
        """The result of the open call ``tool_call_id`` (as :meth:`append_tool_result` takes
        it, ``run`` too), written with the turn's next transition: :meth:`before_call`,
        :meth:`end`, or before any other write of the turn (:meth:`flush`). A result the store
        refuses (no such open call) is refused there."""
        if not isinstance(content, str):
            raise errors.InvalidTranscriptEntryError("a tool result's content must be a string")
        self._carried.append((check.call_id(tool_call_id), check.scrub(content), self._ran(run)))

    def _ran(self, run: ToolRun | None) -> dict[str, Any] | None:
        """How a tool call ran as its result's entry keeps it; the hooks hear of the call, which
        has just ended, as a span."""
        if run is None:
            return None
        self._router.hooks.after_call(
            self,
            CallSpan.ended_now(
                "tool", run.tool, run.seconds, server=run.server, outcome=run.outcome.value
            ),
        )
        meta: dict[str, Any] = check.storable(run.meta())
        return meta

    def flush(self) -> None:
        """Write the tool call results the turn carries, one transition each."""
        while self._carried:
            self._with_carried(self._append_first)

    def _append_first(self, results: tuple[Result, ...]) -> None:
        """Write the first of ``results``; carry the others on."""
        (call_id, content, meta), *rest = results
        self._router.store.append_tool_result(self.record, call_id, content, meta=meta)
        self._carried[:0] = rest

    def before_call(self, *, since: Since | None = None) -> BeforeCall:
        """What the turn does before a model call, in one transition of the store: the results
        it carries written, its lease renewed, a stop requested honoured (``stopped``: the
        turn stopped, as :meth:`finish_stop`), else the call charged to the team's budgets
        (as :meth:`charge_model_call`: a spent one raises
        :class:`~agent_router.errors.BudgetExhaustedError`) and a batch of pending messages
        drained into the transcript (``more``: :meth:`drain` the rest). Reads the team's
        agents and, with ``since``, the transcript entries it says, which the next
        :meth:`transcript_rows` of the same entries returns. The turn's first call, when its
        claim made this transition already (it carried nothing then), returns what the claim
        did and read."""
        first, self._first = self._first, None
        if first is not None and not self._carried:
            before, read = first
            before = self._router.before_call(self, made=before)
            if read != since:
                before = replace(before, rows=None)  # others than those wanted
        else:
            before = self._with_carried(
                lambda results: self._router.before_call(self, results=results, since=since)
            )
            self.renewed_at = time.monotonic()
        if before.rows is not None and since is not None:
            self._prefetched = (since.position, before.rows)
        return before

    def after_call(
        self, message: dict[str, Any], *, usage: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any], AfterCall]:
        """What the turn does after a model call, in one transition of the store: the call's
        ``usage`` (the arguments of :meth:`record_usage`; ``None``: the model reported none)
        recorded, then the model's reply stored as :meth:`append_assistant` stores it and the
        lease renewed; or, when the lead asked the agent to stop meanwhile, the reply left
        out and the stop honoured (``stopped``). Returns the reply as stored, and what the
        transition read (the questions open to the agent when the reply called no tool)."""
        self.flush()
        stored = check.model_reply(
            message, max_argument_bytes=self.settings.max_tool_argument_bytes
        )
        after = self._router.after_call(self, stored, usage=usage)
        self.renewed_at = time.monotonic()
        if usage is not None and usage.get("window") is not None:
            self._checkpoint = dict(usage["window"])
        return stored, after

    def open_tool_calls(self) -> list[str]:
        return self._router.store.reads.open_tool_calls(self.agent_id)

    def transcript(self) -> list[dict[str, Any]]:
        return self._router.store.reads.transcript(self.agent_id)

    def history(self) -> list[dict[str, Any]]:
        """The transcript as the model sees it. The process keeps each agent's transcript as
        it last read it (:attr:`Store.transcripts`): a call reads only the entries appended
        since, by this turn, another process or the router (drained messages, tool results,
        answers). The list returned is the turn's own; its entries are shared with the
        process's copy and must not be changed in place."""
        cached = self.cached_transcript()
        with cached.lock:
            if len(self._history) > len(cached.entries) or self._generation != cached.generation:
                self._history = []  # the rows were read again whole
                self._generation = cached.generation
            self._history.extend(cached.entries[len(self._history) :])
        return self._history

    def cached_transcript(self) -> CachedTranscript:
        """This process's copy of the agent's transcript, brought up to date: the entries
        appended since it was last read are read (and only those)."""
        cached = self.kept()
        cached.refresh(self._router.store.reads.transcript_after)
        return cached

    def kept(self) -> CachedTranscript:
        """This process's copy of the agent's transcript as it is, read or not: its ``views``
        keep what the built-in loop derives from the transcript (its request window). Taken
        from the process's cache once per turn (which weighs what it holds of every agent on
        each take) and held by the turn: only this turn writes the agent's transcript while it
        runs."""
        if self._kept is None:
            self._kept = self._router.store.transcripts.get(self.agent_id)
        return self._kept

    def transcript_rows(
        self, after: int | None = None, *, also: Sequence[int] = ()
    ) -> list[tuple[int, dict[str, Any]]]:
        """The entries after position ``after`` (all with ``None``) and those at positions
        ``also``, with their positions, in order."""
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None and not also and prefetched[0] == after:
            return prefetched[1]
        return self._router.store.reads.transcript_after(self.agent_id, after, also=also)

    def window_checkpoint(self) -> dict[str, Any] | None:
        """Where the agent's request window stood when what it leaves out last moved (as
        :meth:`record_usage` was given it); ``None`` if it never did. Read by the claim, and
        kept as this turn records it."""
        return self._checkpoint

    def last_assistant(self) -> tuple[int, dict[str, Any]] | None:
        """The agent's last assistant entry, with its position in the transcript."""
        return self._router.store.reads.last_assistant(self.agent_id)

    def ask(
        self,
        target: str,
        question: str,
        *,
        tool_call_id: str,
        subtype: MessageSubtype | None = None,
        timeout_seconds: float | None = None,
    ) -> Question:
        """Open a question to ``target`` for the tool call ``tool_call_id`` and put this agent in
        ``waiting``; the question message is routed like any message. Refused with
        :class:`~agent_router.errors.AskRefusedError` if it would deadlock."""
        self.flush()
        return self._router.ask(
            self,
            target,
            question,
            tool_call_id=check.call_id(tool_call_id),
            subtype=subtype,
            timeout_seconds=timeout_seconds,
        )

    def wait_for(self, question: Question, *, block_seconds: float | None = None) -> WaitOutcome:
        """Block until the question is answered (its result is then in the transcript) or, after
        ``block_seconds``, suspend: the caller must then return without ending the turn."""
        self.flush()
        return self._router.wait_for(self, question, block_seconds=block_seconds)

    def wait_output(
        self, target: str, *, tool_call_id: str, timeout_seconds: float | None = None
    ) -> Question:
        """Wait for ``target``'s next output as the result of ``tool_call_id`` (then block with
        :meth:`wait_for`). Refused with :class:`~agent_router.errors.AskRefusedError` if it
        would deadlock."""
        self.flush()
        return self._router.wait_output(
            self, target, tool_call_id=check.call_id(tool_call_id), timeout_seconds=timeout_seconds
        )

    def tell_user(
        self,
        content: str,
        *,
        kind: UserMessageKind = UserMessageKind.PROGRESS,
        dedup_key: str | None = None,
    ) -> UserMessage:
        """Tell the user ``content`` (``progress``, or this turn's ``answer``)."""
        return self._router.tell_user(self, content, kind=kind, dedup_key=dedup_key)

    def ask_user(
        self, question: str, *, tool_call_id: str, timeout_seconds: float | None = None
    ) -> tuple[Question, UserMessage]:
        """Ask the user ``question`` as the result of ``tool_call_id``: the turn is suspended
        when this returns (return without ending it); the reply resumes the agent."""
        return self._router.ask_user(
            self,
            question,
            tool_call_id=check.call_id(tool_call_id),
            timeout_seconds=timeout_seconds,
        )

    def stop_requested(self) -> bool:
        """Has the lead asked this agent to stop? Checked by the loop at every boundary."""
        return self._router.store.reads.stop_requested(self.agent_id)

    def finish_stop(self, *, reason: str | None = None) -> None:
        """Honour a stop: the rest of the batch is ``cancelled``, the agent ``idle``; the
        ``stopped`` event says ``reason``, by default the one the stop was requested with."""
        self.flush()
        self._router.store.finish_stop(self.record, reason=reason)

    def charge_model_call(self) -> None:
        """Count the model call about to be made against the team's budgets; raises
        :class:`~agent_router.errors.BudgetExhaustedError` when one is spent (the turn must
        then stop: :meth:`finish_stop`). A host's own loop calls it before each model call."""
        self._router.charge_model_call(self)

    def record_usage(
        self,
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
        """Record a model call's tokens (and their cost by the price table) for this turn.
        ``context``: what the request left out of the transcript, given on the call where
        that changed (its ``model_call`` event carries it); ``window``: where the built-in
        loop's request window then stood (kept on the agent, see :meth:`window_checkpoint`);
        ``seconds``: how long the call took, recorded just after it returned (its event's
        ``ms``: the timeline draws the call ending at the event's time)."""
        return self._router.record_usage(
            self,
            model=model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            estimated=estimated,
            context=context,
            window=window,
            seconds=seconds,
        )

    def start_background(self, signature: Any) -> BackgroundJob:
        """Start the Celery task ``signature`` on this agent's behalf; its completion comes
        back as a ``notice`` (see :meth:`Router.track_background`)."""
        return self._router.track_background(self.team_id, self.display_name, signature)

    def heartbeat(self) -> bool:
        """Renew this turn's lease; ``False`` once it has been fenced (stop working)."""
        renewed = self._router.store.renew_lease(self.record)
        if renewed:
            self.renewed_at = time.monotonic()
        return renewed

    def suspend(self) -> bool:
        """Give up the worker while blocked in an ask; ``False`` if the answer already came."""
        self.flush()
        return self._router.store.suspend(self.record)

    def end(
        self, *, failed: bool = False, error: str | None = None, output: str | None = None
    ) -> EndOfTurn:
        """The end-of-turn hook, with the tool call results the turn carries: exactly one
        follow-up when wake messages are pending. ``output``: the turn's final reply, written
        in the end's one transaction: a lead's answer to the user, a sub-agent's completion
        report to its lead (waking it), in parts when it exceeds ``max_content_bytes``, each
        deduplicated by the turn (a retried end writes it once). A refused report refuses the
        end (:class:`~agent_router.errors.RefusedError`, the turn still running)."""
        return self._with_carried(
            lambda results: self._router.end_turn(
                self, failed=failed, error=error, results=results, output=output
            )
        )

    def _with_carried(self, write: Callable[[tuple[Result, ...]], T]) -> T:
        """``write`` given the tool call results the turn carries: no longer carried once it
        ran (written, or refused with the transition), unless the database was out of reach
        (not written, or not known to be: they go with the next write)."""
        results, self._carried = tuple(self._carried), []
        try:
            return write(results)
        except errors.StoreError as exc:
            if exc.transient:
                self._carried[:0] = results
            raise

    def state(self) -> AgentState:
        return self._router.store.reads.agent_by_id(self.agent_id).state

    def __repr__(self) -> str:
        return (
            f"Turn(team={self.team_id}, agent={self.display_name!r}, epoch={self.epoch}, "
            f"trigger={self.trigger.value})"
        )
