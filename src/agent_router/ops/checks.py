"""Invariant checks read back from the database: what the tests, the demo and the chaos run use
to prove the guarantees (docs/design.md) held for a team."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from agent_router.domain import (
    RESTING_STATES,
    Agent,
    AgentState,
    LedgerAction,
    LedgerEvent,
    Message,
    MessageStatus,
    Question,
    QuestionKind,
    QuestionStatus,
    TurnRecord,
    TurnStatus,
)
from agent_router.store import refusals, utcnow
from agent_router.store.quarantine import QUARANTINE_AFTER

if TYPE_CHECKING:
    from agent_router.router import Router


@dataclass(kw_only=True)
class TeamReport:
    messages: int = 0
    delivered: int = 0
    dropped: int = 0
    pending: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    overlapping_turns: int = 0
    dangling_tool_calls: int = 0
    split_tool_results: int = 0
    failed_turns: int = 0
    undelivered_reports: int = 0
    idle_with_wake: int = 0  # idle agents holding wake messages no turn will take
    stuck_turns: int = 0  # turns past their lease that no sweeper took over
    unanswerable_questions: int = 0  # open questions whose target will never run again
    quarantined: int = 0  # agents a sweeper repair kept failing for
    violations: list[str] = field(default_factory=list)  # a guarantee broken
    failures: list[str] = field(default_factory=list)  # work that failed or was not delivered

    @property
    def ok(self) -> bool:
        return not self.violations and not self.failures

    def summary(self) -> str:
        return (
            f"messages={self.messages} delivered={self.delivered} dropped={self.dropped} "
            f"pending={self.pending} lost={self.lost} duplicated={self.duplicated} "
            f"reordered={self.reordered} overlapping_turns={self.overlapping_turns} "
            f"dangling_tool_calls={self.dangling_tool_calls} failed_turns={self.failed_turns} "
            f"undelivered_reports={self.undelivered_reports} idle_with_wake={self.idle_with_wake} "
            f"stuck_turns={self.stuck_turns} "
            f"unanswerable_questions={self.unanswerable_questions} quarantined={self.quarantined}"
        )


def tool_pairing_problems(transcript: list[dict[str, Any]], *, open_allowed: bool) -> list[str]:
    """Guarantee 7 on one transcript: every assistant tool call gets exactly one ``tool`` result,
    the results follow their assistant message with no ``user`` entry in between, and no model
    output comes before all of them are in. ``open_allowed``: the last batch may still be running.
    """
    problems: list[str] = []
    open_calls: list[str] = []
    for i, entry in enumerate(transcript):
        role = entry.get("role")
        if role == "tool":
            call_id = entry.get("tool_call_id")
            if call_id in open_calls:
                open_calls.remove(call_id)
            else:
                problems.append(f"entry {i}: tool result for {call_id!r} matches no open call")
        elif open_calls:
            problems.append(f"entry {i}: {role} entry while tool calls {open_calls} are open")
            open_calls = []
        if role == "assistant":
            open_calls = [str(c["id"]) for c in entry.get("tool_calls") or []]
    if open_calls and not open_allowed:
        problems.append(f"tool calls {open_calls} never got a result")
    return problems


def check_team(router: Router, team_id: int, *, quiescent: bool = False) -> TeamReport:
    """Check guarantees 2-5, 7 and 9 for a team, and that nothing failed quietly or is owed
    with no way to be paid: a failed turn, an output the router refused to deliver to the
    lead, a turn past its lease that no sweeper took over, a wake message a resting agent
    holds with no turn to take it, a question whose target will never run again, an agent
    the sweeper's repairs keep failing for (quarantined). ``quiescent``: no turn may still be
    running, so every pending wake message and open tool call counts as a violation too.

    Each agent is checked on its own: a check that raises for one (its rows unreadable) is a
    violation naming it, and the others are still checked."""
    reads = router.reads
    report = TeamReport()
    agents = {a.id: a for a in reads.agents(team_id)}
    messages = reads.messages(team_id)
    ledger = reads.ledger(team_id)
    _check_failures(report, agents, ledger)
    report.messages = len(messages)
    entries = {aid: reads.transcript_entries(aid) for aid in agents}
    copies: dict[int, int] = {}
    for agent_entries in entries.values():
        for e in agent_entries:
            if e["message_id"] is not None:
                copies[e["message_id"]] = copies.get(e["message_id"], 0) + 1
    by_id = {m.id: m for m in messages}
    for m in messages:
        n = copies.get(m.id, 0)
        if m.status is MessageStatus.DELIVERED:
            report.delivered += 1
            if n == 0:
                report.lost += 1
                report.violations.append(f"message {m.id} marked delivered but not in a transcript")
        elif m.status is MessageStatus.DROPPED:
            report.dropped += 1
            if not m.drop_reason:
                report.violations.append(f"message {m.id} dropped without a reason")
        else:
            report.pending += 1
            target = agents[m.target_agent_id]
            if target.state is AgentState.TERMINATED:
                report.lost += 1
                report.violations.append(
                    f"message {m.id} to {target.display_name} is pending though it is "
                    "terminated (it should have been dropped with a reason)"
                )
            elif m.wake and (quiescent or _resting(router, m, target)):
                _check_pending_wake(report, m, target, ledger)
        if n > 1:
            report.duplicated += 1
            report.violations.append(f"message {m.id} is in a transcript {n} times")
        if n and m.status is not MessageStatus.DELIVERED:
            report.violations.append(f"message {m.id} is in a transcript but {m.status.value}")

    leases = reads.turn_leases(team_id)
    # An agent waiting on the user is at rest, its ask_user call open until the user replies.
    on_user = {
        q.asker_agent_id for q in reads.open_questions(team_id) if q.kind is QuestionKind.USER
    }
    for aid, agent in agents.items():
        try:
            turns = reads.turns(aid)
            _check_agent(
                report, agent, entries[aid], by_id, turns, quiescent and aid not in on_user
            )
            _check_leases(report, router, agent, turns, leases)
        except Exception as exc:  # one agent's rows, not the whole check
            report.violations.append(
                f"{agent.display_name}: could not be checked: {type(exc).__name__}: {exc}"
            )
    _check_questions(report, router, team_id, agents, messages, quiescent=quiescent)
    _check_quarantine(report, router, team_id, agents)
    return report


def _resting(router: Router, message: Message, target: Agent) -> bool:
    """``target`` rests (idle, completed) while ``message`` waits for it, and both are still
    so when read again: while turns run, the reads of a check are apart, so a message
    delivered since, or an agent scheduled since (a new epoch), is not taken for one left
    behind."""
    if target.state not in RESTING_STATES:
        return False
    return router.reads.message(message.id).status is MessageStatus.PENDING and _unchanged(
        router, target
    )


def _unchanged(router: Router, agent: Agent) -> bool:
    """The agent is in the state and epoch it was read in (no turn scheduled since)."""
    now = router.reads.agent_by_id(agent.id)
    return (now.state, now.epoch) == (agent.state, agent.epoch)


def _check_leases(
    report: TeamReport,
    router: Router,
    agent: Agent,
    turns: list[TurnRecord],
    leases: dict[int, datetime | None],
) -> None:
    """Guarantee 9: a turn whose lease ran out is taken over within a sweep period or two. One
    still running past that was left behind (no sweeper runs, or its repair keeps failing)."""
    grace = timedelta(seconds=2 * router.settings.sweep_seconds)
    now = utcnow()
    for turn in turns:
        lease = leases.get(turn.id)
        if turn.status is TurnStatus.RUNNING and lease is not None and lease < now - grace:
            late = (now - lease).total_seconds()
            report.stuck_turns += 1
            report.violations.append(
                f"{agent.display_name}: turn {turn.id} is {late:.0f}s past its lease and "
                "no sweeper took it over"
            )


def _check_questions(
    report: TeamReport,
    router: Router,
    team_id: int,
    agents: dict[int, Agent],
    messages: list[Message],
    *,
    quiescent: bool,
) -> None:
    """An open question (or wait for an output) whose target rests with nothing to wake it,
    or is terminated or gone: no turn of the target will ever run to answer it, and its asker
    waits for the deadline."""
    woken = {m.target_agent_id for m in messages if m.status is MessageStatus.PENDING and m.wake}
    for question in router.reads.open_questions(team_id):
        if question.kind is QuestionKind.USER:
            continue  # the user answers it, whatever the team does
        target = agents.get(question.target_agent_id)
        if target is not None:
            resting = target.state in RESTING_STATES and target.id not in woken
            if not resting and target.state is not AgentState.TERMINATED:
                continue
            if not quiescent and not _still_open(router, question, target):
                continue
        asker = agents.get(question.asker_agent_id)
        who = target.display_name if target is not None else f"agent {question.target_agent_id}"
        state = target.state.value if target is not None else "gone"
        report.unanswerable_questions += 1
        report.failures.append(
            f"question {question.id} from {asker.display_name if asker else '?'} to {who}: "
            f"{who} is {state} with nothing to wake it; no one will answer it before its "
            "deadline"
        )


def _still_open(router: Router, question: Question, target: Agent) -> bool:
    """The question is still open and its target as it was, read again."""
    return router.reads.question(question.id).status is QuestionStatus.OPEN and _unchanged(
        router, target
    )


def _check_quarantine(
    report: TeamReport, router: Router, team_id: int, agents: dict[int, Agent]
) -> None:
    """Agents a repair of the sweeper kept failing for: left alone until one succeeds."""
    for held in router.reads.quarantined(team_id):
        if held.failures < QUARANTINE_AFTER:
            continue
        agent = agents.get(held.agent_id)
        name = agent.display_name if agent is not None else f"agent {held.agent_id}"
        report.quarantined += 1
        report.failures.append(
            f"{name}: quarantined: the sweeper's {held.step.value} failed {held.failures} "
            f"times in a row since {held.first_failed_at:%Y-%m-%d %H:%M:%S} (last: "
            f"{held.error[:200]}); it is left alone until {held.until:%H:%M:%S}"
        )


def _check_agent(  # noqa: PLR0917 - one private call site
    report: TeamReport,
    agent: Agent,
    entries: list[dict[str, Any]],
    by_id: dict[int, Message],
    turns: list[TurnRecord],
    quiescent: bool,
) -> None:
    """Guarantees 4, 5 and 7 for one agent: drained in ``seq`` order, every tool call paired,
    never two turns at once."""
    drained = [
        by_id[e["message_id"]].seq
        for e in entries
        if e["message_id"] is not None and e["payload"].get("role") == "user"
    ]
    for a, b in itertools.pairwise(drained):
        if b <= a:
            report.reordered += 1
            report.violations.append(f"{agent.display_name}: seq {b} drained after seq {a}")
    transcript = [e["payload"] for e in entries]
    busy = agent.state in (AgentState.RUNNING, AgentState.WAITING)
    for problem in tool_pairing_problems(transcript, open_allowed=busy and not quiescent):
        if "never got a result" in problem:
            report.dangling_tool_calls += 1
        else:
            report.split_tool_results += 1
        report.violations.append(f"{agent.display_name}: {problem}")

    running = [t for t in turns if t.status is TurnStatus.RUNNING]
    listed = ", ".join(
        f"{t.id} (epoch {t.epoch}, started {t.started_at:%H:%M:%S})" for t in running
    )
    if len(running) > 1:
        report.overlapping_turns += 1
        report.violations.append(f"{agent.display_name}: turns {listed} running at once")
    elif quiescent and running:
        report.overlapping_turns += 1
        report.violations.append(
            f"{agent.display_name}: turn {listed} is still running where nothing should run"
        )
    spans = sorted((t.started_at, t.ended_at, t.id) for t in turns if t.ended_at is not None)
    for (_s1, e1, id1), (s2, _e2, id2) in itertools.pairwise(spans):
        if e1 is not None and s2 < e1:
            report.overlapping_turns += 1
            report.violations.append(f"{agent.display_name}: turns {id1} and {id2} overlap")


def _check_pending_wake(
    report: TeamReport, m: Message, target: Any, ledger: list[LedgerEvent]
) -> None:
    """A wake message still pending once nothing runs: lost, unless a stop kept it (a stopped
    agent rests `idle` with its mailbox kept) or its target is terminated."""
    if target.state is AgentState.IDLE:
        if not _kept_by_stop(m, ledger):
            report.idle_with_wake += 1
            report.violations.append(
                f"message {m.id} to {target.display_name} is waiting while it is idle"
            )
    elif target.state is not AgentState.TERMINATED:
        report.lost += 1
        report.violations.append(
            f"message {m.id} to {target.display_name} still pending with no turn to take it"
        )


def _kept_by_stop(message: Message, ledger: list[LedgerEvent]) -> bool:
    """A stopped agent rests ``idle`` with its mailbox kept: messages it held when it stopped
    wait for its next wake-up."""
    return any(
        e.action is LedgerAction.STOPPED
        and e.agent_id == message.target_agent_id
        and e.created_at >= message.created_at
        for e in ledger
    )


def _check_failures(report: TeamReport, agents: dict[int, Any], ledger: list[LedgerEvent]) -> None:
    """Failed turns, and outputs of agents the router refused to deliver to their lead."""
    names = {a.display_name for a in agents.values()}
    for e in ledger:
        if e.action is LedgerAction.TURN_ENDED and e.detail.get("failed"):
            name = agents[e.agent_id].display_name if e.agent_id in agents else e.agent_id
            error = str(e.detail.get("error") or "")
            report.failed_turns += 1
            report.failures.append(f"{name}: turn {e.turn_id} failed: {error[:200]}")
        elif (
            e.action is LedgerAction.SEND_REJECTED
            and e.detail.get("type") == "output"
            and e.detail.get("sender") in names
        ):
            report.undelivered_reports += 1
            report.failures.append(
                f"{e.detail['sender']}: {e.detail.get('subtype') or 'output'} to "
                f"{e.detail.get('to')} refused: {str(refusals.sentence(e.detail))[:200]}"
            )
