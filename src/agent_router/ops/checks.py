"""Invariant checks read back from the database: what the tests, the demo and the chaos run use
to prove the guarantees of DESIGN section 3 held for a team."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent_router.domain import AgentState, MessageStatus, TurnStatus

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
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        return (
            f"messages={self.messages} delivered={self.delivered} dropped={self.dropped} "
            f"pending={self.pending} lost={self.lost} duplicated={self.duplicated} "
            f"reordered={self.reordered} overlapping_turns={self.overlapping_turns} "
            f"dangling_tool_calls={self.dangling_tool_calls}"
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
    """Check guarantees 2-5 and 7 for a team. ``quiescent``: no turn may still be running, so
    pending wake messages and open tool calls count as violations."""
    store = router.store
    report = TeamReport()
    agents = {a.id: a for a in store.reads.agents(team_id)}
    messages = store.reads.messages(team_id)
    report.messages = len(messages)
    entries = {aid: store.reads.transcript_entries(aid) for aid in agents}
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
            # A stopped agent rests `idle` with its mailbox kept: those messages wait for its
            # next wake-up, they are not lost (any other idle agent is woken by a wake message).
            kept = target.state in (AgentState.TERMINATED, AgentState.IDLE)
            if quiescent and m.wake and not kept:
                report.lost += 1
                report.violations.append(
                    f"message {m.id} to {target.display_name} still pending with no turn to take it"
                )
        if n > 1:
            report.duplicated += 1
            report.violations.append(f"message {m.id} is in a transcript {n} times")
        if n and m.status is not MessageStatus.DELIVERED:
            report.violations.append(f"message {m.id} is in a transcript but {m.status.value}")

    for aid, agent in agents.items():
        drained = [
            by_id[e["message_id"]].seq
            for e in entries[aid]
            if e["message_id"] is not None and e["payload"].get("role") == "user"
        ]
        for a, b in itertools.pairwise(drained):
            if b <= a:
                report.reordered += 1
                report.violations.append(f"{agent.display_name}: seq {b} drained after seq {a}")
        transcript = [e["payload"] for e in entries[aid]]
        busy = agent.state in (AgentState.RUNNING, AgentState.WAITING)
        for problem in tool_pairing_problems(transcript, open_allowed=busy and not quiescent):
            if "never got a result" in problem:
                report.dangling_tool_calls += 1
            else:
                report.split_tool_results += 1
            report.violations.append(f"{agent.display_name}: {problem}")

        turns = store.reads.turns(aid)
        running = [t for t in turns if t.status is TurnStatus.RUNNING]
        if len(running) > 1 or (quiescent and running):
            report.overlapping_turns += 1
            report.violations.append(f"{agent.display_name}: turns {running} running at once")
        spans = sorted((t.started_at, t.ended_at, t.id) for t in turns if t.ended_at is not None)
        for (_s1, e1, id1), (s2, _e2, id2) in itertools.pairwise(spans):
            if e1 is not None and s2 < e1:
                report.overlapping_turns += 1
                report.violations.append(f"{agent.display_name}: turns {id1} and {id2} overlap")
    return report
