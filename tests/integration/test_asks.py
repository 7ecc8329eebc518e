"""Blocking asks at the turn API: answered into the blocked call, suspend and continue, the
answer/suspension race, cycles refused, lost wake signals, deadlines. Real threads, real Redis."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agent_router import (
    AgentState,
    AskRefusedError,
    MessageType,
    QuestionClosedError,
    QuestionStatus,
    RouteOutcome,
    Router,
    Settings,
    Turn,
    TurnTrigger,
    WaitOutcome,
)
from agent_router.domain import OutboxKind
from agent_router.formats import parse
from agent_router.ops.checks import check_team, tool_pairing_problems
from agent_router.outbox import RecordingPublisher
from agent_router.waker import InProcessWaker, RedisWaker

from ..conftest import with_pgbouncer
from .helpers import assistant, start_running, tool_call


@pytest.fixture(params=["in-process", "redis"])
def asks_router(
    request: pytest.FixtureRequest, database_url: str, redis_url: str
) -> Iterator[Router]:
    # The lead these tests ask runs no turn: a grace as long as the blocks keeps them blocking.
    settings = Settings(database_url=database_url, wake_recheck_seconds=5.0, ask_grace_seconds=60)
    waker = RedisWaker(redis_url) if request.param == "redis" else InProcessWaker()
    router = Router(settings, publisher=RecordingPublisher(), waker=waker)
    yield router
    router.close()


def _asking(
    router: Router, team_id: int, name: str, target: str, call: str = "ask-1"
) -> tuple[Turn, Any]:
    turn = start_running(router, team_id, name)
    turn.append_assistant(assistant(None, tool_call(call, "ask_master")))
    return turn, turn.ask(target, f"question from {name}", tool_call_id=call)


def _answer(router: Router, team_id: int, to: str, qid: int, text: str = "the answer") -> Any:
    return router.send(
        team_id, to=to, content=text, sender="Team Leader", type=MessageType.ANSWER, question_id=qid
    )


@with_pgbouncer
def test_answer_returns_into_the_blocked_call(asks_router: Router) -> None:
    router = asks_router
    team = router.create_team()
    router.create_agent(team.id, role="Full-Stack Engineer")
    turn, q = _asking(router, team.id, "Full-Stack Engineer_1", "Team Leader")
    result: list[WaitOutcome] = []
    waiter = threading.Thread(target=lambda: result.append(turn.wait_for(q, block_seconds=60)))
    waiter.start()
    d = _answer(router, team.id, "Full-Stack Engineer_1", q.id, "reuse the auth module")
    waiter.join(timeout=30)
    assert not waiter.is_alive(), "the wake signal did not reach the blocked asker"
    assert result == [WaitOutcome.RESOLVED] and d.outcome is RouteOutcome.RESOLVED
    last = router.transcript(team.id, "Full-Stack Engineer_1")[-1]
    assert (last["role"], last["tool_call_id"]) == ("tool", "ask-1")
    assert parse(last["content"]).content == "reuse the auth module"
    assert router.question(q.id).status is QuestionStatus.ANSWERED
    turn.append_assistant(assistant("thanks, done"))
    turn.end()
    assert check_team(router, team.id).ok


@with_pgbouncer
def test_blocked_ask_suspends_and_the_answer_schedules_a_continuation(asks_router: Router) -> None:
    router = asks_router
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    turn, q = _asking(router, team.id, "Engineer_1", "Team Leader")
    assert turn.wait_for(q, block_seconds=0.05) is WaitOutcome.SUSPENDED
    agent = router.agent(team.id, "Engineer_1")
    assert (agent.state, agent.suspended) == (AgentState.WAITING, True)
    assert router.store.reads.current_turn(agent.id) is None  # no worker held
    d = _answer(router, team.id, "Engineer_1", q.id)
    assert d.outcome is RouteOutcome.RESOLVED
    agent = router.agent(team.id, "Engineer_1")
    assert (agent.state, agent.pending_trigger) == (AgentState.SCHEDULED, TurnTrigger.CONTINUATION)
    cont = router.claim_turn(team.id, "Engineer_1")
    assert cont is not None and cont.trigger is TurnTrigger.CONTINUATION
    assert router.transcript(team.id, "Engineer_1")[-1]["tool_call_id"] == "ask-1"
    cont.append_assistant(assistant("continuing"))
    assert cont.end().follow_up is False
    assert check_team(router, team.id).ok


@pytest.fixture
def graced_router(database_url: str, redis_url: str) -> Iterator[Router]:
    """Asks that hold a worker for 0.1 s while the agent asked is not at work."""
    settings = Settings(database_url=database_url, ask_grace_seconds=0.1, ask_block_seconds=60)
    router = Router(settings, publisher=RecordingPublisher(), waker=RedisWaker(redis_url))
    yield router
    router.close()


def test_an_ask_to_an_agent_not_at_work_suspends_after_the_grace(graced_router: Router) -> None:
    """The lead is idle: the ask schedules its turn, which needs a worker slot, maybe the one the
    asker holds; so the asker gives it up after the grace, not after ``ask_block_seconds``."""
    router = graced_router
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    turn, q = _asking(router, team.id, "Engineer_1", "Team Leader")
    assert router.agent(team.id, "Team Leader").state is AgentState.SCHEDULED
    result: list[WaitOutcome] = []
    waiter = threading.Thread(target=lambda: result.append(turn.wait_for(q)))
    waiter.start()
    waiter.join(timeout=30)  # half of ask_block_seconds
    assert result == [WaitOutcome.SUSPENDED]
    agent = router.agent(team.id, "Engineer_1")
    assert (agent.state, agent.suspended) == (AgentState.WAITING, True)
    lead = router.claim_turn(team.id, "Team Leader")
    assert lead is not None
    lead.drain()
    _answer(router, team.id, "Engineer_1", q.id)
    cont = router.claim_turn(team.id, "Engineer_1")
    assert cont is not None and cont.trigger is TurnTrigger.CONTINUATION
    assert [e.get("tool_call_id") for e in cont.transcript()].count("ask-1") == 1  # one result
    cont.append_assistant(assistant("continuing"))
    cont.end()
    lead.append_assistant(assistant("answered"))
    lead.end()
    report = check_team(router, team.id, quiescent=True)
    assert report.ok, report.violations


def test_an_ask_to_an_agent_at_work_blocks_past_the_grace(graced_router: Router) -> None:
    """The lead's turn holds a worker: its answer can come without a slot, so the asker keeps
    its own (up to ``ask_block_seconds``) and the answer returns into the blocked call."""
    router = graced_router
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    lead = start_running(router, team.id, "Team Leader")
    turn, q = _asking(router, team.id, "Engineer_1", "Team Leader")
    result: list[WaitOutcome] = []
    waiter = threading.Thread(target=lambda: result.append(turn.wait_for(q)))
    waiter.start()
    time.sleep(1.0)  # ten graces
    assert waiter.is_alive()
    agent = router.agent(team.id, "Engineer_1")
    assert (agent.state, agent.suspended) == (AgentState.WAITING, False)
    _answer(router, team.id, "Engineer_1", q.id)
    waiter.join(timeout=30)
    assert result == [WaitOutcome.RESOLVED]
    turn.append_assistant(assistant("thanks"))
    turn.end()
    lead.drain()
    lead.append_assistant(assistant("answered"))
    lead.end()
    report = check_team(router, team.id, quiescent=True)
    assert report.ok, report.violations


@with_pgbouncer
def test_answer_racing_suspension_continues_exactly_once(router: Router) -> None:
    # The race is decided in the database; the waker plays no part, so one waker suffices.
    team = router.create_team()
    agent = router.create_agent(team.id, role="Engineer")
    pool = ThreadPoolExecutor(max_workers=2)
    suspended_runs = blocking_runs = 0
    jitter = random.Random(9)
    for i in range(200):
        call = f"ask-{i}"
        turn, q = _asking(router, team.id, "Engineer_1", "Team Leader", call)
        outbox_before = len(router.outbox(team.id))
        barrier = threading.Barrier(2)
        # Injected jitter after the common start: either side may get to the agent lock first.
        delays = (jitter.uniform(0.0, 0.005), jitter.uniform(0.0, 0.005))

        def suspend(
            turn: Turn = turn,
            barrier: threading.Barrier = barrier,
            delays: tuple[float, float] = delays,
        ) -> bool:
            barrier.wait()
            time.sleep(delays[0])
            return turn.suspend()

        def answer(
            qid: int = q.id,
            i: int = i,
            barrier: threading.Barrier = barrier,
            delays: tuple[float, float] = delays,
        ) -> Any:
            barrier.wait()
            time.sleep(delays[1])
            return _answer(router, team.id, "Engineer_1", qid, f"answer {i}")

        suspended_f, answer_f = pool.submit(suspend), pool.submit(answer)
        suspended, delivery = suspended_f.result(), answer_f.result()
        assert delivery.outcome is RouteOutcome.RESOLVED
        mine = [e for e in router.outbox(team.id)[outbox_before:] if e.agent_id == agent.id]
        if suspended:
            suspended_runs += 1
            assert [e.kind for e in mine] == [OutboxKind.ENQUEUE_TURN]
            current = router.claim_turn(team.id, "Engineer_1")
            assert current is not None and current.trigger is TurnTrigger.CONTINUATION
        else:
            blocking_runs += 1
            assert [e.kind for e in mine] == [OutboxKind.WAKE_WAITER]
            assert router.agent(team.id, "Engineer_1").state is AgentState.RUNNING
            current = turn
        results = [
            e
            for e in router.transcript(team.id, "Engineer_1")
            if e["role"] == "tool" and e["tool_call_id"] == call
        ]
        assert len(results) == 1 and parse(results[0]["content"]).content == f"answer {i}"
        current.append_assistant(assistant("ok"))
        current.end()
    pool.shutdown()
    report = check_team(router, team.id)
    assert report.ok, report.violations
    assert suspended_runs + blocking_runs == 200
    assert suspended_runs > 0 and blocking_runs > 0, (suspended_runs, blocking_runs)


@with_pgbouncer
def test_concurrent_mutual_asks_one_waits_one_is_refused(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="UI Operator")
    router.create_agent(team.id, role="Full-Stack Engineer")
    a, b = "UI Operator_1", "Full-Stack Engineer_1"
    pool = ThreadPoolExecutor(max_workers=2)
    for i in range(100):
        ta = start_running(router, team.id, a, f"go {i}")
        tb = start_running(router, team.id, b, f"go {i}")
        ta.append_assistant(assistant(None, tool_call(f"a{i}", "ask_other_agent")))
        tb.append_assistant(assistant(None, tool_call(f"b{i}", "ask_other_agent")))
        barrier = threading.Barrier(2)

        def ask(turn: Turn, target: str, call: str, barrier: threading.Barrier = barrier) -> Any:
            barrier.wait()
            try:
                return turn.ask(target, "do you depend on me?", tool_call_id=call)
            except AskRefusedError as exc:
                return exc

        fa = pool.submit(ask, ta, b, f"a{i}")
        fb = pool.submit(ask, tb, a, f"b{i}")
        results = [fa.result(), fb.result()]
        refused = [r for r in results if isinstance(r, AskRefusedError)]
        assert len(refused) == 1, results
        assert sorted(refused[0].cycle[:2]) == sorted([a, b]) and len(refused[0].cycle) == 3
        waiting = [n for n in (a, b) if router.agent(team.id, n).state is AgentState.WAITING]
        assert len(waiting) == 1
        # Release: the refused asker answers the other one's question, then both end.
        winner_q = next(r for r in results if not isinstance(r, AskRefusedError))
        loser_turn, loser_call = (tb, f"b{i}") if waiting == [a] else (ta, f"a{i}")
        loser_turn.append_tool_result(loser_call, f"refused: {refused[0]}")
        router.send(
            team.id,
            to=waiting[0],
            content="no",
            sender=b if waiting == [a] else a,
            type=MessageType.ANSWER,
            question_id=winner_q.id,
        )
        for t in (ta, tb):
            t.drain()
            t.append_assistant(assistant("done"))
            t.end()
        for n in (a, b):  # drain the ask messages the winner's target got inline
            follow = router.claim_turn(team.id, n)
            if follow is not None:
                follow.drain()
                follow.append_assistant(assistant("ok"))
                follow.end()
    pool.shutdown()
    report = check_team(router, team.id)
    assert report.ok, report.violations


@with_pgbouncer
def test_three_agent_cycle_is_refused_and_names_the_cycle(router: Router) -> None:
    team = router.create_team()
    for role in ("A", "B", "C"):
        router.create_agent(team.id, role=role)
    _asking(router, team.id, "A_1", "B_1")
    _asking(router, team.id, "B_1", "C_1")
    tc = start_running(router, team.id, "C_1")
    tc.append_assistant(assistant(None, tool_call("c-ask", "ask_other_agent")))
    with pytest.raises(AskRefusedError) as refused:
        tc.ask("A_1", "loop?", tool_call_id="c-ask")
    assert refused.value.cycle == ["C_1", "A_1", "B_1", "C_1"]
    assert "C_1 -> A_1 -> B_1 -> C_1" in str(refused.value)
    assert router.agent(team.id, "C_1").state is AgentState.RUNNING
    # A different target that closes no cycle is fine.
    tc.ask("Team Leader", "fine?", tool_call_id="c-ask")
    assert router.agent(team.id, "C_1").state is AgentState.WAITING


class _CountedWait:
    """``Engineer_1`` blocked in an ask in a thread of its own, every read of its question's
    wait state noted (``True``: still waiting); started once its first read is done."""

    def __init__(self, router: Router, monkeypatch: pytest.MonkeyPatch) -> None:
        team = router.create_team()
        router.create_agent(team.id, role="Engineer")
        self.team = team.id
        turn, self.question = _asking(router, team.id, "Engineer_1", "Team Leader")
        self.reads: list[bool] = []
        self.result: list[WaitOutcome] = []
        wait_state = router.store.reads.wait_state

        def counted(question_id: int) -> Any:
            found = wait_state(question_id)
            self.reads.append(found[0])
            return found

        monkeypatch.setattr(router.store.reads, "wait_state", counted)
        # Signals other tests' databases left for the same question id would each cost a read.
        router.waker.forget(self.question.id)
        self.waiter = threading.Thread(
            target=lambda: self.result.append(turn.wait_for(self.question, block_seconds=60))
        )
        self.waiter.start()
        self.until_read(1)

    def until_read(self, times: int) -> None:
        deadline = time.monotonic() + 10
        while len(self.reads) < times and time.monotonic() < deadline:
            time.sleep(0.01)


@with_pgbouncer
def test_a_wake_signal_ends_the_wait_without_another_read(
    asks_router: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal is sent only after the answer's transaction committed: the blocked call
    returns on it, having read its question once (before it blocked), not again."""
    router = asks_router
    wait = _CountedWait(router, monkeypatch)
    assert wait.reads == [True]  # read once, still waiting: now it blocks on the signal
    _answer(router, wait.team, "Engineer_1", wait.question.id)
    wait.waiter.join(timeout=30)
    assert wait.result == [WaitOutcome.RESOLVED]
    assert wait.reads == [True]
    assert router.agent(wait.team, "Engineer_1").state is AgentState.RUNNING


