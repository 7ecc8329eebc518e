"""The chaos team's scripted agents: a host-style loop over the turn API whose every step is a
pure function of the transcript, so a recovered turn carries on where the dead one stopped.

Each assistant message holds one tool call (``send``, ``ask`` or ``answer``), and sends carry a
dedup key by index, so a redone send is never accepted twice. Workers load it through
``Settings.runtime_factory = "agent_router.ops.chaos_agent:chaos_runtime"``."""

from __future__ import annotations

import enum
import json
import logging
import threading
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from celery import Celery

from agent_router import errors, formats
from agent_router.agents.builder import scripted_models
from agent_router.agents.llm import ModelFactory
from agent_router.agents.tools import ToolRegistry, default_registry
from agent_router.broker import CeleryPublisher
from agent_router.domain import (
    MessageType,
    WaitOutcome,
)
from agent_router.router import Router
from agent_router.settings import Settings
from agent_router.turn import Turn
from agent_router.worker.runtime import Runtime

logger = logging.getLogger(__name__)

ROLE = "Chaos"
SUB_AGENTS = 5
#: Most tool calls one turn makes before it ends, so that every agent gets turns.
BURST = 4
TASK_PREFIX = "chaos sends="


class ChaosOutcome(enum.StrEnum):
    ENDED = "ended"
    SUSPENDED = "suspended"
    FENCED = "fenced"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # the database was out of reach: left to recovery


# ---------------------------------------------------------------------- the scripted agents


@dataclass(frozen=True, kw_only=True)
class _Action:
    tool: str  # send | ask | answer
    args: dict[str, Any]


def now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _envelope(entry: dict[str, Any]) -> formats.Envelope | None:
    try:
        return formats.parse(str(entry["payload"].get("content") or ""))
    except ValueError:
        return None


def next_action(name: str, peers: list[str], entries: list[dict[str, Any]]) -> _Action | None:
    """What the agent does next, from its transcript alone."""
    sends_quota = asks_quota = 0
    asks_to_me: list[tuple[int, str]] = []
    answered: set[int] = set()
    sends = asks = 0
    # A call that was interrupted (its worker died) may never have been made: it is made again,
    # under the same dedup key, so one that was made is not accepted twice.
    interrupted = {
        e["payload"].get("tool_call_id")
        for e in entries
        if e["payload"].get("role") == "tool"
        and str(e["payload"].get("content") or "").startswith("interrupted")
    }
    for entry in entries:
        payload = entry["payload"]
        if payload.get("role") in ("user", "tool"):
            # Envelopes are read from drained entries and tool results alike: an ask is
            # answered wherever it landed.
            env = _envelope(entry)
            if env is None:
                continue
            if env.type is MessageType.TASK and env.content.startswith(TASK_PREFIX):
                parts = dict(p.split("=", 1) for p in env.content.split()[1:])
                sends_quota, asks_quota = int(parts["sends"]), int(parts["asks"])
            elif env.type is MessageType.ASK and env.question_id is not None:
                asks_to_me.append((env.question_id, env.sender))
        elif payload.get("role") == "assistant":
            for call in payload.get("tool_calls") or []:
                tool = call["function"]["name"]
                if call["id"] in interrupted:
                    continue  # its worker died before it committed, perhaps: do it again
                if tool == "send":
                    sends += 1
                elif tool == "ask":
                    asks += 1
                elif tool == "answer":
                    answered.add(int(json.loads(call["function"]["arguments"])["question_id"]))
    for question_id, asker in asks_to_me:
        if question_id not in answered:
            return _Action(tool="answer", args={"question_id": question_id, "to": asker})
    me = sum(map(ord, name))
    if asks < asks_quota and asks * sends_quota <= sends * asks_quota:
        target = peers[(me + 3 * asks + 1) % len(peers)]
        return _Action(tool="ask", args={"to": target, "n": asks})
    if sends < sends_quota:
        return _Action(tool="send", args={"to": peers[(me + sends) % len(peers)], "n": sends})
    return None


