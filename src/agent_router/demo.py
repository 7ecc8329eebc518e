"""The seed's team, driven through the seed's scenarios, explained from the ledger.

The Team Leader (driven by this script; issue 5 gives it tools) hands tasks to ``UI Operator_1``
and ``Full-Stack Engineer_1``, then:

- 3.1 steers UI Operator_1 while it runs: the message is ``injected_inline`` and the model sees it
  before its next call, in the same turn;
- 3.3 appends a task to Full-Stack Engineer_1 once it completed: ``triggered_new_turn``;
- 3.4 tells UI Operator_1 to wrap up and, while its final reply is being written (after its last
  drain), sends one more message: the end-of-turn hook fires exactly one follow-up turn for it.

The turns run in Celery workers (threads of this process, or other processes); the timeline is
read from the ledger, which is the source of truth wherever the turns ran.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent_router import errors
from agent_router.checks import TeamReport, check_team
from agent_router.domain import (
    RESTING_STATES,
    Agent,
    Delivery,
    LedgerAction,
    LedgerEvent,
    Message,
    MessageStatus,
    MessageType,
    RouteOutcome,
    Team,
    TurnRecord,
    TurnTrigger,
)
from agent_router.router import Router

UI_ROLE = "UI Operator"
ENGINEER_ROLE = "Full-Stack Engineer"

TASK_UI = "Build the login page of the admin console."
TASK_ENGINEER = "Add a /health endpoint to the API."
STEER = "Do not create a new API yet: first check whether the existing auth module can be reused."
APPENDED_TASK = "Also add a /ready endpoint for the load balancer."
TASK_UI_2 = "Add a password-reset link to the login page."
WRAP_UP = "Time is up: wrap up and send me your report now."
RACE = "One more thing: also add a 'remember me' checkbox."

POLL_SECONDS = 0.02


class DemoTimeoutError(errors.AgentRouterError):
    """Raised when the team did not reach an expected point in time."""


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True, kw_only=True)
class DemoTeam:
    team: Team
    ui: Agent
    engineer: Agent

    @property
    def lead(self) -> str:
        return self.team.lead.display_name


@dataclass(kw_only=True)
class DemoResult:
    team_id: int
    checks: list[CheckResult] = field(default_factory=list)
    report: TeamReport | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


# ---------------------------------------------------------------------- waiting


def wait_until(
    predicate: Callable[[], bool], what: str, *, timeout: float, poll: float = POLL_SECONDS
) -> None:
    """Poll ``predicate`` until true; :class:`DemoTimeoutError` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise DemoTimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


def is_quiescent(router: Router, team_id: int) -> bool:
    """Every agent resting, read in one query: nothing is scheduled or running, and (since
    routing to a resting agent schedules it in the same transaction) no wake message waits."""
    return all(a.state in RESTING_STATES for a in router.agents(team_id))


def wait_quiescent(router: Router, team_id: int, *, timeout: float) -> None:
    wait_until(lambda: is_quiescent(router, team_id), "the team to go quiet", timeout=timeout)


def message(router: Router, team_id: int, message_id: int) -> Message:
    return next(m for m in router.messages(team_id) if m.id == message_id)


def consuming_turn(router: Router, team_id: int, message_id: int) -> int | None:
    return message(router, team_id, message_id).consumed_turn_id


def turn_record(router: Router, agent_id: int, turn_id: int) -> TurnRecord:
    return next(t for t in router.store.turns(agent_id) if t.id == turn_id)


def has_stepped(router: Router, agent_id: int, turn_id: int) -> bool:
    """The turn appended an assistant message with tool calls (it is busy working)."""
    return any(
        e["turn_id"] == turn_id
        and e["payload"].get("role") == "assistant"
        and e["payload"].get("tool_calls")
        for e in router.store.transcript_entries(agent_id)
    )


# ---------------------------------------------------------------------- the scenarios


def setup_team(router: Router) -> DemoTeam:
    team = router.create_team()
    ui = router.create_agent(team.id, role=UI_ROLE)
    engineer = router.create_agent(team.id, role=ENGINEER_ROLE)
    return DemoTeam(team=team, ui=ui, engineer=engineer)


