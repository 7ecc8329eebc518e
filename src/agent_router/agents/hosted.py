"""The turn API for a host's own Celery task: what the built-in loop does, in pieces a host loop
calls in its own order.

An agent whose turns a host owns (``runner="chat.lead_turn"`` on the agent, its role or the
team's lead) gets every turn as a message for that task, with the fenced ``(agent_id, epoch)``
as its arguments. The task claims it and runs its own loop::

    @shared_task(name="chat.lead_turn", acks_late=True, reject_on_worker_lost=True)
    def lead_turn(agent_id: int, epoch: int) -> str:
        with hosted.claim(agent_id, epoch) as turn:
            if turn is None:                      # duplicate or stale delivery
                return "refused"
            while (text := turn.step(turn.complete(client, model="gpt-4o"))) is None:
                pass                              # tool calls ran; their results are in
            save_reply(turn.team_id, text)
        return turn.outcome

Every model call of the host's loop is counted as the built-in loop counts its own: charged to
the team's budgets before it is made and its usage (tokens, model, cost) recorded after it.
:meth:`HostedTurn.complete` does both around an OpenAI SDK client's
``chat.completions.create`` (streamed for a lead with ``stream_to_user``, or with
``stream=True``: the reply's pieces reach the team's feed readers as they come);
:meth:`HostedTurn.model_call` is the same for any other client (a block that charges on entry
and in which the host records the reply's usage, and hands each piece of a streamed reply to
``call.delta(text)``). :meth:`step`
refuses a reply whose model call was not counted, and a model call left without its usage ends
the turn as failed (:class:`UncountedModelCallError`): a loop cannot skip the count by
forgetting it. A spent budget raises :class:`~agent_router.errors.BudgetExhaustedError` from the
call, which ends the host's loop; the block stops the turn as the built-in loop does (open tool
calls get ``cancelled`` results, its questions are cancelled, the agent rests) and swallows the
error: ``outcome`` is ``stopped``.

:func:`claim` returns a :class:`HostedTurn` (or ``None``) and, on leaving the block, does what
the built-in loop does at the end of a turn: a sub-agent's final text goes to the lead as its
completion report, the end-of-turn hook runs (at most one follow-up), a failure ends the turn as
failed and tells the lead, a fenced turn writes nothing more, and a turn suspended in a blocking
tool (an ask, ``wait_sub_agent_output``) returns without ending: the answer schedules a
``continuation`` turn of the same task. A heartbeat renews the lease for the whole block.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_router import errors
from agent_router.agents import builder, loop
from agent_router.agents.context import count_tokens
from agent_router.agents.openai_model import assistant_message, request_messages, streamed_body
from agent_router.agents.protocol import quoted_replies
from agent_router.agents.tools import (
    ToolContext,
    ToolRegistry,
    TurnSuspended,
    team_registry,
)
from agent_router.agents.usage import Usage, usage_from_body
from agent_router.domain import Agent, Delta, MessageSubtype, TokenUsage
from agent_router.router import Router
from agent_router.store import Since
from agent_router.turn import Turn


class UncountedModelCallError(errors.TurnError):
    """Raised when a host's loop hands :meth:`HostedTurn.step` a reply whose model call was not
    counted (made outside :meth:`HostedTurn.model_call` and :meth:`HostedTurn.complete`), or
    leaves a model call without recording its usage: the turn ends as failed."""


class ModelCall:
    """One model call of a host's loop, counted (:meth:`HostedTurn.model_call`): charged to the
    team's budgets when it was opened; :meth:`reply` or :meth:`usage` records what it used.

    ``messages`` and ``tools`` are what to send: the transcript with every pending message
    drained into it (:meth:`HostedTurn.messages`, read after the charge, so a wrap-up notice the
    charge sent is in it) and the agent's tool schemas."""

    def __init__(self, hosted: HostedTurn, model: str | None, messages: list[dict[str, Any]]):
        self._hosted = hosted
        self.model = model
        self.messages = messages
        self.tools = hosted.tools
        self._stream = uuid.uuid4().hex
        self._pieces = itertools.count()
        # The call's span on the timeline: from here (what it sends is ready) to its usage.
        self._began = time.monotonic()
        #: What the call used, once recorded.
        self.recorded: TokenUsage | None = None

    def delta(self, text: str) -> None:
        """A piece of the reply's text as the model writes it (a streamed call), for the
        team's feed readers waiting now (:meth:`Router.events` items of kind ``delta``, one
        ``stream`` per call, ``seq`` from 0) and the hooks' ``after_delta``; nothing is
        stored: the reply reaches the feed whole when :meth:`HostedTurn.step` ends the turn
        with it."""
        if text:
            sink = self._hosted.router.delta_sink(self._hosted.team_id, self._hosted.display_name)
            sink(Delta(stream=self._stream, seq=next(self._pieces), text=text))

    def reply(self, response: Any) -> dict[str, Any]:
        """Record the usage of a Chat Completions ``response`` (an OpenAI SDK
        ``ChatCompletion`` or its JSON body; estimated from the request and the reply when it
        carries none) and return its assistant message, for :meth:`HostedTurn.step`."""
        body = response.model_dump() if hasattr(response, "model_dump") else response
        message = assistant_message(body)
        self.usage(usage_from_body(body), reply=message)
        return message

    def usage(self, usage: Any, *, reply: Mapping[str, Any] | None = None) -> TokenUsage:
        """Record the tokens this call used: the response's ``usage`` (an OpenAI SDK
        ``CompletionUsage``, a mapping with ``prompt_tokens`` and ``completion_tokens``, or a
        :class:`~agent_router.agents.usage.Usage`). ``None`` (a server that sends no usage):
        estimated from the request and ``reply``, the assistant message. Priced by the
        ``models`` table under the model the call was opened with. Once per call; written
        with the reply (:meth:`HostedTurn.step`), or at the end of the turn without one."""
        if self.recorded is not None:
            raise UncountedModelCallError("this model call's usage is already recorded")
        counted = _usage(usage)
        if counted is None:
            counted = Usage(
                prompt_tokens=count_tokens(self.messages, self.tools),
                completion_tokens=count_tokens([dict(reply)] if reply is not None else []),
                estimated=True,
            )
        usage_of: dict[str, Any] = {
            "model": self.model,
            "prompt_tokens": counted.prompt_tokens,
            "completion_tokens": counted.completion_tokens,
            "cached_tokens": counted.cached_tokens,
            "estimated": counted.estimated,
            "seconds": time.monotonic() - self._began,
        }
        _model, self.recorded = self._hosted.router.priced_usage(**usage_of)
        self._hosted._usage = usage_of
        self._hosted._counted = True
        return self.recorded


