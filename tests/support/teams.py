"""Teams to look at: a huge one written with set-based SQL, and a busy one routed for real.

:func:`fill_huge_team` writes a team of tens of thousands of agents in a few statements (SQLite
and PostgreSQL), with the rows the router itself writes for that history: the lead hands every
sub-agent a task, each sub-agent's turn starts and ends, and each reports back to the lead; the
ledger holds the team's and agents' creation, every route and every turn's claim and end.

:func:`busy_team` routes a team's messages through the real :class:`~agent_router.Router`
(sends, turns, drains, model calls, tool calls, asks, answers, notices, refusals), then moves
each step's rows to the time a script gives it (:class:`Clock`), so that the team's history
spans minutes with bursts and idle gaps while the test takes seconds. :func:`slow_model_team`
is a team of one whose single model call takes 25 s, and :func:`blocked_team` one with an ask
still open.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from agent_router import MessageType, Router, errors
from agent_router.agents.toolkit import fail
from agent_router.domain import BudgetName, MessageSubtype, ToolOutcome, ToolRun
from agent_router.store.models import utcnow
from agent_router.turn import Turn

# ---------------------------------------------------------------- a huge team, in a few statements

#: Seconds over which the lead hands out the tasks; the reports come back in as many after them.
_HUGE_SPAN = 40.0

_SERIES = {
    "postgresql": "SELECT k FROM generate_series(1, :n) AS k",
    "sqlite": (
        "WITH RECURSIVE s(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM s WHERE k < :n) "
        "SELECT k FROM s"
    ),
}


def _at(dialect: str, seconds: str) -> str:
    """SQL for the time ``:t0`` plus ``seconds`` (an SQL expression), stored as the store
    stores times (naive UTC; on SQLite with microseconds, as SQLAlchemy writes them)."""
    if dialect == "postgresql":
        return f"(CAST(:t0 AS timestamp) + ({seconds}) * interval '1 second')"
    return f"(strftime('%Y-%m-%d %H:%M:%f', :t0, '+' || ({seconds}) || ' seconds') || '000')"


@dataclass(frozen=True, kw_only=True)
class HugeTeam:
    team_id: int
    agents: int  # sub-agents, and the lead besides
    messages: int
    seconds: float


def fill_huge_team(engine: sa.Engine, agents: int) -> HugeTeam:
    """A team of a lead and ``agents`` sub-agents (``Worker_1``...), each handed a task by the
    lead during the first 40 s and reporting back during the next 40 s."""
    dialect = engine.dialect.name
    series = _SERIES[dialect]
    step = _HUGE_SPAN / agents
    task_at = _at(dialect, f"0.5 + s.k * {step}")
    claim_at = _at(dialect, f"0.5 + s.k * {step} + 0.01")
    report_at = _at(dialect, f"{_HUGE_SPAN + 0.5} + s.k * {step}")
    end_at = _at(dialect, f"{_HUGE_SPAN + 0.5} + s.k * {step} + 0.01")
    # A story that has ended: the reports are in before now.
    t0 = (utcnow() - timedelta(seconds=2 * _HUGE_SPAN + 2)).replace(microsecond=0)
    # Each statement finds its rows by the worker's number k (display name Worker_k).
    workers = (
        f"({series}) AS s JOIN ar_agents w "
        "ON w.team_id = :team AND w.display_name = 'Worker_' || s.k"
    )
    role = _json(dialect, """'{"role": "Worker"}'""")
    route = _json(
        dialect, """'{"type": "' || m.type || '", "sender": "' || m.source_name || '"}'"""
    )
    claimed = _json(dialect, """'{"trigger": "new"}'""")
    ended = _json(dialect, """'{"state": "completed"}'""")
    empty = _json(dialect, "'{}'")
    turn_claimed = _cast(dialect, "'turn_claimed'", "ar_ledger_action")
    turn_ended = _cast(dialect, "'turn_ended'", "ar_ledger_action")
    statements = [
        f"""INSERT INTO ar_agents (team_id, display_name, role, is_lead, state, suspended, epoch,
               next_seq, next_position, stop_requested, created_at)
            SELECT :team, 'Worker_' || s.k, 'Worker', {_false(dialect)}, 'completed',
                   {_false(dialect)}, 1, 2, 2, {_false(dialect)}, {_at(dialect, "s.k * 0.000001")}
            FROM ({series}) AS s""",
        f"""INSERT INTO ar_ledger (team_id, agent_id, action, detail, created_at)
            SELECT :team, w.id, 'agent_created',
                   {role}, {_at(dialect, f"0.4 * s.k / {agents}")}
            FROM {workers}""",
        f"""INSERT INTO ar_turns (team_id, agent_id, epoch, trigger, status, started_at, ended_at)
            SELECT :team, w.id, 1, 'new', 'ended', {claim_at}, {end_at} FROM {workers}""",
        f"""INSERT INTO ar_messages (team_id, seq, source_name, source_agent_id, target_agent_id,
               type, content, wake, outcome, status, consumed_turn_id, consumed_at, created_at)
            SELECT :team, 1, 'Team Leader', :lead, w.id, 'task',
                   'Task ' || s.k || ': check one shard.', {_true(dialect)},
                   'triggered_new_turn', 'delivered', t.id, {claim_at}, {task_at}
            FROM {workers} JOIN ar_turns t ON t.agent_id = w.id""",
        f"""INSERT INTO ar_messages (team_id, seq, source_name, source_agent_id, target_agent_id,
               type, subtype, content, wake, outcome, status, created_at)
            SELECT :team, s.k, w.display_name, w.id, :lead, 'output', 'completion_report',
                   'Done: shard ' || s.k || ' checked.', {_false(dialect)}, 'queued', 'pending',
                   {report_at}
            FROM {workers}""",
        f"""INSERT INTO ar_ledger (team_id, agent_id, action, outcome, message_id, detail,
               created_at)
            SELECT m.team_id, m.target_agent_id, 'route', m.outcome, m.id,
                   {route},
                   m.created_at
            FROM ar_messages m WHERE m.team_id = :team""",
        f"""INSERT INTO ar_ledger (team_id, agent_id, action, turn_id, epoch, detail, created_at)
            SELECT t.team_id, t.agent_id, {turn_claimed}, t.id, 1, {claimed}, t.started_at
            FROM ar_turns t WHERE t.team_id = :team
            UNION ALL
            SELECT t.team_id, t.agent_id, {turn_ended}, t.id, 1, {ended}, t.ended_at
            FROM ar_turns t WHERE t.team_id = :team""",
        """UPDATE ar_agents SET next_seq = :agents + 1 WHERE id = :lead""",
    ]
    with engine.begin() as conn:
        team = conn.execute(
            sa.text("INSERT INTO ar_teams (created_at) VALUES (:t0) RETURNING id"), {"t0": t0}
        ).scalar_one()
        lead = conn.execute(
            sa.text(
                f"""INSERT INTO ar_agents (team_id, display_name, role, is_lead, state, suspended,
                       epoch, next_seq, next_position, stop_requested, created_at)
                    VALUES (:team, 'Team Leader', 'Team Leader', {_true(dialect)}, 'idle',
                            {_false(dialect)}, 0, 1, 0, {_false(dialect)}, :t0)
                    RETURNING id"""
            ),
            {"team": team, "t0": t0},
        ).scalar_one()
        conn.execute(
            sa.text(
                "INSERT INTO ar_ledger (team_id, agent_id, action, detail, created_at) "
                f"VALUES (:team, :lead, 'team_created', {empty}, :t0)"
            ),
            {"team": team, "lead": lead, "t0": t0},
        )
        params = {"team": team, "lead": lead, "n": agents, "agents": agents, "t0": t0}

        for statement in statements:
            conn.execute(sa.text(statement), params)
    if dialect == "postgresql":
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("ANALYZE"))
    return HugeTeam(team_id=team, agents=agents, messages=2 * agents, seconds=2 * _HUGE_SPAN + 1)


def _json(dialect: str, text: str) -> str:
    return _cast(dialect, text, "jsonb")


def _cast(dialect: str, text: str, pg_type: str) -> str:
    """PostgreSQL types a literal of a UNION as text: an enum or JSON column needs the cast."""
    return f"CAST({text} AS {pg_type})" if dialect == "postgresql" else text


def _true(dialect: str) -> str:
    return "true" if dialect == "postgresql" else "1"


def _false(dialect: str) -> str:
    return "false" if dialect == "postgresql" else "0"


# ---------------------------------------------------------------- a busy team, routed for real


@dataclass
class Clock:
    """The script's time: each step of the team is given a time in seconds since its start
    (:meth:`at`), and :meth:`warp` then moves every row the step wrote to that time."""

    marks: list[tuple[datetime, float]] = field(default_factory=list)
    now: float = 0.0
    #: When the script's time 0 is (default: when it started); a team whose story ends
    #: before the present sets it in the past.
    origin: datetime | None = None

    def at(self, seconds: float) -> None:
        """What the team does from here on happens ``seconds`` after its start."""
        self.marks.append((utcnow(), self.now))
        self.now = max(self.now, seconds)

    def __call__(self, real: datetime | None) -> datetime | None:
        """The script's time of a row written at ``real``."""
        if real is None:
            return None
        times = [m[0] for m in self.marks]
        index = bisect.bisect_right(times, real)
        script = self.marks[index][1] if index < len(self.marks) else self.now
        return self.start + timedelta(seconds=script)

    @property
    def start(self) -> datetime:
        if self.origin is not None:
            return self.origin
        return self.marks[0][0] - timedelta(seconds=self.marks[0][1])

    def warp(self, engine: sa.Engine, team_id: int) -> None:
        """Move every time of the team's rows (team, agents, messages, turns, questions,
        ledger) to the script's time of the step that wrote it."""
        self.at(self.now)
        columns = {
            "ar_teams": ("id", ["created_at"]),
            "ar_agents": ("team_id", ["created_at", "scheduled_at"]),
            "ar_messages": ("team_id", ["created_at", "consumed_at"]),
            "ar_turns": ("team_id", ["started_at", "ended_at", "lease_expires_at"]),
            "ar_questions": ("team_id", ["created_at", "closed_at", "deadline"]),
            "ar_ledger": ("team_id", ["created_at"]),
            "ar_transcript_entries": ("agent_id", ["created_at"]),
        }
        with engine.begin() as conn:
            for table, (key, names) in columns.items():
                where = (
                    f"{key} IN (SELECT id FROM ar_agents WHERE team_id = :team)"
                    if key == "agent_id"
                    else f"{key} = :team"
                )
                rows = conn.execute(
                    sa.text(f"SELECT id, {', '.join(names)} FROM {table} WHERE {where}"),
                    {"team": team_id},
                ).all()
                updates = [
                    {"id": row[0]}
                    | {n: self(_datetime(v)) for n, v in zip(names, row[1:], strict=True)}
                    for row in rows
                ]
                if updates:
                    sets = ", ".join(f"{n} = :{n}" for n in names)
                    conn.execute(sa.text(f"UPDATE {table} SET {sets} WHERE id = :id"), updates)


