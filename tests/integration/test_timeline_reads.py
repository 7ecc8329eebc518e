"""The timeline's reads (``store.reads.team_window`` and ``activity``), on both backends: a
page of lanes and a window of time of a busy team routed for real, read whole or in pieces
(the pieces add up to the whole, nothing twice, nothing missed), filtered by name, focused on
one agent, counted by bucket; and one snapshot, so that an agent's lane and its turns agree
while a writer ends the turn in the middle of the read."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event

from agent_router import AgentState, MessageType, Router, Settings, errors
from agent_router.domain import ToolOutcome, ToolRun
from agent_router.outbox import RecordingPublisher
from agent_router.store.timeline import TimelineQuery
from tests.integration.helpers import start_running
from tests.support.teams import (
    MODEL,
    TOOLS,
    BusyTeam,
    blocked_team,
    busy_team,
    model_call,
    slow_model_team,
    tool_call,
)


@pytest.fixture
def router(database_url: str) -> Iterator[Router]:
    r = Router(Settings(database_url=database_url), publisher=RecordingPublisher())
    yield r
    r.close()


@pytest.fixture
def team(router: Router) -> BusyTeam:
    return busy_team(router, agents=8, messages=240, seconds=40.0)


def _ids(arrows: list[Any]) -> list[int]:
    return [a.ledger_id for a in arrows]


def test_the_whole_window_holds_every_message_in_time_order(router: Router, team: BusyTeam) -> None:
    window = router.store.reads.team_window(team.team_id, TimelineQuery())
    assert window.agents_total == 8 == window.lanes_total == len(window.lanes)
    assert [s.agent.display_name for s in window.lanes] == team.agents
    assert window.complete_until is None
    routed = {m.id for m in router.messages(team.team_id)}
    assert {a.message_id for a in window.arrows if a.message_id is not None} == routed
    refused = [a for a in window.arrows if a.message_id is None]
    assert [(a.outcome.value, a.target) for a in refused] == [("rejected", team.agents[-1])]
    assert len(window.arrows) == team.messages
    times = [(a.at, a.ledger_id) for a in window.arrows]
    assert times == sorted(times)
    # The script's times: nothing before the team, everything within its 40 s.
    assert all(0 <= (a.at - window.started_at).total_seconds() <= 40.0 for a in window.arrows)
    assert {a.sender for a in window.arrows if not a.sender_is_agent} == {"user", "system"}
    assert len(window.turns) == len(
        [
            t
            for name in team.agents
            for t in router.store.reads.turns(router.agent(team.team_id, name).id)
        ]
    )


def test_a_window_read_in_pieces_adds_up_to_the_whole(router: Router, team: BusyTeam) -> None:
    whole = router.store.reads.team_window(team.team_id, TimelineQuery())
    seen: list[int] = []
    start, pieces = 0.0, 0
    while True:
        piece = router.store.reads.team_window(
            team.team_id, TimelineQuery(start=start, max_scan=40, max_arrows=15)
        )
        pieces += 1
        seen.extend(_ids(piece.arrows))
        if piece.complete_until is None:
            break
        # Each piece is complete up to its end, and the next one starts there (at the
        # millisecond, as the page asks for it).
        reached = (piece.complete_until - piece.started_at).total_seconds()
        assert reached > start
        start = int(reached * 1000) / 1000
    assert pieces > 8
    assert sorted(set(seen)) == sorted(_ids(whole.arrows))


def test_a_page_of_lanes_has_the_lead_and_the_messages_to_or_from_its_agents(
    router: Router, team: BusyTeam
) -> None:
    page = router.store.reads.team_window(team.team_id, TimelineQuery(offset=2, limit=3))
    names = [s.agent.display_name for s in page.lanes]
    # The lead is on every page, first; the page's own agents after it.
    assert names == ["Team Leader", *team.agents[2:5]]
    assert page.lanes_total == 8
    assert page.arrows
    # An end among the page's own agents (the other end may be on another page: the page
    # draws a stub), or the lead's with an outside sender; not the lead's with other pages.
    own = team.agents[2:5]
    among = {
        m.id
        for m in router.messages(team.team_id)
        if m.target_name in own
        or m.source_name in own
        or (m.target_name == "Team Leader" and m.source_agent_id is None)
    }
    assert any(
        m.source_name not in names or m.target_name not in names
        for m in router.messages(team.team_id)
        if m.id in among
    )
    assert {a.message_id for a in page.arrows} - {None} == among
    assert {router.store.reads.agent_by_id(t.agent_id).display_name for t in page.turns} <= set(
        names
    )


def test_a_window_of_time_holds_what_overlaps_it(router: Router, team: BusyTeam) -> None:
    window = router.store.reads.team_window(team.team_id, TimelineQuery(start=5.0, end=12.0))
    t0 = window.started_at
    seconds = [(a.at - t0).total_seconds() for a in window.arrows]
    assert seconds and all(5.0 <= s <= 12.0 for s in seconds)
    for turn in window.turns:
        assert (turn.started_at - t0).total_seconds() <= 12.0
        assert turn.ended_at is None or (turn.ended_at - t0).total_seconds() >= 5.0
    for wait in window.waits:
        assert (wait.asked_at - t0).total_seconds() <= 12.0
        assert wait.closed_at is None or (wait.closed_at - t0).total_seconds() >= 5.0


def test_questions_come_with_both_times(router: Router, team: BusyTeam) -> None:
    window = router.store.reads.team_window(team.team_id, TimelineQuery())
    assert len(window.waits) == team.questions > 0
    answers = {a.question_id: a for a in window.arrows if a.type == MessageType.ANSWER.value}
    asks = {a.question_id: a for a in window.arrows if a.type == MessageType.ASK.value}
    for wait in window.waits:
        assert wait.closed_at is not None and wait.closed_at > wait.asked_at
        assert asks[wait.question_id].sender == wait.asker
        assert answers[wait.question_id].target == wait.asker
        assert answers[wait.question_id].outcome.value == "resolved"
        assert wait.answer_message_id == answers[wait.question_id].message_id


def test_filter_by_name_and_focus_on_one_agent(router: Router, team: BusyTeam) -> None:
    reads = router.store.reads
    engineers = reads.team_window(team.team_id, TimelineQuery(name="engineer"))
    assert [s.agent.display_name for s in engineers.lanes] == [
        n for n in team.agents if "engineer" in n.lower()
    ]
    focus = team.agents[1]
    focused = reads.team_window(team.team_id, TimelineQuery(focus=focus))
    partners = {
        m.source_name if m.target_name == focus else m.target_name
        for m in router.messages(team.team_id)
        if focus in (m.source_name, m.target_name) and m.source_agent_id is not None
    }
    assert {s.agent.display_name for s in focused.lanes} == partners | {focus}
    assert focused.arrows and all(focus in (a.sender, a.target) for a in focused.arrows)
    assert all(focus in (w.asker, w.target) for w in focused.waits)
    with pytest.raises(errors.UnknownAgentError):
        reads.team_window(team.team_id, TimelineQuery(focus="Nobody_1"))
    with pytest.raises(errors.UnknownTeamError):
        reads.team_window(10**12, TimelineQuery())


def test_activity_counts_the_whole_team_by_bucket(router: Router, team: BusyTeam) -> None:
    activity = router.store.reads.activity(team.team_id, 200)
    by_type: Counter[str | None] = Counter()
    for bucket, message_type, n in activity.counts:
        assert 0 <= bucket <= 200
        by_type[message_type] += n
    stored = Counter(m.type.value for m in router.messages(team.team_id))
    assert {k: v for k, v in by_type.items() if k is not None} == dict(stored)
    turns = router.store.reads.team_window(team.team_id, TimelineQuery()).turns
    assert by_type[None] == len(turns) + sum(1 for t in turns if t.ended_at is not None)
    assert activity.outside == ["system", "user"]
    # The idle stretch between the first two waves (11 s to 18 s of 40) has no bucket.
    busy = {b * activity.bucket_seconds for b, _, _ in activity.counts}
    assert not [s for s in busy if 11.5 < s < 17.5]
    assert [s for s in busy if s < 11.5] and [s for s in busy if s > 17.5]


def test_one_snapshot_an_agents_lane_and_its_turn_agree(router: Router) -> None:
    """A writer ends the agent's turn while the read is between its statements: the read
    shows the agent running with its turn open, or done with it ended, never a mix."""
    team = router.create_team().id
    router.create_agent(team, role="Engineer")
    turn = start_running(router, team, "Engineer_1")
    turn.append_assistant({"role": "assistant", "content": "done"})
    ended = threading.Event()

    def end_the_turn() -> None:  # on a connection of its own from the pool
        turn.end()
        ended.set()

    fired = threading.Event()

    def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "FROM ar_turns" in statement and not fired.is_set():
            fired.set()
            thread = threading.Thread(target=end_the_turn)
            thread.start()
            # PostgreSQL: the write commits now, between the read's statements; SQLite: it
            # waits for the read's transaction, which holds the write lock.
            ended.wait(3.0)

    event.listen(router.store.engine, "before_cursor_execute", before)
    try:
        window = router.store.reads.team_window(team, TimelineQuery())
    finally:
        event.remove(router.store.engine, "before_cursor_execute", before)
    ended.wait(60)
    assert fired.is_set() and ended.is_set()
    lane = next(s for s in window.lanes if s.agent.display_name == "Engineer_1")
    [drawn] = [t for t in window.turns if t.agent_id == lane.agent.id]
    if lane.agent.state is AgentState.RUNNING:
        assert drawn.ended_at is None and lane.turn_id == drawn.id
    else:
        assert lane.agent.state is AgentState.COMPLETED and drawn.ended_at is not None
    # After the read, the write is there.
    assert router.agent(team, "Engineer_1").state is AgentState.COMPLETED


def test_messages_of_one_time_are_never_cut_apart(router: Router) -> None:
    """A burst sent in one transaction may share one time (PostgreSQL's transaction time): a
    window cut at max_arrows holds every message up to where it ends, at least a millisecond
    past its start, so that the next window moves on; together they hold every message once."""
    team = router.create_team().id
    router.create_agent(team, role="Engineer")
    burst = [{"to": "Engineer_1", "content": f"part {i}", "wake": False} for i in range(30)]
    router.send_many(team, burst, sender="Team Leader")
    reads = router.store.reads
    whole = reads.team_window(team, TimelineQuery())
    assert len(whole.arrows) == 30
    first = reads.team_window(team, TimelineQuery(max_arrows=10))
    assert first.complete_until is not None and len(first.arrows) >= 10
    assert first.complete_until >= first.started_at + timedelta(milliseconds=1)
    # Nothing up to the cut is left out of the first window.
    assert {a.ledger_id for a in whole.arrows if a.at <= first.complete_until} == {
        a.ledger_id for a in first.arrows
    }
    after = int((first.complete_until - first.started_at).total_seconds() * 1000) / 1000
    rest = reads.team_window(team, TimelineQuery(start=after))
    assert {a.ledger_id for a in first.arrows} | {a.ledger_id for a in rest.arrows} == {
        a.ledger_id for a in whole.arrows
    }
    # A window whose cut falls past its own end is whole.
    end = (whole.arrows[-1].at - whole.started_at).total_seconds()
    bounded = reads.team_window(team, TimelineQuery(end=end, max_arrows=29))
    if whole.arrows[-1].at == whole.arrows[0].at:
        assert bounded.complete_until is None and len(bounded.arrows) == 30


def test_model_calls_and_tool_calls_are_spans_of_their_turns(router: Router) -> None:
    """A model call's event keeps how long it took (``ms``), a tool result how its call ran:
    the window returns each as a span of its agent's turn, with its fields."""
    team = router.create_team().id
    router.create_agent(team, role="Engineer")
    turn = start_running(router, team, "Engineer_1", "Build it.")
    model_call(turn, 2.5, 1200)
    tool, server = TOOLS[0]
    tool_call(turn, "call-1", tool, server, 0.75, failed=True)
    tool_call(turn, "call-2", TOOLS[2][0], TOOLS[2][1], 0.25)
    turn.append_assistant({"role": "assistant", "content": "Built."})
    turn.end()
    [event] = [e for e in router.ledger(team) if e.action.value == "model_call"]
    assert event.detail["ms"] == 2500
    from agent_router.ops.explain import describe

    assert describe(event, {}).endswith("price unknown (not in AGENT_ROUTER_MODELS), took 2.50 s")

    window = router.store.reads.team_window(team, TimelineQuery())
    model, failed, done = window.calls
    assert (model.kind, model.agent, model.turn_id, model.name) == (
        "model", "Engineer_1", turn.id, MODEL
    )  # fmt: skip
    assert model.seconds == 2.5 and model.ended_at == event.created_at
    assert model.detail["prompt_tokens"] == 1200 and model.detail["completion_tokens"] == 170
    assert model.detail["unpriced"] is True and "cost_usd" in model.detail
    assert (failed.kind, failed.name, failed.seconds, failed.detail) == (
        "tool", tool, 0.75, {"server": server, "outcome": "error"}
    )  # fmt: skip
    assert (done.name, done.seconds, done.detail) == (
        TOOLS[2][0], 0.25, {"server": None, "outcome": "ok"}
    )  # fmt: skip

    from agent_router.ops.timeline import view

    [drawn, *_] = view(router, team, TimelineQuery())["calls"]
    # It ended at its event's time and began 2.5 s before (not before the team began).
    assert drawn["start"] == pytest.approx(max(0.0, drawn["end"] - 2.5), abs=0.002)
    assert drawn["ms"] == 2500 and drawn["name"] == MODEL and drawn["turn"] == turn.id
    # Another agent's page does not hold them.
    other = router.store.reads.team_window(team, TimelineQuery(name="Leader"))
    assert other.calls == []


def test_the_two_transitions_of_a_model_call_keep_its_spans(router: Router) -> None:
    """The built-in loop's path: the call's seconds go with its usage into ``after_call`` (the
    event's ``ms``), how each tool call ran with its carried result (written by the next
    ``before_call``, and by ``end``); the window draws them as the direct writes draw them."""
    team = router.create_team().id
    router.create_agent(team, role="Engineer")
    turn = start_running(router, team, "Engineer_1", "Build it.")
    turn.before_call()
    calls = [
        {
            "id": f"call-{n}",
            "type": "function",
            "function": {"name": TOOLS[n][0], "arguments": "{}"},
        }
        for n in (0, 2)
    ]
    usage = {"model": MODEL, "prompt_tokens": 900, "completion_tokens": 40, "seconds": 1.5}
    turn.after_call({"role": "assistant", "content": None, "tool_calls": calls}, usage=usage)
    for n, (outcome, seconds) in enumerate([(ToolOutcome.ERROR, 0.75), (ToolOutcome.OK, 0.25)]):
        tool, server = TOOLS[n * 2]
        run = ToolRun(tool=tool, server=server, outcome=outcome, seconds=seconds)
        turn.carry_tool_result(f"call-{n * 2}", "done", run=run)
    turn.before_call()
    turn.after_call({"role": "assistant", "content": None, "tool_calls": calls[:1]})
    run = ToolRun(tool=TOOLS[0][0], server=TOOLS[0][1], outcome=ToolOutcome.OK, seconds=0.5)
    turn.carry_tool_result("call-0", "done again", run=run)
    turn.end()
    [event] = [e for e in router.ledger(team) if e.action.value == "model_call"]
    assert event.detail["ms"] == 1500
    model, failed, done, again = router.store.reads.team_window(team, TimelineQuery()).calls
    assert (model.kind, model.name, model.seconds) == ("model", MODEL, 1.5)
    assert model.ended_at == event.created_at
    assert (failed.name, failed.seconds, failed.detail) == (
        TOOLS[0][0], 0.75, {"server": TOOLS[0][1], "outcome": "error"}
    )  # fmt: skip
    assert (done.name, done.seconds, done.detail["outcome"]) == (TOOLS[2][0], 0.25, "ok")
    assert (again.name, again.seconds, again.detail["outcome"]) == (TOOLS[0][0], 0.5, "ok")


def test_a_long_model_call_is_work_not_an_idle_gap(router: Router) -> None:
    """A turn whose one model call took 25 s: nothing else happens in those 25 s, but the
    overview counts them as busy, so the swimlane draws the call to scale."""
    from agent_router.ops.timeline import overview

    team = slow_model_team(router)
    gaps = overview(router, team)["gaps"]
    assert gaps == []
    calls = router.store.reads.team_window(team, TimelineQuery()).calls
    assert max(c.seconds or 0 for c in calls) == 25.0


def test_the_window_names_who_is_blocked_now(router: Router) -> None:
    team = blocked_team(router, blocked_for=40.0)
    window = router.store.reads.team_window(team, TimelineQuery())
    assert window.blocked_total == 1
    [blocked] = window.blocked
    assert (blocked.asker, blocked.target, blocked.kind.value) == (
        "Backend Engineer_1", "Team Leader", "ask"
    )  # fmt: skip
    assert not blocked.suspended
    # Asked 40 s before the read (the team's clock put it there).
    assert (window.now - blocked.since).total_seconds() == pytest.approx(40.0, abs=5.0)
    # The answered ask is no longer there; a page without either agent still names them.
    page = router.store.reads.team_window(team, TimelineQuery(name="QA"))
    assert [b.asker for b in page.blocked] == ["Backend Engineer_1"]
