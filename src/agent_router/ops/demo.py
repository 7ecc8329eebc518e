"""The demo's team, driven by tools through the routing scenarios, explained from the ledger.

The scenarios carry the numbers of docs/design.md, section 3 (3.1 to 3.5). The user gives the
Team Leader instructions; the lead (a :class:`~agent_router.agents.llm.ScriptedModel` that turns
the ``@tool {json}`` lines of an instruction into tool calls) staffs its team with
``create_sub_agent`` and relays everything with its tools. Then:

- 3.1 the lead steers UI Operator_1 while it runs (``send_message_to_sub_agent``): the message is
  ``injected_inline`` and the model sees it before its next call, in the same turn;
- 3.2 Full-Stack Engineer_1 asks the lead (``ask_master``) and blocks; the lead answers with
  ``answer_sub_agent_question`` and the answer lands in the blocked call as its result;
- 3.3 the lead appends work to Full-Stack Engineer_1 once it completed: ``triggered_new_turn``;
- 3.5 UI Operator_1 asks Full-Stack Engineer_1 while it runs (``ask_other_agent``); its
  ``answer_other_agent`` becomes the asker's tool result;
- 3.4 the lead tells UI Operator_1 to wrap up and, while its final reply is being written (after
  its last drain), the user sends one more message: exactly one follow-up turn fires for it;
- the lead stops UI Operator_1 in that follow-up turn (``stop_sub_agent``): no dangling tool call,
  the agent is ``idle``.

The turns run in Celery workers (threads of this process, or other processes); the timeline is
read from the ledger, which is the source of truth wherever the turns ran.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec

from agent_router import errors
from agent_router.agents.llm import AWAIT_QUESTION, SCRIPTED_MODEL, directive
from agent_router.agents.roles import RoleCatalogue
from agent_router.domain import (
    RESTING_STATES,
    Agent,
    AgentState,
    Delivery,
    LedgerAction,
    Message,
    MessageStatus,
    MessageType,
    QuestionStatus,
    RouteOutcome,
    Team,
    TurnRecord,
    TurnStatus,
    TurnTrigger,
)
from agent_router.ops.checks import TeamReport, check_team, tool_pairing_problems
from agent_router.ops.preflight import Check
from agent_router.router import Router

UI_ROLE = "UI Operator"
ENGINEER_ROLE = "Full-Stack Engineer"
UI = f"{UI_ROLE}_1"
ENGINEER = f"{ENGINEER_ROLE}_1"

HEALTH_QUESTION = "Should /health also report whether the database is reachable?"
RESET_QUESTION = "Which endpoint sends the password-reset mail, and what does it take?"
TASK_UI = "Build the login page of the admin console."
TASK_ENGINEER = "Add a /health endpoint to the API.\n" + directive(
    "ask_master", question=HEALTH_QUESTION
)
STEER = "Do not create a new API yet: first check whether the existing auth module can be reused."
APPENDED_TASK = (
    "Also add a /ready endpoint for the load balancer. UI Operator_1 may ask you about the "
    "password-reset API meanwhile.\n@" + AWAIT_QUESTION
)
TASK_UI_2 = "Add a password-reset link to the login page.\n" + directive(
    "ask_other_agent", target=ENGINEER, question=RESET_QUESTION
)
WRAP_UP = "Time is up: wrap up and send me your report now."
RACE = "One more thing: also add a 'remember me' checkbox."

POLL_SECONDS = 0.02


class DemoTimeoutError(errors.AgentRouterError):
    """Raised when the team did not reach an expected point in time."""


#: One scenario check: the same value as a preflight check (what was checked, whether it held,
#: what was seen), with no hint.
CheckResult = Check


@dataclass(frozen=True, kw_only=True)
class DemoTeam:
    team: Team

    @property
    def lead(self) -> str:
        return self.team.lead.display_name


@dataclass(kw_only=True)
class DemoResult:
    team_id: int
    checks: list[CheckResult] = field(default_factory=list)
    report: TeamReport | None = None
    #: What a scenario was still waiting for when its step's time ran out (``None``: none did).
    timed_out: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def verdict(self) -> str:
        """The demo's last line: a scenario that ran out of time broke no guarantee."""
        if self.ok:
            return "all guarantees held"
        if self.timed_out is not None:
            return (
                "a scenario timed out (no guarantee was found broken): give each step more "
                "time with --timeout (AGENT_ROUTER_DEMO_TIMEOUT), or run it with fewer demos "
                "sharing the workers"
            )
        return "a guarantee was broken"


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
    return next(t for t in router.reads.turns(agent_id) if t.id == turn_id)


