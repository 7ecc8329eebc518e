"""Wake signals over a real Redis: a quiet wait longer than redis-py's default socket timeout
(5 s) ends by its own BLPOP timeout, with nothing logged; and a process's wakers share one pool,
so the connections it holds stay at its most concurrent waits however many waits, threads and
Routers come and go."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis

from agent_router.ops.chaos_processes import PrivateRedis
from agent_router.waker import RedisWaker


def test_a_quiet_wait_past_the_default_socket_timeout_is_quiet(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    waker = RedisWaker(redis_url, max_block_seconds=5.5)
    qid = 10**13 + threading.get_ident() % 10**6
    try:
        with caplog.at_level(logging.DEBUG, logger="agent_router"):
            assert waker.wait(qid, 5.5, "t") is False
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
        # The next wait on the same connection still gets its signal.
        waker.notify(qid, "t")
        assert waker.wait(qid, 5.5, "t") is True
    finally:
        waker.forget(qid)
        waker.close()


def test_a_wait_asked_for_longer_than_the_waker_blocks_returns_at_its_limit(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The caller's loop re-reads the database after each wait, so a wait cut to the waker's
    limit loses nothing, and the socket never times out first."""
    waker = RedisWaker(redis_url, max_block_seconds=0.2)
    qid = 2 * 10**13 + threading.get_ident() % 10**6
    try:
        with caplog.at_level(logging.DEBUG, logger="agent_router"):
            assert waker.wait(qid, 3600.0, "t") is False
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    finally:
        waker.close()


def _wake_connections(client: redis.Redis) -> int:
    # Every client but the one counting.
    return sum(1 for c in client.client_list() if c["cmd"] != "client|list")


def test_wakers_of_a_process_share_one_pool_and_connections_do_not_grow(
    own_redis: PrivateRedis,
) -> None:
    counter = redis.Redis.from_url(own_redis.url)
    threads = 6

    def burst(wakers: list[RedisWaker], base: int) -> None:
        def waits(n: int) -> None:
            for i in range(15):
                waker = wakers[(n + i) % len(wakers)]
                qid = base + n * 100 + i
                waker.notify(qid, "t")
                assert waker.wait(qid, 1.0, "t") is True
                assert waker.wait(qid, 0.02, "t") is False  # quiet: nothing left
                waker.forget(qid)

        workers = [threading.Thread(target=waits, args=(n,)) for n in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=60)
            assert not w.is_alive()

    first = [RedisWaker(own_redis.url, max_block_seconds=1.0) for _ in range(4)]
    try:
        burst(first, 0)
        after_first = _wake_connections(counter)
        assert 1 <= after_first <= threads
        # More Routers' wakers come and go: the same pool, no new connections beyond the
        # threads that wait at once.
        for round_ in range(1, 4):
            more = [RedisWaker(own_redis.url, max_block_seconds=1.0) for _ in range(4)]
            burst(more, round_ * 10_000)
            for waker in more:
                waker.close()
            assert _wake_connections(counter) <= threads
    finally:
        for waker in first:
            waker.close()
    # The last waker to close disconnects the pool (the server sees the sockets close a moment
    # later: its client list is read until they are gone).
    deadline = time.monotonic() + 10
    while _wake_connections(counter) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _wake_connections(counter) == 0
    counter.close()
