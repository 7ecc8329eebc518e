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
            while (text := turn.step(my_model(turn.messages(), turn.tools))) is None:
                pass                              # tool calls ran; their results are in
            save_reply(turn.team_id, text)
        return turn.outcome

:func:`claim` returns a :class:`HostedTurn` (or ``None``) and, on leaving the block, does what
the built-in loop does at the end of a turn: a sub-agent's final text goes to the lead as its
completion report, the end-of-turn hook runs (at most one follow-up), a failure ends the turn as
failed and tells the lead, a fenced turn writes nothing more, and a turn suspended in a blocking
tool (an ask, ``wait_sub_agent_output``) returns without ending: the answer schedules a
``continuation`` turn of the same task. A heartbeat renews the lease for the whole block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from agent_router import errors
from agent_router.agents import builder, loop
from agent_router.agents.protocol import quoted_replies
from agent_router.agents.tools import ToolContext, ToolRegistry, TurnSuspended, team_registry
from agent_router.domain import Agent, MessageSubtype
from agent_router.router import Router
from agent_router.turn import Turn


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
        if not self._resumed:
            # A continuation (or a turn that finds its last batch unfinished) runs the calls
            # still without a result first, as the built-in loop does.
            self._resumed = True
            index, unfinished = loop._open_calls(self.turn)
            loop._run_calls(self.turn, self.heartbeat, unfinished, self.registry, self._ctx(index))
        loop._boundary(self.turn, self.heartbeat)
        loop._drain_all(self.router, self.turn)
        return quoted_replies(self.turn.transcript())

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

    def step(self, reply: dict[str, Any]) -> str | None:
        """Record the model's ``reply`` and run its tool calls with the built-in tools, each
        result appended to the transcript (a blocking tool's result is the answer itself).
        Returns the reply's text when it called no tool (the turn's final reply), else
        ``None``: call the model again with :meth:`messages`."""
        self._steps += 1
        if self._steps > self.router.settings.max_turn_steps:
            raise loop.MaxStepsExceededError(
                f"no final reply after {self.router.settings.max_turn_steps} model calls"
            )
        loop._boundary(self.turn, self.heartbeat)
        reply_index = len(self.turn.history())
        # As stored: its calls run under the ids the transcript holds (a repeated id renamed).
        reply = self.turn.append_assistant(reply)
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
        The block sends the final reply this way by itself; at most one report per turn."""
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
    agent = router.reads.agent_by_id(turn.agent_id)
    with loop.Heartbeat(turn, router.settings.heartbeat_seconds) as heartbeat:
        hosted = HostedTurn(
            router=router,
            turn=turn,
            agent=agent,
            lead=router.team(turn.team_id).lead.display_name,
            registry=tools or team_registry(),
            heartbeat=heartbeat,
        )
        try:
            yield hosted
            if not agent.is_lead and hosted.final is not None:
                hosted.report(hosted.final)
            loop._with_retries(turn.end)
            hosted.outcome = loop.TurnOutcome.ENDED
        except TurnSuspended:
            hosted.outcome = loop.TurnOutcome.SUSPENDED
        except loop._Stopped:
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
                loop._with_retries(lambda: turn.end(failed=True, error=error))
            except errors.StaleTurnError:
                hosted.outcome = loop.TurnOutcome.FENCED
                return
            if not agent.is_lead:
                loop._notify_failure(router, turn, hosted.lead, error)
            raise