def has_stepped(router: Router, agent_id: int, turn_id: int, *, after: int = -1) -> bool:
    """The turn appended an assistant message with tool calls (it is busy working), after
    transcript position ``after``."""
    return any(
        e["turn_id"] == turn_id
        and e["position"] > after
        and e["payload"].get("role") == "assistant"
        and e["payload"].get("tool_calls")
        for e in router.reads.transcript_entries(agent_id)
    )


# ---------------------------------------------------------------------- the scenarios


def setup_team(router: Router, roles: RoleCatalogue | None = None) -> DemoTeam:
    """A new team on the scripted model (its sub-agents work through ``do_work``); its lead
    (with the demo catalogue's lead prompt) will create the sub-agents."""
    lead = (roles or RoleCatalogue.demo()).lead
    return DemoTeam(
        team=router.create_team(
            lead_system_prompt=lead.system_prompt if lead else None, model=SCRIPTED_MODEL
        )
    )


def instruction(text: str, *calls: str) -> str:
    return "\n".join([text, *calls])


P = ParamSpec("P")


def _check(name: str) -> Callable[[Callable[P, tuple[bool, str]]], Callable[P, CheckResult]]:
    """A check of the demo, named ``name``: the method says whether it held, and why."""

    def named(method: Callable[P, tuple[bool, str]]) -> Callable[P, CheckResult]:
        @functools.wraps(method)
        def check(*args: P.args, **kwargs: P.kwargs) -> CheckResult:
            ok, detail = method(*args, **kwargs)
            return CheckResult(name=name, ok=ok, detail=detail)

        return check

    return named