def _chunk_body(chunk: Any) -> Any:
    """A streamed chunk as its JSON body (an OpenAI SDK ``ChatCompletionChunk``, or already
    a mapping)."""
    return chunk.to_dict(warnings=False) if hasattr(chunk, "to_dict") else chunk


def _usage(usage: Any) -> Usage | None:
    """A reported usage as :class:`Usage`; ``None`` when there is none or it is unreadable."""
    if usage is None or isinstance(usage, Usage):
        return usage
    raw = usage.model_dump() if hasattr(usage, "model_dump") else usage
    return usage_from_body({"usage": raw})


@dataclass(eq=False)
class HostedTurn:
    """A claimed turn driven by a host's loop (see the module docstring)."""

    router: Router
    turn: Turn
    agent: Agent
    lead: str
    registry: ToolRegistry
    heartbeat: loop.Heartbeat
    #: How the block ended: ``ended``, ``failed``, ``fenced``, ``suspended`` or ``stopped``.
    outcome: str = ""
    #: The final reply's text once :meth:`step` returned it (the completion report).
    final: str | None = None
    _steps: int = field(default=0)
    _resumed: bool = field(default=False)
    _counted: bool = field(default=False)  # a model call was counted since the last step
    _usage: dict[str, Any] | None = field(default=None)  # its usage, written with the reply
    _length: int | None = field(default=None)  # the transcript's entries at the model call

    @property
    def team_id(self) -> int:
        return self.turn.team_id

    @property
    def display_name(self) -> str:
        return self.turn.display_name

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools this agent may call, as OpenAI function schemas (the built-in loop's)."""
        return self.registry.schemas(self.agent)

    def messages(self) -> list[dict[str, Any]]:
        """Drain every pending message into the transcript, then return the transcript (OpenAI
        chat format) as the model is to read it: what to send to the model next (its own
        earlier replies neutralised, as the built-in loop sends them). Raises (and the block
        ends the turn as the loop would) if the turn was fenced or the lead stopped the
        agent."""
        self._resume()
        loop._boundary(self.turn, self.heartbeat)
        loop._drain_all(self.router, self.turn)
        return quoted_replies(self.turn.transcript())

    def _resume(self) -> None:
        """A continuation (or a turn that finds its last batch unfinished) runs the calls
        still without a result first, as the built-in loop does."""
        if not self._resumed:
            self._resumed = True
            index, unfinished = loop._open_calls(self.turn)
            loop._run_calls(self.turn, self.heartbeat, unfinished, self.registry, self._ctx(index))

    def _record_usage(self) -> None:
        """The usage of a model call whose reply never reached :meth:`step`, recorded."""
        usage, self._usage = self._usage, None
        if usage is not None:
            loop._with_retries(lambda: self.turn.record_usage(**usage))

    def _ctx(self, reply_index: int) -> ToolContext:
        # reply_index: where the reply whose calls run sits in the transcript (it scopes the
        # tools' dedup keys, so a call id the model server reuses in a later reply is new).
        return ToolContext(
            router=self.router,
            turn=self.turn,
            agent=self.agent,
            settings=self.router.settings,
            reply_index=reply_index,
        )

    @contextlib.contextmanager
    def model_call(self, *, model: str | None) -> Iterator[ModelCall]:
        """One model call, counted: on entry it is charged to the team's budgets (a spent one
        raises :class:`~agent_router.errors.BudgetExhaustedError`, and the turn stops) and the
        pending messages are drained; inside, send ``call.messages`` and ``call.tools`` to
        ``model`` and record what came back with ``call.reply(response)`` or
        ``call.usage(response.usage)``. Leaving the block without either raises
        :class:`UncountedModelCallError`::

            with turn.model_call(model="gpt-4o") as call:
                reply = my_client.chat(call.messages, call.tools)
                call.usage(reply.usage, reply=reply.message)
            text = turn.step(reply.message)
        """
        self._resume()
        loop._unfenced(self.turn, self.heartbeat)
        self._record_usage()
        # One transition: the results carried, a stop honoured, the call charged, mail drained;
        # and the transcript read.
        rows = loop._before(self.router, self.turn, since=Since(None)).rows
        entries = self.turn.transcript() if rows is None else [entry for _, entry in rows]
        self._length = len(entries)
        call = ModelCall(self, model, quoted_replies(entries))
        yield call
        if call.recorded is None:
            raise UncountedModelCallError(
                f"a model call of {self.display_name} left its block without its usage: "
                "record it with call.reply(response) or call.usage(response.usage)"
            )

    def complete(
        self, client: Any, *, model: str, stream: bool | None = None, **request: Any
    ) -> dict[str, Any]:
        """One model call through an OpenAI SDK ``client`` (``openai.OpenAI()`` or any
        OpenAI-compatible server's), counted (:meth:`model_call`): sends the drained transcript
        and the agent's tools with ``model`` and the other ``request`` arguments
        (``temperature``, ...) to ``client.chat.completions.create``, records the response's
        usage and returns its assistant message, for :meth:`step`.

        ``stream`` (by default: ``stream_to_user`` for a lead, as the built-in loop does)
        streams the call (``stream=True``, the usage asked for in the last chunk): each piece
        of the reply's text goes to the team's feed readers as it arrives
        (:meth:`ModelCall.delta`), and the chunks are added up into the reply the same call
        answers unstreamed."""
        if stream is None:
            stream = self.router.settings.stream_to_user and self.agent.is_lead
        with self.model_call(model=model) as call:
            sent: dict[str, Any] = {"messages": request_messages(call.messages), **request}
            if call.tools:  # some servers reject an empty list
                sent["tools"] = call.tools
            if not stream:
                return call.reply(client.chat.completions.create(model=model, **sent))
            chunks = client.chat.completions.create(
                model=model, stream=True, stream_options={"include_usage": True}, **sent
            )
            try:
                return call.reply(streamed_body(map(_chunk_body, chunks), call.delta))
            finally:
                if callable(close := getattr(chunks, "close", None)):
                    close()  # the SDK's stream holds its HTTP response until closed

    def step(self, reply: dict[str, Any]) -> str | None:
        """Record the model's ``reply`` and run its tool calls with the built-in tools, each
        result appended to the transcript (a blocking tool's result is the answer itself).
        Returns the reply's text when it called no tool (the turn's final reply), else
        ``None``: call the model again (:meth:`complete`, :meth:`model_call`). Raises
        :class:`UncountedModelCallError` when no model call was counted since the last
        step."""
        if not self._counted:
            raise UncountedModelCallError(
                f"{self.display_name}'s loop gave a reply whose model call was not counted: "
                "call the model with turn.complete(client, ...) or in turn.model_call(...)"
            )
        self._counted = False
        self._steps += 1
        if self._steps > self.router.settings.max_turn_steps:
            raise loop.MaxStepsExceededError(
                f"no final reply after {self.router.settings.max_turn_steps} model calls"
            )
        loop._unfenced(self.turn, self.heartbeat)
        reply_index = len(self.turn.history()) if self._length is None else self._length
        # One transition: the usage recorded, the reply stored (its calls run under the ids the
        # transcript holds, a repeated id renamed), or a stop honoured.
        usage, self._usage, self._length = self._usage, None, None
        reply, after = self.turn.after_call(reply, usage=usage)
        if after.stopped:
            raise loop._Stopped
        calls: list[dict[str, Any]] = list(reply.get("tool_calls") or [])
        text = reply.get("content")
        if not calls:
            self.final = str(text or "")
            return self.final
        if text and not self.agent.is_lead:
            self._tell_lead(str(text), MessageSubtype.PROGRESS_OUTPUT, f"progress:{self._steps}")
        loop._run_calls(self.turn, self.heartbeat, calls, self.registry, self._ctx(reply_index))
        return None

    def report(self, text: str) -> None:
        """Send ``text`` to the lead as this sub-agent's completion report (wakes the lead).
        The block sends the final reply so by itself, with the end; one report per turn."""
        self._tell_lead(text, MessageSubtype.COMPLETION_REPORT, "report")

    def answer(self, question_id: int, text: str) -> None:
        """Answer a question asked of this agent by its id (the router knows who asked)."""
        self.router.answer(question_id, text, sender=self.display_name)

    def _tell_lead(self, text: str, subtype: MessageSubtype, key: str) -> None:
        loop._tell_lead(
            self.router,
            self.turn,
            self.lead,
            text,
            subtype=subtype,
            wake=subtype is MessageSubtype.COMPLETION_REPORT,
            dedup_key=f"{key}:{self.turn.id}",
        )


@contextlib.contextmanager
def claim(
    agent_id: int,
    epoch: int,
    *,
    router: Router | None = None,
    tools: ToolRegistry | None = None,
) -> Iterator[HostedTurn | None]:
    """Claim the fenced turn ``(agent_id, epoch)`` for a host's loop; ``None`` for a duplicate
    or stale delivery. ``router`` defaults to the worker's (``AGENT_ROUTER_*`` settings),
    ``tools`` to the worker's (:mod:`agent_router.agents.builder`: the multi-agent tools and
    what the agent's role declares)."""
    if router is None:
        router, worker_tools = builder.process_runtime()
        tools = tools or worker_tools
    turn = router.claim(agent_id, epoch)
    if turn is None:
        yield None
        return
    agent = turn.agent
    with loop.Heartbeat(turn, router.settings.heartbeat_seconds) as heartbeat:
        hosted = HostedTurn(
            router=router,
            turn=turn,
            agent=agent,
            lead=turn.lead,
            registry=tools or team_registry(),
            heartbeat=heartbeat,
        )
        try:
            yield hosted
            hosted._record_usage()
            if hosted.final is not None:
                # The lead's final reply is its answer to the user, a sub-agent's its report:
                # written with the end.
                loop.end_with_output(turn, hosted.final)
            else:
                loop._with_retries(turn.end)
            hosted.outcome = loop.TurnOutcome.ENDED
        except TurnSuspended:
            hosted.outcome = loop.TurnOutcome.SUSPENDED
        except loop._Stopped:
            hosted.outcome = loop.TurnOutcome.STOPPED
        except errors.BudgetExhaustedError as exc:
            # A model call was refused: the turn stops as the built-in loop's does (open tool
            # calls get `cancelled` results, its questions are cancelled, the agent rests).
            reason = str(exc)
            try:
                loop._with_retries(lambda: turn.finish_stop(reason=reason))
            except errors.StaleTurnError:
                hosted.outcome = loop.TurnOutcome.FENCED
                return
            hosted.outcome = loop.TurnOutcome.STOPPED
        except errors.StaleTurnError:
            hosted.outcome = loop.TurnOutcome.FENCED
        except Exception as exc:
            if isinstance(exc, errors.StoreError) and exc.transient:
                hosted.outcome = loop.interrupted(turn)  # left to recovery, not failed
                return
            hosted.outcome = loop.TurnOutcome.FAILED
            error = f"{type(exc).__name__}: {exc}"[:1000]
            try:
                hosted._record_usage()
                loop._with_retries(lambda: turn.end(failed=True, error=error))
            except errors.StaleTurnError:
                hosted.outcome = loop.TurnOutcome.FENCED
                return
            if not agent.is_lead:
                loop._notify_failure(router, turn, hosted.lead, error)
            raise