class _Scenarios:
    def __init__(self, router: Router, demo: DemoTeam, timeout: float) -> None:
        self.router = router
        self.demo = demo
        self.team_id = demo.team.id
        self.timeout = timeout

    def send(self, to: Agent, content: str, type_: MessageType, *, wake: bool = True) -> Delivery:
        return self.router.send(
            self.team_id,
            to=to.display_name,
            content=content,
            sender=self.demo.lead,
            type=type_,
            wake=wake,
        )

    def wait(self, predicate: Callable[[], bool], what: str) -> None:
        wait_until(predicate, what, timeout=self.timeout)

    def turn_consuming(self, delivery: Delivery) -> int:
        self.wait(
            lambda: consuming_turn(self.router, self.team_id, delivery.message_id) is not None,
            f"message {delivery.message_id} to reach {delivery.target}'s transcript",
        )
        turn_id = consuming_turn(self.router, self.team_id, delivery.message_id)
        assert turn_id is not None
        return turn_id

    def wait_turn_over(self, agent: Agent, turn_id: int) -> None:
        self.wait(
            lambda: (
                turn_record(self.router, agent.id, turn_id).ended_at is not None
                and self.router.store.agent_by_id(agent.id).state in RESTING_STATES
            ),
            f"{agent.display_name}'s turn {turn_id} to end",
        )

    def run(self) -> list[CheckResult]:
        demo = self.demo
        ui_task = self.send(demo.ui, TASK_UI, MessageType.TASK)
        engineer_task = self.send(demo.engineer, TASK_ENGINEER, MessageType.TASK)

        # 3.1: UI Operator_1 is busy (it keeps working until the lead reviews its plan).
        ui_turn = self.turn_consuming(ui_task)
        self.wait(
            lambda: has_stepped(self.router, demo.ui.id, ui_turn),
            f"{demo.ui.display_name} to start working",
        )
        steer = self.send(demo.ui, STEER, MessageType.MESSAGE)
        self.wait_turn_over(demo.ui, ui_turn)
        checks = [self.check_steer(ui_turn, steer)]

        # 3.3: Full-Stack Engineer_1 completed; the lead appends a task.
        engineer_turn = self.turn_consuming(engineer_task)
        self.wait_turn_over(demo.engineer, engineer_turn)
        appended = self.send(demo.engineer, APPENDED_TASK, MessageType.TASK)
        checks.append(self.check_append(engineer_turn, appended))

        # 3.4: a message lands while UI Operator_1 writes its final reply.
        task2 = self.send(demo.ui, TASK_UI_2, MessageType.TASK)
        race_turn = self.turn_consuming(task2)
        self.wait(
            lambda: has_stepped(self.router, demo.ui.id, race_turn),
            f"{demo.ui.display_name} to start its second task",
        )
        wrap = self.send(demo.ui, WRAP_UP, MessageType.NOTICE, wake=False)
        # Drained means: the last drain of the turn happened, and the model (told to wrap up)
        # is now writing its final reply. The next message arrives after that drain.
        self.wait(
            lambda: (
                message(self.router, self.team_id, wrap.message_id).status
                is MessageStatus.DELIVERED
            ),
            f"{demo.ui.display_name} to read the wrap-up notice",
        )
        race = self.send(demo.ui, RACE, MessageType.MESSAGE)
        wait_quiescent(self.router, self.team_id, timeout=self.timeout)
        checks.append(self.check_race(race_turn, wrap, race))
        checks.append(self.check_engineer_append_done(appended))
        return checks

    # ------------------------------------------------------------------ checks

    def check_steer(self, turn_id: int, steer: Delivery) -> CheckResult:
        name = "3.1 steer a running agent: injected inline, seen in the same turn"
        entries = self.router.store.transcript_entries(self.demo.ui.id)
        at = next((e["position"] for e in entries if e["message_id"] == steer.message_id), None)
        seen = at is not None and any(
            e["position"] > at and e["turn_id"] == turn_id and e["payload"]["role"] == "assistant"
            for e in entries
        )
        consumed = consuming_turn(self.router, self.team_id, steer.message_id)
        ok = steer.outcome is RouteOutcome.INJECTED_INLINE and consumed == turn_id and seen
        return CheckResult(
            name=name,
            ok=ok,
            detail=f"outcome={steer.outcome.value} consumed_by_turn={consumed} "
            f"(running turn {turn_id}) answered_in_same_turn={seen}",
        )

    def check_append(self, first_turn: int, appended: Delivery) -> CheckResult:
        name = "3.3 append a task to a completed agent: triggers a new turn"
        turn_id = self.turn_consuming(appended)
        record = turn_record(self.router, self.demo.engineer.id, turn_id)
        ok = (
            appended.outcome is RouteOutcome.TRIGGERED_NEW_TURN
            and turn_id != first_turn
            and record.trigger is TurnTrigger.NEW
        )
        return CheckResult(
            name=name,
            ok=ok,
            detail=f"outcome={appended.outcome.value} new_turn={turn_id} "
            f"trigger={record.trigger.value} (first turn {first_turn})",
        )

    def check_engineer_append_done(self, appended: Delivery) -> CheckResult:
        name = "3.3 the appended task was worked and reported"
        turn_id = consuming_turn(self.router, self.team_id, appended.message_id)
        reports = [
            m
            for m in self.router.messages(self.team_id)
            if m.source_agent_id == self.demo.engineer.id and m.dedup_key == f"report:{turn_id}"
        ]
        return CheckResult(
            name=name,
            ok=len(reports) == 1,
            detail=f"completion reports of turn {turn_id}: {len(reports)}",
        )

    def check_race(self, turn_id: int, wrap: Delivery, race: Delivery) -> CheckResult:
        name = "3.4 message during the last output: exactly one follow-up turn"
        if race.outcome is not RouteOutcome.INJECTED_INLINE:
            return CheckResult(
                name=name,
                ok=False,
                detail=f"missed the race window: the turn had already ended "
                f"(outcome={race.outcome.value}); raise scripted_write_seconds",
            )
        ledger = self.router.ledger(self.team_id)
        follow_ups = [
            e for e in ledger if e.action is LedgerAction.FOLLOW_UP and e.turn_id == turn_id
        ]
        ui_turns = self.router.store.turns(self.demo.ui.id)
        later = [t for t in ui_turns if t.id > turn_id]
        consumed = consuming_turn(self.router, self.team_id, race.message_id)
        copies = sum(
            1
            for e in self.router.store.transcript_entries(self.demo.ui.id)
            if e["message_id"] == race.message_id
        )
        ok = (
            len(follow_ups) == 1
            and len(later) == 1
            and later[0].trigger is TurnTrigger.FOLLOW_UP
            and consumed == later[0].id
            and copies == 1
            and consuming_turn(self.router, self.team_id, wrap.message_id) == turn_id
        )
        return CheckResult(
            name=name,
            ok=ok,
            detail=f"outcome={race.outcome.value} follow_ups={len(follow_ups)} "
            f"turns_after={[(t.id, t.trigger.value) for t in later]} consumed_by_turn={consumed} "
            f"copies_in_transcript={copies}",
        )


def run_scenarios(router: Router, demo: DemoTeam, *, timeout: float = 60.0) -> DemoResult:
    """Drive the scenarios, wait for the team to go quiet, and check everything."""
    result = DemoResult(team_id=demo.team.id)
    try:
        result.checks.extend(_Scenarios(router, demo, timeout).run())
    except DemoTimeoutError as exc:
        result.checks.append(
            CheckResult(name="scenarios ran to the end", ok=False, detail=str(exc))
        )
        return result
    report = check_team(router, demo.team.id, quiescent=True)
    result.report = report
    result.checks.append(
        CheckResult(
            name="guarantees held for the team (check_team, quiescent)",
            ok=report.ok,
            detail=report.summary()
            + ("" if report.ok else " violations: " + "; ".join(report.violations[:5])),
        )
    )
    return result


# ---------------------------------------------------------------------- the timeline


def describe(event: LedgerEvent, messages: dict[int, Message]) -> str:
    """One human line for one ledger event."""
    d = event.detail
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
