"""Redis down under the feed's signals: routing a message never waits on it (one connect
attempt per backoff period, however many messages), one warning per outage, readers re-read the
database instead and miss nothing, and signals come back by themselves once Redis returns. A
Redis server of the test's own is stopped and restarted (the shared one is left alone)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import closing

import pytest

from agent_router import Router, Settings
from agent_router.domain import FeedItem
from agent_router.feed import Outage, RedisSignals
from agent_router.ops.chaos_processes import PrivateRedis
from agent_router.outbox import RecordingPublisher

LEAD = "Team Leader"


class DeadRedis:
    """A port that accepts every connection and closes it at once, counting them: to a Redis
    client, a server that is down; to the test, a count of connect attempts."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._server.getsockname()[1]}/0"
        self.connections = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        with closing(self._server):
            self._server.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def dead_redis() -> Iterator[DeadRedis]:
    server = DeadRedis()
    yield server
    server.close()


def _closed_port_url() -> str:
    with closing(socket.create_server(("127.0.0.1", 0))) as s:
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def test_sends_while_redis_is_down_reach_for_it_once_per_backoff_period(
    database_url: str, dead_redis: DeadRedis, caplog: pytest.LogCaptureFixture
) -> None:
    router = Router(Settings(database_url=database_url), publisher=RecordingPublisher())
    # A period longer than the test: every send after the first falls inside it.
    router.signals = signals = RedisSignals(
        dead_redis.url, installation=router.store.installation_id, outage=Outage(first=3600.0)
    )
    try:
        team = router.create_team()
        with caplog.at_level(logging.WARNING, logger="agent_router.feed"):
            for n in range(30):
                router.send(team.id, to=LEAD, content=f"message {n}")
                signals.say(team.id, {"agent": LEAD, "stream": "s", "seq": n, "text": "x"})
        assert dead_redis.connections == 1
        assert signals.outage.failures == 1
        down = [r for r in caplog.records if getattr(r, "action", "") == "feed_signals_down"]
        assert len(down) == 1
        # Every message was routed and is in the feed all the same.
        contents = [i.content for i in router.events(team.id) if i.kind == "user"]
        assert contents == [f"message {n}" for n in range(30)]
        # A reader skips subscribing during the period too: no connect attempt.
        assert router.events(team.id, after=router.events(team.id)[-1].cursor, wait=0.2) == []
        assert dead_redis.connections == 1
    finally:
        router.close()


def test_each_try_after_a_period_is_one_connect_attempt(dead_redis: DeadRedis) -> None:
    outage = Outage(first=0.01, longest=0.01)
    signals = RedisSignals(dead_redis.url, installation=lambda: "test", outage=outage)
    try:
        tries = 0
        while outage.failures < 4:
            tries += 1
            signals.notify(1)
            time.sleep(0.002)
        # Many notifies, a connect attempt only for each period's one try.
        assert dead_redis.connections == outage.failures == 4
        assert tries >= 4
    finally:
        signals.close()


def test_a_reader_gets_what_is_committed_while_the_signals_are_down(database_url: str) -> None:
    settings = Settings(database_url=database_url, redis_url=_closed_port_url())
    router = Router(
        settings.model_copy(update={"wake_recheck_seconds": 0.1}), publisher=RecordingPublisher()
    )
    try:
        team = router.create_team()
        got: list[FeedItem] = []
        # Far longer than the test may take: the reader returns by re-reading, not by timing out.
        reader = threading.Thread(target=lambda: got.extend(router.events(team.id, wait=3600.0)))
        reader.start()
        router.send(team.id, to=LEAD, content="Anyone there?")
        reader.join(timeout=120.0)
        assert not reader.is_alive()
        assert [(i.kind, i.content) for i in got][:1] == [("user", "Anyone there?")]
    finally:
        router.close()


def test_signals_come_back_by_themselves_when_redis_returns(
    database_url: str, own_redis: PrivateRedis
) -> None:
    # The re-read timer is longer than the test: a reader that returns was woken by a signal.
    settings = Settings(database_url=database_url, wake_recheck_seconds=3600.0)
    router = Router(settings, publisher=RecordingPublisher())
    router.signals = signals = RedisSignals(
        own_redis.url,
        installation=router.store.installation_id,
        outage=Outage(first=0.05, longest=0.2),
    )
    try:
        team = router.create_team()
        own_redis.stop()
        for n in range(5):
            router.send(team.id, to=LEAD, content=f"while down {n}")
        assert signals.outage.failures >= 1
        own_redis.start()
        # No call tells the signals Redis is back: a subscribe after the period finds it.
        for _ in range(400):
            with signals.listen(team.id) as listener:
                if listener.live:
                    break
            time.sleep(0.01)
        else:
            raise AssertionError("the feed signals never came back")
        cursor = router.events(team.id)[-1].cursor
        got: list[FeedItem] = []
        reader = threading.Thread(
            target=lambda: got.extend(router.events(team.id, after=cursor, wait=3600.0))
        )
        reader.start()
        for _ in range(60):
            router.send(team.id, to=LEAD, content="back")
            reader.join(timeout=0.5)
            if not reader.is_alive():
                break
        assert not reader.is_alive()
        assert {i.content for i in got} == {"back"}
    finally:
        router.close()
