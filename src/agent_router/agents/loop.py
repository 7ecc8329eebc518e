"""The built-in agent loop: one claimed turn, from first drain to end-of-turn hook.

Per step, two transitions of the store around the model call: before it
(:meth:`Turn.before_call`) the results of the last batch are written, a stop requested is
honoured, the call is charged and the pending messages enter the transcript; after it
(:meth:`Turn.after_call`) its usage is recorded and its reply appended. Its tool calls then run
in order, each result carried into the next transition; stop at a reply without tool calls. A
sub-agent's text goes to the lead: alongside tool calls as ``progress_output`` (context only),
as its final reply as ``completion_report`` (wakes the lead). The end-of-turn hook runs whatever
happens (with the results still carried); if the turn was fenced (a newer epoch took over) it
stops and writes nothing.

Blocking tools (asks, ``wait_sub_agent_output``) block the worker for at most
``ask_block_seconds``; the router writes their result. If the wait outlives that, the turn
suspends: the task ends *without* the end-of-turn hook, and the answer schedules a
``continuation`` turn, which first runs the calls of the interrupted batch still without a
result, then calls the model.

Replies real models write are repaired, never discarded: a malformed call gets its own error
result and the rest of the batch runs; an empty reply is asked for once more; a turn about to
end with an open question, a tool call written as text or an announced action gets one reminder
(see :mod:`agent_router.agents.reminders`). Every request carries the protocol section
(:mod:`agent_router.agents.protocol`) after the role prompt.

A turn makes at most ``max_turn_steps`` model calls. Before the last one the agent is told (a
``notice`` in its transcript) that this call must be its final reply; tool calls it still makes
then get a result saying they were not run, and the turn ends. Every model call (an empty
reply asked for again and a reminded step included) is charged to the team's budgets first
and its usage recorded after.

A failed lead turn is retried once: a ``notice`` tells the lead what failed and starts the
retry; a second failure in a row stops there. A failed sub-agent turn tells the lead.

Boundaries (before every model call, after it, and before every tool call) check two things: a
heartbeat (the process's one thread, beating for each of its turns) that renews the lease every
``heartbeat_seconds`` (when no transition of the turn did) found the turn fenced (stop, write
nothing), or the lead asked this agent to stop (the rest of the batch is ``cancelled``, the
agent becomes ``idle``): the transitions around a model call honour a stop themselves, and it
is read before each tool call of a batch but the first.
"""

from __future__ import annotations

import enum
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, TypeVar

from agent_router import errors, formats
from agent_router import validation as check
from agent_router.agents import reminders
from agent_router.agents.context import (
    MESSAGE_OVERHEAD,
    ContextWindow,
    compact,
    count_tokens,
    estimate_tokens,
)
from agent_router.agents.llm import Model, ModelFactory, complete
from agent_router.agents.openai_model import NAMELESS_TOOL
from agent_router.agents.protocol import protocol_section, with_section
from agent_router.agents.tools import (
    RESULT_RECORDED,
    ToolContext,
    ToolRegistry,
    ToolResult,
    TurnSuspended,
    fail,
    tool_run,
)
from agent_router.agents.usage import bounded
from agent_router.domain import (
    Agent,
    EndOfTurn,
    MessageSubtype,
    MessageType,
    Question,
    TurnStatus,
)
from agent_router.formats import keyed_parts
from agent_router.logfields import get_logger
from agent_router.router import Router
from agent_router.store import BeforeCall, FirstCall, Since
from agent_router.turn import Turn

logger = get_logger(__name__)

T = TypeVar("T")

#: Attempts at a write of a claimed turn (outputs, the end-of-turn hook) when the database fails
#: transiently. A Celery retry could not re-claim the turn; past these, lease expiry takes over.
END_ATTEMPTS = 3


class TurnOutcome(enum.StrEnum):
    ENDED = "ended"  # reply without tool calls; the hook ran
    FAILED = "failed"  # the loop raised; the hook ran with failed=True and the lead was told
    FENCED = "fenced"  # a newer epoch superseded this turn; it stopped and wrote nothing more
    SUSPENDED = "suspended"  # gave up its worker in a wait; a continuation turn resumes it
    STOPPED = "stopped"  # the lead stopped the agent: rest of the batch cancelled, agent idle
    # The database was out of reach, or refused the turn's end: the turn stopped where it was,
    # and its lease lapses; the sweeper then takes it over and a recovery turn carries on
    # from what committed.
    INTERRUPTED = "interrupted"


