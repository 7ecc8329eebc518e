"""The ledger explained: one line per event, as the demo and `agent-router ledger` print it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from agent_router.domain import (
    LedgerAction,
    LedgerEvent,
    Message,
)
from agent_router.router import Router
from agent_router.store import refusals


def _usage_text(d: dict[str, Any]) -> str:
    """A ``model_call`` event: the model (or that its server named none), the tokens, the
    cost by the price table (or that the table has no price for the model), and how long the
    call took when that was recorded."""
    cached = f" ({d.get('cached_tokens')} cached)" if d.get("cached_tokens") else ""
    estimated = " estimated" if d.get("estimated") else ""
    model = d.get("model") or "model not reported"
    cost = (
        "price unknown (not in AGENT_ROUTER_MODELS)"
        if d.get("unpriced")
        else f"${d.get('cost_usd', 0):.6f}"
    )
    took = f", took {d['ms'] / 1000:.2f} s" if isinstance(d.get("ms"), int) else ""
    return (
        f"model call ({model}): {d.get('prompt_tokens')} prompt{cached} + "
        f"{d.get('completion_tokens')} completion tokens{estimated}, {cost}{took}"
    )


def _budget_text(event: LedgerEvent) -> str | None:
    d = event.detail
    if event.action is LedgerAction.MODEL_CALL:
        return _usage_text(d)
    if event.action is LedgerAction.BUDGET_WARNING:
        return f"! budget {d.get('budget')} at {d.get('used')} of {d.get('limit')}: wrap up"
    if event.action is LedgerAction.BUDGET_EXHAUSTED:
        return (
            f"x budget {d.get('budget')} spent ({d.get('used')} of {d.get('limit')}): "
            "the team stops"
        )
    if event.action is LedgerAction.BUDGET_REFUSED:
        return f"x no new {d.get('role')}: budget {d.get('budget')} full ({d.get('limit')})"
    if event.action is LedgerAction.BUDGET_CHANGED:
        state = f"still spent: {d['exhausted']}" if d.get("exhausted") else "the team may go on"
        return f"budget set by {d.get('by')}: {d.get('limits')} ({state})"
    return None


def describe(event: LedgerEvent, messages: dict[int, Message]) -> str:
    """One human line for one ledger event."""
    d = event.detail
    budget = _budget_text(event)
    if budget is not None:
        return budget
    if event.action is LedgerAction.ROUTE:
        msg = messages.get(event.message_id or -1)
        kind = str(d.get("type", "?"))
        if msg is not None and msg.subtype is not None:
            kind = f"{kind}/{msg.subtype.value}"
        preview = ""
        if msg is not None:
            text = msg.content.strip().splitlines()[0] if msg.content.strip() else ""
            preview = f' "{text[:60]}{"…" if len(text) > 60 else ""}"'
        wake = "" if d.get("wake", True) else " (no wake)"
        return (
            f"<- {kind} from {d.get('sender')}{wake}{preview}: "
            f"{event.outcome.value if event.outcome else '?'} "
            f"[{d.get('state_before')} -> {d.get('state_after')}]"
        )
    if event.action is LedgerAction.TURN_CLAIMED:
        return f"> turn {event.turn_id} starts ({d.get('trigger')}, epoch {event.epoch})"
    if event.action is LedgerAction.TURN_ENDED:
        how = "failed" if d.get("failed") else ("suspended" if d.get("suspended") else "ends")
        return f"# turn {event.turn_id} {how} -> {d.get('state')}"
    if event.action is LedgerAction.FOLLOW_UP:
        return f"+ one follow-up turn scheduled (epoch {event.epoch})"
    if event.action is LedgerAction.DRAIN:
        return (
            f"drained {d.get('count')} message(s) (seq {d.get('first_seq')}..{d.get('last_seq')})"
            f" into turn {event.turn_id}"
        )
    if event.action is LedgerAction.CLAIM_REFUSED:
        return (
            f"turn task for epoch {event.epoch} refused: duplicate or stale "
            f"(current epoch {d.get('current_epoch')}, {d.get('state')})"
        )
    if event.action is LedgerAction.ASK:
        return f"? asks {d.get('target')} (question {d.get('question_id')}) and waits"
    if event.action is LedgerAction.WAIT_OUTPUT:
        return f"? waits for {d.get('target')}'s next output (question {d.get('question_id')})"
    if event.action is LedgerAction.QUESTION_RESOLVED:
        how = "a continuation turn resumes it" if d.get("suspended") else "the blocked call returns"
        return f"! question {d.get('question_id')} resolved: {how}"
    if event.action is LedgerAction.ASK_REFUSED:
        return f"x ask to {d.get('target')} refused: {d.get('reason')} {d.get('cycle') or ''}"
    if event.action is LedgerAction.SEND_REJECTED:
        why = d.get("error") or refusals.sentence(d) or d.get("reason")
        return (
            f"x {d.get('type') or 'message'} from {d.get('sender')} to {d.get('to')} refused: {why}"
        )
    if event.action is LedgerAction.STOP_REQUESTED:
        return f"stop requested ({d.get('reason')}): stops at its next boundary"
    if event.action is LedgerAction.STOPPED:
        return f"stopped ({d.get('reason')}) -> idle, mailbox kept"
    if event.action is LedgerAction.AGENT_CREATED:
        return f"joined the team as {d.get('role')}"
    if event.action is LedgerAction.TEAM_CREATED:
        return "team created"
    extra = " ".join(f"{k}={v}" for k, v in d.items() if v is not None)
    return f"{event.action.value} {extra}".strip()


def event_record(event: LedgerEvent, messages: dict[int, Message], t0: float) -> dict[str, Any]:
    """The JSON form of one timeline event (``--json``: one per line)."""
    return {
        "event": "ledger",
        "id": event.id,
        "t": round(event.created_at.timestamp() - t0, 3),
        "agent": event.agent_name,
        "action": event.action.value,
        "outcome": event.outcome.value if event.outcome else None,
        "message_id": event.message_id,
        "turn_id": event.turn_id,
        "epoch": event.epoch,
        "detail": event.detail,
        "text": describe(event, messages),
    }


class LedgerTail:
    """Follows a team's ledger from a thread and hands each new event, in order, to ``sink``."""

    def __init__(
        self,
        router: Router,
        team_id: int,
        sink: Callable[[dict[str, Any]], None],
        *,
        poll: float = 0.05,
    ) -> None:
        self.router = router
        self.team_id = team_id
        self.sink = sink
        self.poll = poll
        self._seen = 0
        self._t0: float | None = None
        self._messages: dict[int, Message] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="ledger-tail", daemon=True)

    def start(self) -> LedgerTail:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following, after handing over every event written so far."""
        self._stop.set()
        self._thread.join()
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            events = [e for e in self.router.ledger(self.team_id) if e.id > self._seen]
            if not events:
                return
            if any(e.message_id and e.message_id not in self._messages for e in events):
                self._messages = {m.id: m for m in self.router.messages(self.team_id)}
            if self._t0 is None:
                self._t0 = events[0].created_at.timestamp()
            for event in events:
                self._seen = event.id
                self.sink(event_record(event, self._messages, self._t0))