class _Scenarios:
    def __init__(self, router: Router, demo: DemoTeam, timeout: float) -> None:
        self.router = router
        self.demo = demo
        self.team_id = demo.team.id
        self.timeout = timeout

    # ------------------------------------------------------------------ helpers

    def tell_lead(self, text: str, *calls: str) -> Delivery:
        """The user instructs the lead; the lead acts with its tools."""
        return self.router.send(
            self.team_id,
            to=self.demo.lead,
            content=instruction(text, *calls),
            sender="user",
            type=MessageType.TASK,
        )

    def relay(self, to: str, content: str) -> Delivery:
        """Have the lead send ``content`` to ``to`` with send_message_to_sub_agent; returns the
        delivery of the message the lead's tool sent."""
        self.tell_lead(
            f"Tell {to} this.",
            directive("send_message_to_sub_agent", display_name=to, message=content),
        )
        found: list[Message] = []

        def sent() -> bool:
            found[:] = [
                m
                for m in self.router.messages(self.team_id)
                if m.target_name == to and m.content == content and m.source_name == self.demo.lead
            ]
            return bool(found)

        self.wait(sent, f"the lead to send {to} {content[:30]!r}")
        m = found[-1]
        return Delivery(
            message_id=m.id, outcome=m.outcome, target=to, seq=m.seq, epoch=0, duplicate=False
        )

    def agent(self, name: str) -> Agent:
        return self.router.agent(self.team_id, name)

    def wait(self, predicate: Callable[[], bool], what: str) -> None:
        wait_until(predicate, what, timeout=self.timeout)

    def turn_consuming(self, message_id: int, target: str) -> int:
        self.wait(
            lambda: consuming_turn(self.router, self.team_id, message_id) is not None,
            f"message {message_id} to reach {target}'s transcript",
        )
        turn_id = consuming_turn(self.router, self.team_id, message_id)
        assert turn_id is not None
        return turn_id

    def wait_turn_over(self, agent: Agent, turn_id: int) -> None:
        self.wait(
            lambda: (
                turn_record(self.router, agent.id, turn_id).ended_at is not None
                and self.router.reads.agent_by_id(agent.id).state in RESTING_STATES
            ),
            f"{agent.display_name}'s turn {turn_id} to end",
        )

    def find(self, predicate: Callable[[Message], bool], what: str) -> Message:
        found: list[Message] = []

        def seen() -> bool:
            found[:] = [m for m in self.router.messages(self.team_id) if predicate(m)]
            return bool(found)

        self.wait(seen, what)
        return found[0]

    # ------------------------------------------------------------------ the run

    def run(self) -> list[CheckResult]:
        ui, engineer = self.staff()
        checks = [self.check_created(ui, engineer), self.steer(ui)]
        engineer_turn, check = self.ask_master(engineer)
        checks.append(check)
        appended_turn, check = self.append_work(engineer, engineer_turn)
        checks.append(check)
        race_turn, check = self.ask_other(ui)
        checks.append(check)
        race, check = self.race(ui, race_turn)
        checks.append(check)
        return [*checks, *self.stop(ui, engineer, race, appended_turn)]

    def staff(self) -> tuple[Agent, Agent]:
        self.tell_lead(
            "Staff the team: a UI Operator for the login page, a Full-Stack Engineer for the API.",
            directive("create_sub_agent", role=UI_ROLE, task=TASK_UI),
            directive("create_sub_agent", role=ENGINEER_ROLE, task=TASK_ENGINEER),
        )
        self.wait(
            lambda: {a.display_name for a in self.router.agents(self.team_id)} >= {UI, ENGINEER},
            "the lead to create its sub-agents",
        )
        return self.agent(UI), self.agent(ENGINEER)

    def steer(self, ui: Agent) -> CheckResult:
        """3.1: UI Operator_1 is busy (it keeps working until the lead reviews its plan)."""
        ui_task = self.find(
            lambda m: m.target_name == UI and m.type is MessageType.TASK, "UI Operator_1's task"
        )
        ui_turn = self.turn_consuming(ui_task.id, UI)
        self.wait(lambda: has_stepped(self.router, ui.id, ui_turn), f"{UI} to start working")
        steer = self.relay(UI, STEER)
        self.wait_turn_over(ui, ui_turn)
        return self.check_steer(ui, ui_turn, steer)

    def ask_master(self, engineer: Agent) -> tuple[int, CheckResult]:
        """3.2: Full-Stack Engineer_1 asked the lead first thing; the lead answered."""
        ask = self.find(
            lambda m: m.type is MessageType.ASK and m.source_name == ENGINEER,
            f"{ENGINEER} to ask the lead",
        )
        engineer_turn = self.turn_consuming(
            self.find(
                lambda m: m.target_name == ENGINEER and m.type is MessageType.TASK,
                f"{ENGINEER}'s task",
            ).id,
            ENGINEER,
        )
        self.wait_turn_over(engineer, engineer_turn)
        return engineer_turn, self.check_ask_master(engineer, engineer_turn, ask)

    def append_work(self, engineer: Agent, engineer_turn: int) -> tuple[int, CheckResult]:
        """3.3: Full-Stack Engineer_1 completed; the lead appends work (and it will wait for a
        question from UI Operator_1 while it runs: 3.5)."""
        appended = self.relay(ENGINEER, APPENDED_TASK)
        appended_turn = self.turn_consuming(appended.message_id, ENGINEER)
        check = self.check_append(engineer, engineer_turn, appended, appended_turn)
        self.wait(
            lambda: has_stepped(self.router, engineer.id, appended_turn),
            f"{ENGINEER} to start its appended work",
        )
        return appended_turn, check

    def ask_other(self, ui: Agent) -> tuple[int, CheckResult]:
        """3.5: UI Operator_1's next task makes it ask the running Full-Stack Engineer_1."""
        task2 = self.relay(UI, TASK_UI_2)
        race_turn = self.turn_consuming(task2.message_id, UI)
        ask_other = self.find(
            lambda m: m.type is MessageType.ASK and m.source_name == UI, f"{UI} to ask {ENGINEER}"
        )
        self.wait(
            lambda: (
                self.router.question(ask_other.question_id or 0).status is not QuestionStatus.OPEN
            ),
            f"{ENGINEER} to answer {UI}",
        )
        return race_turn, self.check_ask_other(ui, ask_other)

    def race(self, ui: Agent, race_turn: int) -> tuple[Delivery, CheckResult]:
        """3.4: a message lands while UI Operator_1 writes its final reply."""
        answered_at = max(e["position"] for e in self.router.reads.transcript_entries(ui.id))
        self.wait(
            lambda: has_stepped(self.router, ui.id, race_turn, after=answered_at),
            f"{UI} to go on with its second task",
        )
        wrap = self.relay(UI, WRAP_UP)
        # Drained: the model, told to wrap up, writes its final reply next (it takes
        # scripted_write_seconds). Before that call the loop drains once more, until nothing is
        # pending, a few milliseconds later; a message sent in between would still be read in
        # this turn. Half the writing time later the last drain is done and the reply not yet.
        self.wait(
            lambda: (
                message(self.router, self.team_id, wrap.message_id).status
                is MessageStatus.DELIVERED
            ),
            f"{UI} to read the wrap-up message",
        )
        time.sleep(self.router.settings.scripted_write_seconds / 2)
        race = self.router.send(self.team_id, to=UI, content=RACE, sender="user")
        return race, self.check_race(ui, race_turn, wrap, race)

    def stop(
        self, ui: Agent, engineer: Agent, race: Delivery, appended_turn: int
    ) -> list[CheckResult]:
        """The follow-up turn keeps working on the race message; the lead stops it."""
        follow_up = self.turn_consuming(race.message_id, UI)
        self.wait(lambda: has_stepped(self.router, ui.id, follow_up), f"{UI} to work on it")
        self.tell_lead(f"Stop {UI}.", directive("stop_sub_agent", display_name=UI))
        wait_quiescent(self.router, self.team_id, timeout=self.timeout)
        return [
            self.check_engineer_append_done(engineer, appended_turn),
            self.check_stop(ui, follow_up),
        ]

    # ------------------------------------------------------------------ checks

    @_check("the lead created its sub-agents with create_sub_agent ({Role}_{n})")
    def check_created(self, ui: Agent, engineer: Agent) -> tuple[bool, str]:
        ledger = self.router.ledger(self.team_id)
        created = [
            e.detail.get("display_name") for e in ledger if e.action is LedgerAction.AGENT_CREATED
        ]
        prompts = [
            self.router.transcript(self.team_id, a.display_name)[0]["role"] == "system"
            for a in (ui, engineer)
        ]
        ok = created == [UI, ENGINEER] and all(prompts)
        return ok, f"created={created} system_prompt_snapshotted={prompts}"

    @_check("3.1 steer a running agent: injected inline, seen in the same turn")
    def check_steer(self, ui: Agent, turn_id: int, steer: Delivery) -> tuple[bool, str]:
        entries = self.router.reads.transcript_entries(ui.id)
        at = next((e["position"] for e in entries if e["message_id"] == steer.message_id), None)
        seen = at is not None and any(
            e["position"] > at and e["turn_id"] == turn_id and e["payload"]["role"] == "assistant"
            for e in entries
        )
        consumed = consuming_turn(self.router, self.team_id, steer.message_id)
        ok = steer.outcome is RouteOutcome.INJECTED_INLINE and consumed == turn_id and seen
        return ok, (
            f"outcome={steer.outcome.value} consumed_by_turn={consumed} "
            f"(running turn {turn_id}) answered_in_same_turn={seen}"
        )

    def _answer_in_call(self, asker: Agent, ask: Message) -> tuple[Message | None, bool]:
        """The answer to ``ask`` and whether it is the result of the asking tool call."""
        question = self.router.question(ask.question_id or 0)
        answer = (
            message(self.router, self.team_id, question.answer_message_id)
            if question.answer_message_id
            else None
        )
        entries = self.router.reads.transcript_entries(asker.id)
        in_call = answer is not None and any(
            e["message_id"] == answer.id
            and e["payload"].get("role") == "tool"
            and e["payload"].get("tool_call_id") == question.tool_call_id
            for e in entries
        )
        return answer, in_call

    @_check("3.2 a sub-agent asks the lead (ask_master): the answer lands in the blocked call")
    def check_ask_master(self, engineer: Agent, turn_id: int, ask: Message) -> tuple[bool, str]:
        answer, in_call = self._answer_in_call(engineer, ask)
        status = self.router.question(ask.question_id or 0).status
        ok = (
            answer is not None
            and answer.outcome is RouteOutcome.RESOLVED
            and answer.source_name == self.demo.lead
            and in_call
            and status is QuestionStatus.ANSWERED
        )
        return ok, (
            f"question={ask.question_id} status={status.value} "
            f"answer_outcome={answer.outcome.value if answer else None} "
            f"result_of_the_ask_call={in_call}"
        )

    @_check("3.3 append work to a completed agent: triggers a new turn")
    def check_append(
        self, engineer: Agent, first_turn: int, appended: Delivery, turn_id: int
    ) -> tuple[bool, str]:
        record = turn_record(self.router, engineer.id, turn_id)
        ok = (
            appended.outcome is RouteOutcome.TRIGGERED_NEW_TURN
            and turn_id != first_turn
            and record.trigger is TurnTrigger.NEW
        )
        return ok, (
            f"outcome={appended.outcome.value} new_turn={turn_id} "
            f"trigger={record.trigger.value} (first turn {first_turn})"
        )

    @_check("3.5 a sub-agent asks a running one (ask_other_agent): its answer is the result")
    def check_ask_other(self, ui: Agent, ask: Message) -> tuple[bool, str]:
        answer, in_call = self._answer_in_call(ui, ask)
        ok = (
            ask.outcome is RouteOutcome.INJECTED_INLINE
            and answer is not None
            and answer.source_name == ENGINEER
            and answer.outcome is RouteOutcome.RESOLVED
            and in_call
        )
        return ok, (
            f"ask_outcome={ask.outcome.value} (target running) "
            f"answer_outcome={answer.outcome.value if answer else None} "
            f"result_of_the_ask_call={in_call}"
        )

    @_check("3.3 the appended work was done and reported")
    def check_engineer_append_done(self, engineer: Agent, turn_id: int) -> tuple[bool, str]:
        reports = [
            m
            for m in self.router.messages(self.team_id)
            if m.source_agent_id == engineer.id and m.dedup_key == f"report:{turn_id}"
        ]
        return len(reports) == 1, f"completion reports of turn {turn_id}: {len(reports)}"

    @_check("3.4 message during the last output: exactly one follow-up turn")
    def check_race(
        self, ui: Agent, turn_id: int, wrap: Delivery, race: Delivery
    ) -> tuple[bool, str]:
        if race.outcome is not RouteOutcome.INJECTED_INLINE:
            return False, (
                f"missed the race window: the turn had already ended "
                f"(outcome={race.outcome.value}); raise scripted_write_seconds"
            )
        self.wait(
            lambda: turn_record(self.router, ui.id, turn_id).ended_at is not None,
            f"{UI}'s turn {turn_id} to end",
        )
        self.turn_consuming(race.message_id, UI)
        ledger = self.router.ledger(self.team_id)
        follow_ups = [
            e for e in ledger if e.action is LedgerAction.FOLLOW_UP and e.turn_id == turn_id
        ]
        later = [t for t in self.router.reads.turns(ui.id) if t.id > turn_id]
        consumed = consuming_turn(self.router, self.team_id, race.message_id)
        copies = sum(
            1
            for e in self.router.reads.transcript_entries(ui.id)
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
        return ok, (
            f"outcome={race.outcome.value} follow_ups={len(follow_ups)} "
            f"turns_after={[(t.id, t.trigger.value) for t in later]} consumed_by_turn={consumed} "
            f"copies_in_transcript={copies}"
        )

    @_check("stop_sub_agent: the running turn stops at a boundary, nothing left dangling")
    def check_stop(self, ui: Agent, turn_id: int) -> tuple[bool, str]:
        record = turn_record(self.router, ui.id, turn_id)
        agent = self.agent(UI)
        actions = [
            e.action
            for e in self.router.ledger(self.team_id)
            if e.agent_id == ui.id
            and e.action in (LedgerAction.STOP_REQUESTED, LedgerAction.STOPPED)
        ]
        problems = tool_pairing_problems(
            self.router.transcript(self.team_id, UI), open_allowed=False
        )
        reports = [
            m for m in self.router.messages(self.team_id) if m.dedup_key == f"report:{turn_id}"
        ]
        ok = (
            record.status is TurnStatus.STOPPED
            and agent.state is AgentState.IDLE
            and actions[-1:] == [LedgerAction.STOPPED]
            and not problems
            and not reports
        )
        return ok, (
            f"turn {turn_id} {record.status.value}, state={agent.state.value} "
            f"ledger={[a.value for a in actions]} dangling={problems} reports={len(reports)}"
        )


def run_scenarios(router: Router, demo: DemoTeam, *, timeout: float = 60.0) -> DemoResult:
    """Drive the scenarios, wait for the team to go quiet, and check everything."""
    result = DemoResult(team_id=demo.team.id)
    try:
        result.checks.extend(_Scenarios(router, demo, timeout).run())
    except DemoTimeoutError as exc:
        result.timed_out = str(exc)
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