def _datetime(value: object) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


ROLES = ("Frontend Engineer", "Backend Engineer", "QA Engineer", "Data Engineer", "Tech Writer")
#: The model the scripted calls name, and the tools they call (with their MCP servers).
MODEL = "gpt-4.1-mini"
TOOLS = (("files__read_file", "files"), ("shell__run_tests", "shell"), ("search_docs", None))


def model_call(turn: Turn, seconds: float, prompt_tokens: int) -> None:
    """A model call of ``turn`` that took ``seconds``, recorded as the loop records it."""
    turn.record_usage(model=MODEL, prompt_tokens=prompt_tokens,
                      completion_tokens=prompt_tokens // 8 + 20, seconds=seconds)  # fmt: skip


def tool_call(turn: Turn, call: str, tool: str, server: str | None, seconds: float,
              failed: bool = False) -> None:  # fmt: skip
    """The model's call of ``tool`` and its result, appended as the loop appends them."""
    call_entry = {"id": call, "type": "function", "function": {"name": tool, "arguments": "{}"}}
    turn.append_assistant({"role": "assistant", "content": None, "tool_calls": [call_entry]})
    result = fail("3 tests failed", "tool_error") if failed else "all 42 tests pass"
    outcome = ToolOutcome.ERROR if failed else ToolOutcome.OK
    turn.append_tool_result(call, result, run=ToolRun(tool=tool, server=server, outcome=outcome,
                                                      seconds=seconds))  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class BusyTeam:
    team_id: int
    agents: list[str]  # the lead first
    messages: int  # routed, and refused
    questions: int
    seconds: float


class _Script:
    """Steps at script times, run in time order (a step may add later steps)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.steps: list[tuple[float, int, Callable[[], Any]]] = []
        self.order = 0

    def at(self, t: float, step: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """``step(*args, **kwargs)`` at ``t`` seconds."""
        self.order += 1
        call: Callable[[], Any] = functools.partial(step, *args, **kwargs)
        heapq.heappush(self.steps, (t, self.order, call))

    def run(self) -> None:
        while self.steps:
            t, _, step = heapq.heappop(self.steps)
            self.clock.at(t)
            step()


def busy_team(
    router: Router, *, agents: int = 30, messages: int = 2000, seconds: float = 80.0, seed: int = 7
) -> BusyTeam:
    """A team of ``agents`` (the lead and ``agents - 1`` sub-agents of five roles) that routes
    ``messages`` messages over ``seconds``, in three waves of work with idle gaps between them.
    In each wave the user asks the lead, the lead hands out tasks, the sub-agents' turns run:
    they stream progress reports to the lead (bursts between one pair), ask the lead or each
    other and get answered, talk among themselves, get notices from the system, and report;
    the lead's turns run as its mail comes in. At the end a retired agent is terminated and a
    send to it refused. Every message goes through the real router."""
    rng = random.Random(seed)
    clock = Clock()
    clock.at(0.0)
    team = router.create_team(
        budget={BudgetName.SUB_AGENTS_CREATED: None, BudgetName.SUB_AGENTS_ACTIVE: None}
    ).id
    lead = "Team Leader"
    subs = [router.create_agent(team, role=ROLES[i % len(ROLES)]).display_name
            for i in range(agents - 1)]  # fmt: skip
    script = _Script(clock)
    turns: dict[str, Turn] = {}
    waiting: set[str] = set()  # agents blocked in an ask
    reports: dict[tuple[int, str], float] = {}  # when each sub-agent reports, by wave
    count = {"messages": 0, "questions": 0}

    def send(to: str, content: str, sender: str, **kw: Any) -> None:
        router.send(team, to=to, content=content, sender=sender, **kw)
        count["messages"] += 1

    def claim(name: str) -> None:
        turn = router.claim_turn(team, name)
        if turn is not None:
            turn.drain()
            turns[name] = turn

    def end(name: str) -> None:
        turn = turns.pop(name, None)
        if turn is not None:
            turn.drain()
            turn.append_assistant({"role": "assistant", "content": "Done for now."})
            turn.end()

    def lead_turn(t: float, length: float) -> None:
        script.at(t, claim, lead)
        script.at(t + length * 0.8, call_model, lead, length * 0.6)
        script.at(t + length, end, lead)

    def call_model(name: str, seconds: float) -> None:
        turn = turns.get(name)
        if turn is not None and name not in waiting:
            model_call(turn, seconds, rng.randint(800, 12000))

    def call_tool(name: str, number: int, seconds: float) -> None:
        turn = turns.get(name)
        if turn is None or name in waiting:  # an open ask: no other call before its answer
            return
        tool, server = TOOLS[number % len(TOOLS)]
        call = f"tool-{name}-{number}".replace(" ", "-")
        tool_call(turn, call, tool, server, seconds, failed=rng.random() < 0.08)

    def work(name: str, start: float, stop: float, first: int) -> None:
        """A sub-agent's turn between its claim and its report: model calls, each followed by
        a tool call, end to end."""
        t, number = start + 0.1, first
        while True:
            thinking, running = 0.4 + rng.random() * 1.8, 0.2 + rng.random() * 2.4
            if t + thinking + running > stop - 0.3:
                break
            script.at(t + thinking, call_model, name, thinking)
            script.at(t + thinking + running + 0.02, call_tool, name, number, running)
            t += thinking + running + 0.05
            number += 1

    def ask(name: str, number: int, wave: int) -> None:
        turn = turns.get(name)
        # Only agents that wait on nobody: an ask to them cannot close a cycle of waits.
        peers = [n for n in turns if n not in waiting and n not in (name, lead)]
        if turn is None or name in waiting or clock.now + 4.0 > reports.get((wave, name), 0.0):
            return
        target = rng.choice(peers) if peers and number % 2 else lead
        call = f"call-{name}-{number}".replace(" ", "-")
        turn.append_assistant({"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function",
             "function": {"name": "ask_other_agent", "arguments": "{}"}}]})  # fmt: skip
        question = turn.ask(target, f"Which API version should part {number} use?",
                            tool_call_id=call)  # fmt: skip
        count["messages"] += 1
        count["questions"] += 1
        waiting.add(name)

        def answer() -> None:
            router.answer(question.id, f"Use v{number % 3 + 1}; it is in the changelog.")
            count["messages"] += 1
            waiting.discard(name)

        script.at(clock.now + 0.4 + rng.random() * 3.5, answer)

    # Three waves, with idle gaps between them; the last sub-agent is retired at the end.
    waves = [(f * seconds, g * seconds) for f, g in ((0.0125, 0.275), (0.45, 0.65), (0.8, 0.975))]
    retired = subs[-1]
    staff = subs[:-1]
    per_wave = (messages - 2) // len(waves)
    for w, (start, stop) in enumerate(waves):
        span = stop - start
        working = rng.sample(staff, k=min(len(staff), 14 + 5 * w))
        planned = 1 + len(working) * 2
        script.at(start, send, lead, f"Wave {w + 1}: plan the next part.", "user",
                  type=MessageType.TASK)  # fmt: skip
        lead_turn(start + 0.1, 1.6)
        for i, name in enumerate(working):
            t = start + 0.3 + i * 0.06
            script.at(t, send, name, f"Wave {w + 1}, part {i + 1}: implement it and report.",
                      lead, type=MessageType.TASK)  # fmt: skip
            claimed = t + 0.5 + rng.random()
            script.at(claimed, claim, name)
            report = reports[(w, name)] = start + span * (0.72 + 0.2 * rng.random())
            work(name, claimed, report, 100 * w)
            script.at(report, send, lead, f"Done: wave {w + 1}, part {i + 1}. All tests pass.",
                      name, type=MessageType.OUTPUT,
                      subtype=MessageSubtype.COMPLETION_REPORT)  # fmt: skip
            script.at(report + 0.05, end, name)

        def burst(name: str, t: float, n: int) -> None:
            for k in range(n):
                script.at(t + k * 0.03, send, lead, f"Progress: step {k + 1} done.", name,
                          type=MessageType.OUTPUT, subtype=MessageSubtype.PROGRESS_OUTPUT,
                          wake=False)  # fmt: skip

        asks = 10 + 3 * w
        planned += 2 * asks
        for q in range(asks):
            script.at(start + 3.0 + span * 0.55 * q / asks, ask, rng.choice(working), q, w)
        for name in working[-3:]:
            planned += 1
            script.at(start + span * 0.6, send, name, "Build 42 finished: 3 tests failed.",
                      "system", type=MessageType.NOTICE, wake=False)  # fmt: skip
        for t in (start + span * 0.35, start + span * 0.6, stop - 1.0):
            lead_turn(t, 0.8)
        rest = max(0, per_wave - planned)
        steering, peers = rest // 8, rest // 12
        for _ in range(steering):  # the lead steering its team, context only
            script.at(start + 2.0 + rng.random() * span * 0.6, send, rng.choice(working),
                      "Keep the changelog up to date.", lead, wake=False)  # fmt: skip
        for _ in range(peers):  # sub-agents telling each other
            talker, peer = rng.sample(working, 2)
            script.at(start + 2.0 + rng.random() * span * 0.6, send, peer,
                      f"FYI from {talker}: merged my branch, please rebase.", talker,
                      wake=False)  # fmt: skip
        left = rest - steering - peers
        while left > 0:  # the rest: bursts of progress reports to the lead
            n = min(left, rng.randint(8, 24))
            burst(rng.choice(working), start + 2.0 + rng.random() * span * 0.62, n)
            left -= n

    def top_up() -> None:
        """An ask the script planned may not have been asked (its asker was not running, or it
        would have closed a cycle of waits): a last burst of reports makes up the number."""
        for k in range(messages - 1 - count["messages"]):
            send(lead, f"Progress: final step {k + 1} done.", staff[0], type=MessageType.OUTPUT,
                 subtype=MessageSubtype.PROGRESS_OUTPUT, wake=False)  # fmt: skip

    script.at(seconds - 1.2, top_up)
    script.at(seconds - 1.0, router.terminate, team, retired, reason="no longer needed")

    def refused() -> None:
        try:
            router.send(team, to=retired, content="One more thing.", sender=lead)
        except errors.AgentTerminatedError:
            count["messages"] += 1  # refused, and in the ledger

    script.at(seconds - 0.5, refused)
    script.run()
    clock.at(seconds)
    clock.origin = utcnow() - timedelta(seconds=seconds + 1.0)  # a story that has ended
    clock.warp(router.store.engine, team)
    return BusyTeam(
        team_id=team,
        agents=[lead, *subs],
        messages=count["messages"],
        questions=count["questions"],
        seconds=seconds,
    )


def slow_model_team(router: Router, seconds: float = 25.0) -> int:
    """A team of one: the user asks the lead, whose turn makes one model call that takes
    ``seconds`` (recorded as the loop records it), then one quick tool call, and ends."""
    clock = Clock()
    clock.at(0.0)
    team = router.create_team().id
    router.send(team, to="Team Leader", content="Summarise the design review.", sender="user")
    clock.at(0.2)
    turn = router.claim_turn(team, "Team Leader")
    assert turn is not None
    turn.drain()
    clock.at(0.2 + seconds)
    model_call(turn, seconds, 48_000)
    clock.at(0.2 + seconds + 0.6)
    tool_call(turn, "call-notes", "files__write_file", "files", 0.55)
    clock.at(0.2 + seconds + 2.0)
    model_call(turn, 1.3, 49_000)
    turn.append_assistant({"role": "assistant", "content": "The review is summarised."})
    turn.end()
    clock.at(0.2 + seconds + 2.1)
    clock.origin = utcnow() - timedelta(seconds=clock.now + 2.0)
    clock.warp(router.store.engine, team)
    return team


def blocked_team(router: Router, blocked_for: float = 40.0) -> int:
    """A lead and two engineers: Backend Engineer_1 asked the lead a question
    ``blocked_for`` seconds ago and is still blocked; QA Engineer_1 asked Backend Engineer_1
    and was answered."""
    clock = Clock()
    clock.at(0.0)
    team = router.create_team().id
    backend = router.create_agent(team, role="Backend Engineer").display_name
    qa = router.create_agent(team, role="QA Engineer").display_name
    for name in (backend, qa):
        router.send(team, to=name, content="Build and test the export.", sender="Team Leader",
                    type=MessageType.TASK)  # fmt: skip
    clock.at(1.0)
    turns = {}
    for name in (backend, qa):
        turn = router.claim_turn(team, name)
        assert turn is not None
        turn.drain()
        turns[name] = turn
    clock.at(3.5)
    model_call(turns[qa], 2.4, 3000)
    turns[qa].append_assistant({"role": "assistant", "content": None, "tool_calls": [
        {"id": "ask-1", "type": "function",
         "function": {"name": "ask_other_agent", "arguments": "{}"}}]})  # fmt: skip
    question = turns[qa].ask(backend, "Which format does the export write?", tool_call_id="ask-1")
    clock.at(6.0)
    model_call(turns[backend], 4.9, 5200)
    clock.at(6.5)
    router.answer(question.id, "CSV, one row per message.", sender=backend)
    clock.at(9.0)
    tool_call(turns[backend], "call-1", "shell__run_tests", "shell", 2.4)
    clock.at(11.0)
    model_call(turns[backend], 1.9, 6100)
    turns[backend].append_assistant({"role": "assistant", "content": None, "tool_calls": [
        {"id": "ask-2", "type": "function",
         "function": {"name": "ask_master", "arguments": "{}"}}]})  # fmt: skip
    turns[backend].ask("Team Leader", "May the export drop empty rows?", tool_call_id="ask-2")
    clock.at(11.0)
    clock.origin = utcnow() - timedelta(seconds=11.0 + blocked_for)
    clock.warp(router.store.engine, team)
    with router.store.engine.begin() as conn:  # the open ask's deadline, 5 min after it
        conn.execute(
            sa.text("UPDATE ar_questions SET deadline = :at WHERE team_id = :team "
                    "AND status = 'open'"),
            {"at": clock.origin + timedelta(seconds=11.0 + 300.0), "team": team},
        )  # fmt: skip
    return team
