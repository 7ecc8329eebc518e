"""Redis dying while asks block: the waker falls back to re-reading the database, the answer
still returns into the blocked call, and signals work again once Redis is back. A Redis server
of the test's own is stopped and restarted (the shared one is left alone)."""

from __future__ import annotations

import threading
import time

from agent_router import AgentState, MessageType, Router, Settings, Turn, WaitOutcome
from agent_router.ops.chaos_processes import PrivateRedis
from agent_router.outbox import RecordingPublisher
from agent_router.waker import RedisWaker

from .helpers import assistant, start_running, tool_call


def _ask_and_answer(turn: Turn, answerer: Router, call_id: str) -> WaitOutcome:
    team_id = turn.team_id
    turn.append_assistant(assistant(None, tool_call(call_id, "ask_master")))
    q = turn.ask("Team Leader", "which module?", tool_call_id=call_id)
    result: list[WaitOutcome] = []
    waiter = threading.Thread(target=lambda: result.append(turn.wait_for(q, block_seconds=60)))
    waiter.start()
    time.sleep(0.3)  # the waiter is blocked in BLPOP (or in its fallback sleep)
    answerer.send(
        team_id,
        to="Engineer_1",
        content="auth.py",
        sender="Team Leader",
        type=MessageType.ANSWER,
        question_id=q.id,
    )
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    return result[0]


def test_an_ask_blocked_while_redis_dies_still_gets_its_answer(
    database_url: str, own_redis: PrivateRedis
) -> None:
    settings = Settings(database_url=database_url, wake_recheck_seconds=0.5)
    waiter_side = Router(settings, publisher=RecordingPublisher(), waker=RedisWaker(own_redis.url))
    answer_side = Router(settings, publisher=RecordingPublisher(), waker=RedisWaker(own_redis.url))
    try:
        team = waiter_side.create_team()
        waiter_side.create_agent(team.id, role="Engineer")
        turn = start_running(waiter_side, team.id, "Engineer_1")
        own_redis.stop()
        assert _ask_and_answer(turn, answer_side, "a1") is WaitOutcome.RESOLVED
        transcript = waiter_side.transcript(team.id, "Engineer_1")
        assert transcript[-1]["tool_call_id"] == "a1" and "auth.py" in transcript[-1]["content"]
        own_redis.start()  # back: the next ask is woken by its signal again
        assert _ask_and_answer(turn, answer_side, "a2") is WaitOutcome.RESOLVED
        assert waiter_side.agent(team.id, "Engineer_1").state is AgentState.RUNNING
    finally:
        waiter_side.close()
        answer_side.close()