class MaxStepsExceededError(errors.TurnError):
    """Raised when a turn driven step by step made more model calls than
    ``Settings.max_turn_steps``; the built-in loop tells the model before its last call
    instead."""


#: What the agent reads before the last model call of a turn.
LAST_STEP_NOTICE = (
    "This turn has reached its limit of {n} model calls: this reply is its last. Write your "
    "final reply now (what you did, what is left); tool calls in it will not be run."
)
#: The result of a tool call made in the last model call of a turn.
NOT_RUN = "not run: the turn reached its limit of {n} model calls and ended"


class _Stopped(Exception):  # noqa: N818 - control flow inside the loop
    """The turn honoured a stop request."""


class Heartbeat:
    """Renews the turn's lease every ``interval`` seconds, for the whole turn (model calls and
    blocked waits included), unless a transition of the turn renewed it within the last
    ``interval`` (:attr:`Turn.renewed_at`: the transitions before and after a model call renew
    it), so that it writes only while a model call or a tool runs long. A renewal refused means
    the turn was fenced: :attr:`fenced` is set and the loop stops at its next boundary. One
    daemon thread of the process beats for every turn running in it (:class:`_Beats`), so that
    starting a turn starts no thread; a beat under way when the turn ends is waited for, and
    none comes after."""

    def __init__(self, turn: Turn, interval: float) -> None:
        self.turn = turn
        self.interval = interval
        self.fenced = threading.Event()
        self._lock = threading.Lock()  # held by a beat while it renews
        self._stopped = False
        self._tried = time.monotonic()  # the last beat's attempt (or the start)

    def __enter__(self) -> Heartbeat:
        _BEATS.add(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _BEATS.remove(self)
        with self._lock:
            self._stopped = True

    def due(self) -> float:
        """When (``time.monotonic``) the next beat is due: an interval after the lease was
        last renewed or a beat last tried."""
        return max(self.turn.renewed_at, self._tried) + self.interval

    def beat(self) -> None:
        """Renew the lease if a beat is due and the turn still runs."""
        with self._lock:
            if self._stopped or self.fenced.is_set() or time.monotonic() < self.due():
                return
            self._tried = time.monotonic()
            try:
                renewed = self.turn.heartbeat()
            except errors.AgentRouterError:
                # A database hiccup: the lease is long enough for the next beat to renew it.
                logger.warning("heartbeat failed", extra={"action": "heartbeat", **_ids(self.turn)})
                return
            if not renewed:
                logger.info("turn fenced", extra={"action": "heartbeat_fenced", **_ids(self.turn)})
                self.fenced.set()


class _Beats:
    """The process's heartbeat thread: it wakes when a turn's beat is due and beats, one turn
    after another (a renewal is one short statement; the lease outlasts several intervals)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._beating: set[Heartbeat] = set()
        self._thread: threading.Thread | None = None

    def add(self, heartbeat: Heartbeat) -> None:
        with self._changed:
            self._beating.add(heartbeat)
            # Started once per process (again in a child forked from it, where it is gone).
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
                self._thread.start()
            self._changed.notify()

    def remove(self, heartbeat: Heartbeat) -> None:
        with self._changed:
            self._beating.discard(heartbeat)

    def _run(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                # A fenced turn is beaten no more (it stops at its next boundary, which can be
                # a long model call away): its beat would return at once, again and again.
                beating = [h for h in self._beating if not h.fenced.is_set()]
                due = [h for h in beating if h.due() <= now]
                if not due:
                    soonest = min((h.due() for h in beating), default=None)
                    self._changed.wait(None if soonest is None else soonest - now)
                    continue
            for heartbeat in due:
                try:
                    heartbeat.beat()
                except Exception:  # the other turns' beats go on
                    logger.exception(
                        "heartbeat failed", extra={"action": "heartbeat", **_ids(heartbeat.turn)}
                    )


_BEATS = _Beats()


def claim(router: Router, agent_id: int, epoch: int | None = None) -> Turn | None:
    """The built-in loop's claim of the agent's scheduled turn (as :meth:`Router.claim` with
    ``builtin``), which makes the transition before the turn's first model call too, reading
    the entries the request window this process kept for the agent has not taken in: the
    first call then needs no round trip of its own."""
    kept = router.kept(agent_id).views.get(WINDOW_VIEW)
    since = _kept_since(kept) if isinstance(kept, ContextWindow) else None
    return router.claim(agent_id, epoch, builtin=True, first=FirstCall(since))


def run_turn(
    router: Router, turn: Turn, *, models: ModelFactory, tools: ToolRegistry
) -> TurnOutcome:
    """Run a claimed turn to its end. Any exception of the loop ends the turn as failed (a
    follow-up still fires for pending wake messages), but the database out of reach leaves it
    to recovery (:func:`interrupted`)."""
    with Heartbeat(turn, router.settings.heartbeat_seconds) as heartbeat:
        return _run(router, turn, heartbeat, models=models, tools=tools)


def _run(
    router: Router, turn: Turn, heartbeat: Heartbeat, *, models: ModelFactory, tools: ToolRegistry
) -> TurnOutcome:
    agent, lead = turn.agent, turn.lead
    try:
        model = models(agent)
        final = _steps(router, turn, agent, lead, heartbeat, model=model, tools=tools)
        if not agent.is_lead and not final.strip():
            final = f"{agent.display_name} ended its turn without a reply."
        end = end_with_output(turn, final)
        _log_end(turn, end, TurnOutcome.ENDED)
        return TurnOutcome.ENDED
    except TurnSuspended:
        logger.info("turn suspended", extra={"action": "turn_suspended", **_ids(turn)})
        return TurnOutcome.SUSPENDED
    except _Stopped:
        logger.info("turn stopped", extra={"action": "turn_stopped", **_ids(turn)})
        return TurnOutcome.STOPPED
    except errors.BudgetExhaustedError as exc:
        # Open tool calls get `cancelled` results, questions are cancelled, the agent rests.
        reason = str(exc)
        try:
            _with_retries(lambda: turn.finish_stop(reason=reason))
        except errors.StaleTurnError:
            return TurnOutcome.FENCED
        logger.info("turn stopped: budget", extra={"action": "turn_stopped", **_ids(turn)})
        return TurnOutcome.STOPPED
    except errors.StaleTurnError:
        logger.info("turn fenced", extra={"action": "turn_fenced", **_ids(turn)})
        return TurnOutcome.FENCED
    except Exception as exc:
        if isinstance(exc, errors.StoreError) and exc.transient:
            return interrupted(turn)
        return _fail(router, turn, agent, lead, exc)


def interrupted(turn: Turn) -> TurnOutcome:
    """The database is out of reach (not the turn's fault, and ending it would need the
    database too), or refused to write the turn's end. Its lease lapses, the sweeper takes it
    over, the recovery turn reads what committed."""
    logger.warning("turn interrupted: its writes do not reach the database", exc_info=True,
                   extra={"action": "turn_interrupted", **_ids(turn)})  # fmt: skip
    return TurnOutcome.INTERRUPTED


def _fail(router: Router, turn: Turn, agent: Agent, lead: str, exc: Exception) -> TurnOutcome:
    """End the turn as failed; a lead's turn is retried once, a sub-agent's lead is told."""
    error = failure_text(exc)
    logger.exception("turn failed", extra={"action": "turn_failed", **_ids(turn)})
    try:
        end = _with_retries(lambda: turn.end(failed=True, error=error))
    except errors.StaleTurnError:
        return TurnOutcome.FENCED
    except errors.StoreError:
        # Its end cannot be written: the turn is left as a crashed one is. Nothing renews its
        # lease once this returns (the heartbeat stops with the turn), so the sweeper takes it
        # over when the lease runs out, and the recovery turn reads what committed.
        return interrupted(turn)
    _log_end(turn, end, TurnOutcome.FAILED)
    if agent.is_lead:
        _retry_lead(router, turn, error)
    else:
        _notify_failure(router, turn, lead, error)
    return TurnOutcome.FAILED


def failure_text(exc: Exception) -> str:
    """Why a turn failed, in one line the lead (a model) and the ledger may read: the error's
    type and message, but for a database error, whose message is the driver's (SQL, a
    server's wording), only that the database refused the turn's write; the log has the
    rest."""
    if isinstance(exc, errors.StoreError):
        return (
            f"{type(exc).__name__}: the database refused a write of this turn (the worker's log "
            "has the database's own message)"
        )
    return f"{type(exc).__name__}: {exc}"[:1000]


def _boundary(turn: Turn, heartbeat: Heartbeat) -> None:
    """Between two steps: stop writing if fenced; honour a stop request."""
    _unfenced(turn, heartbeat)
    if turn.stop_requested():
        turn.finish_stop()
        raise _Stopped


def _unfenced(turn: Turn, heartbeat: Heartbeat) -> None:
    """Stop writing if the heartbeat found the turn fenced."""
    if heartbeat.fenced.is_set():
        raise errors.StaleTurnError(f"turn {turn.id} was fenced (its lease was taken over)")


def _before(router: Router, turn: Turn, *, since: Since | None) -> BeforeCall:
    """The turn's transition before a model call (:meth:`Turn.before_call`, reading the
    entries ``since`` says): a stop requested is honoured there, a spent budget raises; the
    messages it left pending (past one batch) and a wrap-up notice its charge sent are drained
    too (the entries it read are then read again)."""
    before = turn.before_call(since=since)
    if before.stopped:
        raise _Stopped
    if before.more or (before.budget is not None and before.budget.warn is not None):
        _drain_all(router, turn)
        before = replace(before, rows=None)
    return before


def _rows_wanted(turn: Turn) -> Since | None:
    """The transcript entries :func:`_window` reads next (``None``: it restores the window
    from its checkpoint, which reads other entries)."""
    kept = turn.kept().views.get(WINDOW_VIEW)
    if isinstance(kept, ContextWindow):
        return _kept_since(kept)
    return Since(None) if turn.window_checkpoint() is None else None


def _kept_since(kept: ContextWindow) -> Since:
    """The entries a kept window reads next: from the last it took in (:func:`_window`)."""
    return Since(kept.length - 2 if kept.length else None)


def _steps(
    router: Router,
    turn: Turn,
    agent: Agent,
    lead: str,
    heartbeat: Heartbeat,
    *,
    model: Model,
    tools: ToolRegistry,
) -> str:
    """The model/tool loop; returns the final reply's text."""
    schemas = tools.schemas(agent)
    tool_tokens = count_tokens([], schemas)
    window = getattr(model, "context_window", None)
    target = context_target(
        router, agent, tools, model_window=window if isinstance(window, int) else None
    )
    names = [str(s["function"]["name"]) for s in schemas]
    ctx = ToolContext(router=router, turn=turn, agent=agent, settings=router.settings)
    # A continuation (or any turn that finds its last batch unfinished) runs the rest first.
    index, unfinished = _open_calls(turn)
    _run_calls(turn, heartbeat, unfinished, tools, replace(ctx, reply_index=index))
    given: set[reminders.Nudge] = set()
    max_steps = router.settings.max_turn_steps
    for step in range(max_steps):
        _unfenced(turn, heartbeat)
        last = step == max_steps - 1
        if last:
            _tell_last_step(router, turn, max_steps)
        # One transition: the results carried, a stop honoured, the call charged, mail drained.
        roster = _before(router, turn, since=_rows_wanted(turn)).roster
        if last and not step:
            _drain_all(router, turn)  # the notice, if the claim drained the mailbox before it
        section = protocol_section(agent, roster, schemas, tools.roles)
        request = _request(turn, section, target=target, tool_tokens=tool_tokens)
        reply, usage = _reply(turn, model, request, schemas)
        _unfenced(turn, heartbeat)
        # As the transcript holds it: calls run so.
        reply = _unique_call_ids(reply, request.length, request.call_ids)
        # Only this turn writes the transcript now: the reply lands at the end.
        ctx = replace(ctx, reply_index=request.length)
        # One transition: the usage recorded, the reply appended (or a stop honoured).
        reply, after = turn.after_call(reply, usage=usage)
        if after.stopped:
            raise _Stopped
        calls: list[dict[str, Any]] = list(reply.get("tool_calls") or [])
        text = str(reply.get("content") or "")
        if last:
            for call in calls:
                turn.carry_tool_result(call["id"], NOT_RUN.format(n=max_steps))
        if not calls or last:
            # The questions open to the agent: read with the reply, unless it called tools.
            questions = reminders.open_questions(router, agent) if calls else after.questions
            nudge = _ending(
                router,
                turn,
                text,
                questions,
                read=request.read,
                names=names,
                given=given,
                last=last,
            )
            if nudge is None:
                return text
            given.add(nudge[0])
            reminders.remind(router, turn, *nudge, step)
            continue
        if text and not agent.is_lead:
            _tell_lead(
                router,
                turn,
                lead,
                text,
                subtype=MessageSubtype.PROGRESS_OUTPUT,
                wake=False,
                dedup_key=f"progress:{turn.id}:{step}",
            )
        _run_calls(turn, heartbeat, calls, tools, ctx)
    raise AssertionError("unreachable: the last step returns")


