"""Guarantees 3, 4 and 6 under real threads: bursts, the end-of-turn race, concurrent senders."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agent_router import AgentState, RouteOutcome, Router, Turn, TurnTrigger
from agent_router.domain import OutboxKind
from agent_router.ops.checks import check_team

from ..conftest import with_pgbouncer
from .helpers import assistant, start_running

pytestmark = with_pgbouncer


def _together(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """Run ``fn(i)`` on ``n`` threads released at the same instant."""
    barrier = threading.Barrier(n)

    def run(i: int) -> Any:
        barrier.wait()
        return fn(i)

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(run, range(n)))


def test_burst_of_32_wakes_an_idle_agent_once(router: Router) -> None:
    team = router.create_team()
    agent = router.create_agent(team.id, role="Engineer")
    outbox = len(router.outbox(team.id))
    deliveries = _together(
        32,
        lambda i: router.send(team.id, to="Engineer_1", content=f"m{i}", sender="Team Leader"),
    )
    outcomes = [d.outcome for d in deliveries]
    assert outcomes.count(RouteOutcome.TRIGGERED_NEW_TURN) == 1
    assert outcomes.count(RouteOutcome.COALESCED) == 31
    enqueues = [e for e in router.outbox(team.id)[outbox:] if e.agent_id == agent.id]
    assert [e.kind for e in enqueues] == [OutboxKind.ENQUEUE_TURN]
    assert sorted(d.seq for d in deliveries) == list(range(1, 33))
    turn = router.claim_turn(team.id, "Engineer_1")
    assert turn is not None
    drained = turn.drain()
    assert [m.seq for m in drained] == list(range(1, 33))
    assert {m.id for m in drained} == {d.message_id for d in deliveries}
    assert turn.end().follow_up is False
    assert check_team(router, team.id, quiescent=True).ok


def test_end_of_turn_race_fires_one_follow_up_never_zero_never_two(router: Router) -> None:
    """A message arrives while the last output is being written, 200 times: one thread writes
    the last output and ends the turn while another sends. Whichever wins the agent lock, the
    message gets exactly one turn."""
    team = router.create_team()
    agent = router.create_agent(team.id, role="UI Operator")
    follow_ups = new_turns = 0
    jitter = random.Random(34)
    for i in range(200):
        turn = start_running(router, team.id, "UI Operator_1", content=f"task {i}")
        enqueued_before = len(router.outbox(team.id))

        # Injected jitter on both sides: the final answer takes a while to write, and the
        # message arrives before, during or after it is appended and the turn ends.
        writing, arriving = jitter.uniform(0.0, 0.02), jitter.uniform(0.0, 0.02)

        def finish(turn: Turn = turn, i: int = i, writing: float = writing) -> Any:
            time.sleep(writing)
            turn.append_assistant(assistant(f"final answer {i}"))
            return turn.end()

        def steer(i: int = i, arriving: float = arriving) -> Any:
            time.sleep(arriving)
            return router.send(
                team.id, to="UI Operator_1", content=f"steer {i}", sender="Team Leader"
            )

        end, delivery = _together(2, lambda k: (finish, steer)[k]())
        enqueued = [e for e in router.outbox(team.id)[enqueued_before:] if e.agent_id == agent.id]
        assert len(enqueued) == 1, f"iteration {i}: {len(enqueued)} turns enqueued"
        if end.follow_up:
            assert delivery.outcome is RouteOutcome.INJECTED_INLINE
            follow_ups += 1
        else:
            assert delivery.outcome is RouteOutcome.TRIGGERED_NEW_TURN
            new_turns += 1
        assert router.agent(team.id, "UI Operator_1").state is AgentState.SCHEDULED
        nxt = router.claim_turn(team.id, "UI Operator_1")
        assert nxt is not None
        assert nxt.trigger is (TurnTrigger.FOLLOW_UP if end.follow_up else TurnTrigger.NEW)
        # The start_running of the next iteration sends first, so end this one cleanly.
        assert [m.id for m in nxt.drain()] == [delivery.message_id]
        assert nxt.end().follow_up is False
    report = check_team(router, team.id, quiescent=True)
    assert report.ok, report.violations
    assert report.delivered == report.messages == 400
    # Both interleavings occurred; otherwise the race was not exercised.
    assert follow_ups > 0 and new_turns > 0, (follow_ups, new_turns)


def test_concurrent_senders_and_a_draining_loop_keep_order_and_exactly_once(
    router: Router,
) -> None:
    team = router.create_team()
    agent = router.create_agent(team.id, role="Engineer")
    senders, per_sender = 6, 40
    stop = threading.Event()
    turns_run: list[int] = []

    def loop() -> None:
        while True:
            turn = router.claim_turn(team.id, "Engineer_1")
            if turn is None:
                if stop.is_set() and router.agent(team.id, "Engineer_1").state is not (
                    AgentState.SCHEDULED
                ):
                    return
                continue
            turns_run.append(turn.id)
            for _ in range(3):
                turn.drain()
            turn.append_assistant(assistant("ok"))
            turn.end()

    worker = threading.Thread(target=loop)
    worker.start()
    try:
        _together(
            senders,
            lambda s: [
                router.send(team.id, to="Engineer_1", content=f"{s}:{k}", sender=f"job:s{s}")
                for k in range(per_sender)
            ],
        )
    finally:
        stop.set()
        worker.join(timeout=120)
    assert not worker.is_alive()
    report = check_team(router, team.id, quiescent=True)
    assert report.ok, report.violations
    assert report.delivered == senders * per_sender
    # Per sender, acceptance order is send order, and the transcript keeps it.
    transcript = router.store.reads.transcript_entries(agent.id)
    by_sender: dict[str, list[int]] = {}
    for entry in transcript:
        if entry["meta"] and entry["meta"].get("from", "").startswith("job:"):
            sender, k = entry["payload"]["content"].splitlines()[1].split(":")
            by_sender.setdefault(sender, []).append(int(k))
    assert all(ks == sorted(ks) and len(ks) == per_sender for ks in by_sender.values())
    # A burst never costs a turn per message.
    assert len(turns_run) < senders * per_sender