class _Heartbeat:
    def __init__(self, turn: Turn, interval: float) -> None:
        self._turn = turn
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            with suppress(errors.AgentRouterError):
                if not self._turn.heartbeat():
                    return


def run_chaos_turn(
    router: Router, turn: Turn, *, models: ModelFactory, tools: ToolRegistry
) -> ChaosOutcome:
    """One turn of a scripted chaos agent (``models`` and ``tools`` are not used)."""
    del models, tools
    with _Heartbeat(turn, router.settings.heartbeat_seconds):
        try:
            return _chaos_steps(router, turn)
        except errors.StaleTurnError:
            return ChaosOutcome.FENCED
        except errors.StoreError as exc:
            if not exc.transient:
                return _fail(turn, exc)
            # As a host's loop should: the lease lapses and a recovery turn carries on.
            logger.warning("chaos turn interrupted: %r", exc, extra={"action": "turn_interrupted"})
            return ChaosOutcome.INTERRUPTED
        except Exception as exc:
            return _fail(turn, exc)


def _fail(turn: Turn, exc: Exception) -> ChaosOutcome:
    logger.warning("chaos turn failed: %r", exc, extra={"action": "chaos_turn_failed"})
    try:
        turn.end(failed=True, error=repr(exc)[:500])
    except errors.AgentRouterError:
        return ChaosOutcome.FENCED  # the lease will recover it
    return ChaosOutcome.FAILED


def _chaos_steps(router: Router, turn: Turn) -> ChaosOutcome:
    peers = [a.display_name for a in router.agents(turn.team_id) if a.id != turn.agent_id]
    for _step in range(BURST):
        while turn.drain():
            pass
        entries = router.reads.transcript_entries(turn.agent_id)
        action = next_action(turn.display_name, peers, entries)
        if action is None:
            break
        call_id = f"call_{len(entries)}"
        turn.append_assistant(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": action.tool, "arguments": json.dumps(action.args)},
                    }
                ],
            }
        )
        if action.tool == "ask":
            try:
                question = turn.ask(
                    action.args["to"],
                    f"{turn.display_name} asks #{action.args['n']}: status?",
                    tool_call_id=call_id,
                )
            except errors.AskRefusedError as exc:
                turn.append_tool_result(call_id, f"refused: {exc}")
                continue
            if turn.wait_for(question) is WaitOutcome.SUSPENDED:
                return ChaosOutcome.SUSPENDED
            continue  # the answer is the tool result, written by the router
        turn.append_tool_result(call_id, _act(router, turn, action))
    # No drain here: whatever arrived since the last one (an ask, say) stays pending, and the
    # end-of-turn hook fires the follow-up turn that handles it.
    turn.append_assistant({"role": "assistant", "content": "chaos: done for now"})
    turn.end()
    return ChaosOutcome.ENDED


def _act(router: Router, turn: Turn, action: _Action) -> str:
    """Send what ``action`` says: an answer to its question, or the agent's next message."""
    name = turn.display_name
    qid = int(action.args["question_id"]) if action.tool == "answer" else None
    if qid is None:
        content, dedup_key = (
            f"{name} message #{action.args['n']}",
            f"chaos:{name}:{action.args['n']}",
        )
    else:
        content, dedup_key = f"{name} answers question {qid}", f"answer:{qid}"
    try:
        router.send(
            turn.team_id,
            to=action.args["to"],
            content=content,
            sender=name,
            type=MessageType.MESSAGE if qid is None else MessageType.ANSWER,
            question_id=qid,
            dedup_key=dedup_key,
        )
    except errors.RefusedError as exc:  # e.g. the question expired meanwhile
        return f"refused: {exc}"
    return "sent" if qid is None else "answered"


def chaos_runtime(settings: Settings, app: Celery) -> Runtime:
    """``Settings.runtime_factory`` of the chaos workers."""
    return Runtime(
        router=Router(settings, publisher=CeleryPublisher(app)),
        models=scripted_models(settings),
        tools=default_registry(),
        app=app,
        runner=run_chaos_turn,
    )


# ---------------------------------------------------------------------- the harness