def _ending(
    router: Router,
    turn: Turn,
    text: str,
    questions: list[Question],
    *,
    read: list[dict[str, Any]],
    names: list[str],
    given: set[reminders.Nudge],
    last: bool,
) -> tuple[reminders.Nudge, str] | None:
    """The reminder due before a reply without tool calls ends the turn (none on the last
    step: that reply ends it), given the ``questions`` open to the agent. With no reminder due,
    a final text is the answer to the one question left open, if the model read it (``read``:
    the entries its request held)."""
    nudge = None if last else reminders.nudge_for(text, questions, names, given)
    if nudge is None and len(questions) == 1:
        reminders.answer_in_prose(router, turn, questions[0], text, read)
    return nudge


@dataclass(frozen=True, kw_only=True)
class _Request:
    """What one model call is sent, built from the agent's :class:`ContextWindow`."""

    messages: list[dict[str, Any]]
    tokens: int  # estimated, tool schemas included
    context: dict[str, Any] | None  # what is left out, when that changed: its ledger detail
    window: dict[str, Any] | None  # where the window stands, when that changed (kept)
    length: int  # the transcript's entries: the position of the reply
    call_ids: set[str]  # the tool call ids of the entries the request holds
    read: list[dict[str, Any]]  # the entries the request was built from