@with_pgbouncer
def test_a_signal_with_another_token_is_only_a_reason_to_read_again(
    asks_router: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal for the same question id from another database sharing Redis (another token)
    does not end the wait: the call reads its question again, finds it still open, and blocks
    until its own answer's signal."""
    router = asks_router
    wait = _CountedWait(router, monkeypatch)
    router.waker.notify(wait.question.id, "2001-01-01T00:00:00.000000")
    wait.until_read(2)
    assert wait.reads == [True, True] and wait.waiter.is_alive()
    _answer(router, wait.team, "Engineer_1", wait.question.id)
    wait.waiter.join(timeout=30)
    assert wait.result == [WaitOutcome.RESOLVED] and wait.reads == [True, True]


@with_pgbouncer
def test_lost_wake_signal_costs_only_a_recheck(database_url: str, redis_url: str) -> None:
    settings = Settings(database_url=database_url, wake_recheck_seconds=0.3)
    waiter_side = Router(settings, publisher=RecordingPublisher(), waker=RedisWaker(redis_url))
    # The answering process signals a Redis database nobody listens on: the signal is lost.
    lost_url = redis_url.rsplit("/", 1)[0] + "/15"
    answer_side = Router(settings, publisher=RecordingPublisher(), waker=RedisWaker(lost_url))
    try:
        team = waiter_side.create_team()
        waiter_side.create_agent(team.id, role="Engineer")
        turn, q = _asking(waiter_side, team.id, "Engineer_1", "Team Leader")
        result: list[WaitOutcome] = []
        waiter = threading.Thread(target=lambda: result.append(turn.wait_for(q, block_seconds=60)))
        waiter.start()
        _answer(answer_side, team.id, "Engineer_1", q.id)
        waiter.join(timeout=30)
        assert result == [WaitOutcome.RESOLVED]
        assert waiter_side.agent(team.id, "Engineer_1").state is AgentState.RUNNING
    finally:
        waiter_side.close()
        answer_side.close()


@with_pgbouncer
def test_question_past_its_deadline_resolves_expired(asks_router: Router) -> None:
    router = asks_router
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    turn = start_running(router, team.id, "Engineer_1")
    turn.append_assistant(assistant(None, tool_call("ask-1", "ask_master")))
    q = turn.ask("Team Leader", "anyone?", tool_call_id="ask-1", timeout_seconds=0.2)
    assert turn.wait_for(q, block_seconds=30) is WaitOutcome.RESOLVED
    last = router.transcript(team.id, "Engineer_1")[-1]
    assert last["tool_call_id"] == "ask-1" and last["content"].startswith("expired")
    assert router.question(q.id).status is QuestionStatus.EXPIRED
    with pytest.raises(QuestionClosedError):
        _answer(router, team.id, "Engineer_1", q.id, "too late")
    turn.append_assistant(assistant("moving on"))
    turn.end()
    report = check_team(router, team.id)
    assert report.ok, report.violations


@with_pgbouncer
def test_terminating_the_target_releases_the_asker(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    router.create_agent(team.id, role="Designer")
    turn, q = _asking(router, team.id, "Engineer_1", "Designer_1")
    router.terminate(team.id, "Designer_1", reason="no longer needed")
    assert turn.wait_for(q, block_seconds=5) is WaitOutcome.RESOLVED
    last = router.transcript(team.id, "Engineer_1")[-1]
    assert last["content"].startswith("cancelled") and "Designer_1" in last["content"]
    assert router.question(q.id).status is QuestionStatus.CANCELLED
    dropped = [m for m in router.messages(team.id) if m.target_name == "Designer_1"]
    assert all(m.status.value == "dropped" and m.drop_reason for m in dropped)
    transcript = router.transcript(team.id, "Engineer_1")
    assert tool_pairing_problems(transcript, open_allowed=True) == []


def test_a_redis_wake_signal_is_consumed_once_and_leaves_nothing_behind(redis_url: str) -> None:
    """A popped signal empties its list: forgetting it then costs no round trip and leaves no
    key. A signal nobody popped (the wait ended otherwise) is deleted by the forget; a
    duplicate notify after a pop stays only until its expiry."""
    import redis

    from agent_router.constants import wake_key

    client: Any = redis.Redis.from_url(redis_url)
    waker = RedisWaker(redis_url, ttl_seconds=60)
    commands: list[str] = []
    real: Any = waker._client.execute_command

    def counting(*args: Any, **kwargs: Any) -> Any:
        commands.append(str(args[0]))
        return real(*args, **kwargs)

    waker._client.execute_command = counting  # type: ignore[method-assign]
    try:
        qid = 10**12 + threading.get_ident() % 10**6
        client.delete(wake_key(qid), wake_key(qid + 1))
        waker.notify(qid, "t")
        assert waker.wait(qid, 1.0, "t") is True
        commands.clear()
        waker.forget(qid)
        assert commands == [] and client.exists(wake_key(qid)) == 0
        # Not popped: a leftover signal is deleted.
        waker.notify(qid + 1, "t")
        waker.forget(qid + 1)
        assert commands == ["DEL"] and client.exists(wake_key(qid + 1)) == 0
        # A duplicate notify after the pop: it expires on its own.
        waker.notify(qid, "t")
        waker.notify(qid, "t")
        assert waker.wait(qid, 1.0, "t") is True
        waker.forget(qid)
        assert 0 < client.ttl(wake_key(qid)) <= 60
        # Another database's signal for the same question id (another token): popped, and the
        # waiter is told nothing came (it re-reads its own database).
        client.delete(wake_key(qid))
        waker.notify(qid, "another")
        assert waker.wait(qid, 1.0, "t") is False
        assert client.exists(wake_key(qid)) == 0
    finally:
        client.delete(wake_key(qid))
        client.close()
        waker.close()