def context_target(
    router: Router, agent: Agent, tools: ToolRegistry, *, model_window: int | None = None
) -> int | None:
    """The tokens the agent's requests are kept near: its role's ``context_target_tokens``,
    else the settings', and never more than its role's window (else its model's,
    ``model_window``, when the model says it) less the reply's reserve."""
    role = tools.roles.get(agent.role) if tools.roles is not None else None
    settings = router.settings
    target = (role and role.context_target_tokens) or settings.context_target_tokens
    window = (role.context_window if role is not None else None) or model_window
    if window is not None:
        room = window - min(settings.context_reserve_tokens, window // 4)
        target = room if target is None else min(target, room)
    return target


def _request(
    turn: Turn,
    section: str,
    *,
    target: int | None,
    tool_tokens: int,
) -> _Request:
    """The next request: the agent's window over its transcript (kept in this process, so
    only the entries new since the last call are read), the protocol section, and its size;
    compacted further (:func:`compact`) only when the newest messages alone pass the
    target."""
    overhead = estimate_tokens(section) + MESSAGE_OVERHEAD + tool_tokens
    # The transcript's budget is the target less the section and the schemas, rounded up to a
    # step: workers that build an agent's window reach the same cut unless its team changed
    # enough to cross a step.
    reserve = -(-overhead // OVERHEAD_STEP) * OVERHEAD_STEP
    budget = None if target is None else max(target // 4, target - reserve)
    kept = turn.kept()
    with kept.lock:
        window = _window(turn, kept.views.get(WINDOW_VIEW), target=target, budget=budget)
        kept.views[WINDOW_VIEW] = window
        part = window.request()
        call_ids, read, length = window.call_ids, window.held(), window.length
        checkpoint = window.checkpoint() if part.moved else None
    messages = with_section(part.messages, section)
    tokens = part.tokens + overhead
    if target is not None and tokens > target:
        messages = compact(messages, limit=max(1, target - tool_tokens))
        tokens = count_tokens(messages) + tool_tokens
    context = None
    if part.moved:
        context = {
            "target_tokens": target,
            "left_out": part.left_out,
            "messages": len(messages),
            "request_tokens": tokens,
        }
        logger.info(
            "context compacted", extra={"action": "context_compacted", **context, **_ids(turn)}
        )
    return _Request(
        messages=messages,
        tokens=tokens,
        context=context,
        window=checkpoint,
        length=length,
        call_ids=call_ids,
        read=read,
    )


def _window(turn: Turn, kept: Any, *, target: int | None, budget: int | None) -> ContextWindow:
    """The agent's window, up to date: the one this process kept, given the entries appended
    since; else built again from where the last window that moved stood (the agent's
    checkpoint) and the entries from its cut on; else, when it never moved (the transcript
    fit, or no checkpoint is usable), from the whole transcript."""
    if isinstance(kept, ContextWindow):
        # From the last entry it took in, which must still be there as it was.
        rows = turn.transcript_rows(kept.length - 2 if kept.length else None)
        if kept.length == 0 or (rows and kept.follows(rows[0])):
            kept.retarget(target, budget)
            kept.take(rows[1:] if kept.length else rows)
            return kept
    checkpoint = turn.window_checkpoint()
    if checkpoint is not None:
        restored = ContextWindow.restore(
            checkpoint,
            lambda after, also: turn.transcript_rows(after, also=also),
            target=target,
            budget=budget,
        )
        if restored is not None:
            return restored
    window = ContextWindow(target=target, budget=budget)
    window.take(turn.transcript_rows())
    return window


#: Where an agent's :class:`ContextWindow` is kept beside its cached transcript.
WINDOW_VIEW = "context_window"
#: Tokens the protocol section and the tool schemas are reserved in, for a window's budget.
OVERHEAD_STEP = 1024


def _complete(
    turn: Turn,
    model: Model,
    request: _Request,
    schemas: list[dict[str, Any]],
    *,
    context: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One model call on the request (the model may compact what it sends further): its
    reply as the transcript holds it (:func:`check.model_reply`) and its usage for the turn
    to record (the arguments of :meth:`Turn.record_usage`; ``None``: the model reported none),
    with ``context`` (what the request left out, when that changed). An estimated usage counts
    the reply as kept: arguments too large to keep are never sent back, so they are not
    counted as if they were."""
    began = time.monotonic()
    result = complete(model, request.messages, schemas, prompt_tokens=request.tokens)
    seconds = time.monotonic() - began
    window = request.window if context is not None else None
    limit = turn.settings.max_tool_argument_bytes
    message = check.model_reply(result.message, max_argument_bytes=limit)
    usage = None if result.usage is None else bounded(result.usage)
    if usage is None:
        return message, None
    if usage.estimated and message != result.message:
        usage = replace(usage, completion_tokens=count_tokens([message]))
    return message, {
        "model": result.model,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
        "estimated": usage.estimated,
        "context": context,
        "window": window,
        "seconds": seconds,
    }


def _tell_last_step(router: Router, turn: Turn, max_steps: int) -> None:
    """The notice (context only, read before the next call) that this call is the last."""
    text = LAST_STEP_NOTICE.format(n=max_steps)
    reminders.notice(router, turn, text, f"last-step:{turn.id}", wake=False)


def _reply(
    turn: Turn, model: Model, request: _Request, schemas: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One model reply (charged by the caller) and its usage, for the caller to record; an
    empty one (no text, no tool calls) is asked for once more: the empty reply's usage is
    recorded, and the second call charged to the team's budgets too."""
    reply, usage = _complete(turn, model, request, schemas, context=request.context)
    if not reply.get("tool_calls") and not str(reply.get("content") or "").strip():
        logger.warning("empty model reply, asking again", extra={"action": "model_reply_empty"})
        if usage is not None:
            recorded = usage
            _with_retries(lambda: turn.record_usage(**recorded))
        turn.charge_model_call()
        reply, usage = _complete(turn, model, request, schemas)
        if not reply.get("tool_calls"):
            reply = {**reply, "content": str(reply.get("content") or "")}
    return reply, usage


def _unique_call_ids(reply: dict[str, Any], length: int, used: set[str]) -> dict[str, Any]:
    """Tool call ids unique within what the model reads back (``used``: the call ids of the
    entries its request held, of a transcript of ``length`` entries) and within the reply
    (:func:`check.unique_call_ids`, as the OpenAI model's replies are): some servers number
    calls from 0 in every reply, and a repeated id would pair a result with the wrong call."""
    calls = reply.get("tool_calls") or []
    fixed = check.unique_call_ids(calls, used, salt=f"{length}_")
    used.update(str(c.get("id")) for c in fixed if isinstance(c, dict))
    return reply if fixed is calls else {**reply, "tool_calls": fixed}


def _open_calls(turn: Turn) -> tuple[int, list[dict[str, Any]]]:
    """The transcript index of the last assistant message and its calls that still had no
    result when the turn was claimed, in order."""
    open_ids = turn.claimed_open_calls
    last = turn.last_assistant() if open_ids else None
    if last is None:
        return 0, []
    index, entry = last
    return index, [c for c in entry.get("tool_calls") or [] if c["id"] in open_ids]


def _run_calls(
    turn: Turn,
    heartbeat: Heartbeat,
    calls: list[dict[str, Any]],
    tools: ToolRegistry,
    ctx: ToolContext,
) -> None:
    """Run a batch's calls in order; each result is carried into the turn's next transition.
    A stop requested is honoured before every call but the first (the transition just made
    looked)."""
    for number, call in enumerate(calls):
        if number:
            _boundary(turn, heartbeat)
        else:
            _unfenced(turn, heartbeat)
        began = time.monotonic()
        result = _call_tool(tools, call, replace(ctx, call_id=str(call["id"])))
        if result is not RESULT_RECORDED:
            assert isinstance(result, str)
            run = tool_run(str(call["function"]["name"]), result, time.monotonic() - began)
            turn.carry_tool_result(call["id"], result, run=run)


def _drain_all(router: Router, turn: Turn) -> None:
    # A drain moves at most drain_batch_size messages (fewer enter the transcript when progress
    # notes were superseded); everything pending goes before the call.
    while turn.drain():
        pass


def _call_tool(tools: ToolRegistry, call: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """One call of a reply. A broken call is answered with an error result the model can act on
    (neutralised: it quotes what the model wrote); the other calls of the reply run as usual."""
    function = call["function"]
    name = str(function["name"])
    if name == NAMELESS_TOOL:
        return formats.escape_json(
            fail(
                "this tool call had no function name, so it did nothing; call one of your tools by "
                f"name: {', '.join(str(t['function']['name']) for t in tools.schemas(ctx.agent))}",
                "bad_call",
            )
        )
    raw = function.get("arguments") or "{}"
    if isinstance(raw, str) and raw.startswith(check.ARGUMENTS_NOT_KEPT):
        size = raw[len(check.ARGUMENTS_NOT_KEPT) :].partition("]")[0]
        return formats.escape_json(
            fail(
                f"the arguments of {name} were not kept ({size}), so the call did nothing; call "
                "it again with smaller arguments (split the work into several calls)",
                "arguments_too_large",
            )
        )
    what = f"the arguments of {name}"
    try:
        arguments = check.json_text(raw, what) if isinstance(raw, str) else raw
        if isinstance(arguments, str):  # arguments encoded twice
            arguments = check.json_text(arguments, what)
    except errors.InvalidArgumentError as exc:
        return formats.escape_json(
            fail(
                f"{exc}, so the call did nothing; call it again with the arguments as one "
                "complete JSON object",
                "bad_arguments",
            )
        )
    if not isinstance(arguments, dict):
        return formats.escape_json(
            fail(
                f'the arguments of {name} must be a JSON object, e.g. {{"name": "value"}}',
                "bad_arguments",
            )
        )
    return tools.call(name, arguments, ctx)


class ReportUndeliveredError(errors.AgentRouterError):
    """Raised when the router refused a sub-agent's output to its lead: the turn fails with
    the reason, so that the ledger, the failure notice and ``check`` show it."""


def _tell_lead(
    router: Router,
    turn: Turn,
    lead: str,
    text: str,
    *,
    subtype: MessageSubtype,
    wake: bool,
    dedup_key: str,
) -> None:
    """Send an output to the lead; an oversize one goes in parts (only the last one wakes the
    lead), so none is dropped. A refusal raises :class:`ReportUndeliveredError`."""
    if not text.strip():
        return
    parts = keyed_parts(check.scrub(text), router.settings.max_content_bytes, dedup_key)
    for number, (part, key) in enumerate(parts, 1):
        send = functools.partial(
            router.send,
            turn.team_id,
            to=lead,
            content=part,
            sender=turn.display_name,
            type=MessageType.OUTPUT,
            subtype=subtype,
            wake=wake and number == len(parts),
            dedup_key=key,
        )
        try:
            # Retrying is safe: the dedup key makes a second attempt return the first delivery.
            _with_retries(send)
        except errors.RefusedError as exc:
            raise _undelivered(turn, lead, subtype, exc) from exc


def end_with_output(turn: Turn, final: str) -> EndOfTurn:
    """End the turn with its final reply (:meth:`Turn.end`'s ``output``): a lead's answer to
    the user, a sub-agent's completion report to its lead, written with the end and
    deduplicated by turn (a retried end writes it once). A refused report fails the turn with
    the reason (:class:`ReportUndeliveredError`), as a report sent on its own did."""
    try:
        return _with_retries(lambda: turn.end(output=final))
    except errors.RefusedError as exc:
        if isinstance(exc, errors.TurnError):
            raise
        raise _undelivered(turn, turn.lead, MessageSubtype.COMPLETION_REPORT, exc) from exc


def _undelivered(
    turn: Turn, lead: str, subtype: MessageSubtype, exc: errors.RefusedError
) -> ReportUndeliveredError:
    text = f"{subtype.value} of turn {turn.id} not delivered to {lead}: {exc}"
    return ReportUndeliveredError(text)


def _notify_failure(router: Router, turn: Turn, lead: str, error: str) -> None:
    text = (
        f"{turn.display_name}'s turn {turn.id} failed: {error}. Send it a message to retry, or "
        "terminate it if its work is no longer needed."
    )
    _failure_notice(router, turn, text, to=lead, unsent="failure notice not sent")


def _retry_lead(router: Router, turn: Turn, error: str) -> None:
    """A failed lead turn is retried once, with a notice saying what failed; a turn that failed
    right after a failed turn is not retried again (it would fail the same way, forever)."""
    earlier = [t for t in router.reads.turns(turn.agent_id) if t.id < turn.id]
    if earlier and earlier[-1].status is TurnStatus.FAILED:
        logger.error(
            "lead turn failed twice in a row; not retried", extra={"action": "lead_failed"}
        )
        return
    text = (
        f"Your previous turn ({turn.id}) failed: {error}. This turn retries it: carry on from "
        "where the transcript ends."
    )
    _failure_notice(router, turn, text, to=None, unsent="lead retry notice not sent")


def _failure_notice(router: Router, turn: Turn, text: str, *, to: str | None, unsent: str) -> None:
    """The one notice a failed turn sends (``to``: the lead; ``None``: the agent itself, whose
    retry it starts); one that cannot be sent is logged as ``unsent``."""
    try:
        reminders.notice(router, turn, text, f"turn-failed:{turn.id}", to=to)
    except errors.AgentRouterError:
        logger.exception(unsent, extra={"action": "notice_failed"})


def _with_retries(operation: Callable[[], T]) -> T:
    for attempt in range(1, END_ATTEMPTS + 1):
        try:
            return operation()
        except errors.StoreError:
            if attempt == END_ATTEMPTS:
                raise
            logger.warning("database error, retrying", extra={"action": "turn_write_retry"})
            time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


def _ids(turn: Turn) -> dict[str, Any]:
    """Who a turn's log records are about: shown in the text by ``ops.logs``."""
    return {
        "team_id": turn.team_id,
        "agent": turn.display_name,
        "agent_id": turn.agent_id,
        "turn_id": turn.id,
        "epoch": turn.epoch,
    }


def _log_end(turn: Turn, end: EndOfTurn, outcome: TurnOutcome) -> None:
    # The store's turn_ended ledger event is the turn's end at INFO; this adds the loop's view.
    logger.debug(
        "turn ended",
        extra={
            "action": "turn_end",
            "outcome": outcome.value,
            "follow_up": end.follow_up,
            "state": end.state.value,
            **_ids(turn),
        },
    )
