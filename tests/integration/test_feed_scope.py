"""Deployments sharing one Redis server never hear each other: a team's feed channel and a
question's wake list are named by the database's installation id (``ar_installation``, written
with the schema, read once per store) as well as by the team's or question's id, so team 1 of
one database and team 1 of another have channels of their own, though Redis pub/sub ignores
the database number and both use the same Redis database here."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from agent_router import Delta, FeedItem, Router, Settings
from agent_router.constants import feed_channel
from agent_router.outbox import RecordingPublisher
from agent_router.store import migrate
from agent_router.waker import RedisWaker

LEAD = "Team Leader"


def _router(url: str, redis_url: str) -> Router:
    return Router(
        Settings(database_url=url, redis_url=redis_url, wake_recheck_seconds=3600.0),
        publisher=RecordingPublisher(),
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def two(
    request: pytest.FixtureRequest, tmp_path: Path, redis_url: str
) -> Iterator[tuple[Router, Router]]:
    """Two databases (deployments) on one Redis database, each with its team 1: two SQLite
    files, or a PostgreSQL database of the test's own beside a SQLite file."""
    first = (
        f"sqlite:///{tmp_path / 'a.db'}"
        if request.param == "sqlite"
        else str(request.getfixturevalue("fresh_pg_url"))
    )
    a = _router(first, redis_url)
    b = _router(f"sqlite:///{tmp_path / 'b.db'}", redis_url)
    try:
        for router in (a, b):
            router.create_schema()
            assert router.create_team().id == 1
        yield a, b
    finally:
        a.close()
        b.close()


def _subscribers(redis_url: str, channel: str) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        return int(dict(client.pubsub_numsub(channel)).get(channel.encode(), 0))
    finally:
        client.close()


def _listening(redis_url: str, channel: str) -> None:
    for _ in range(4000):
        if _subscribers(redis_url, channel):
            return
        time.sleep(0.005)
    raise AssertionError("the reader never subscribed")


def _statements(router: Router) -> tuple[list[str], Any]:
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    sa.event.listen(router.store.engine, "before_cursor_execute", record)
    return seen, record


def test_a_reader_hears_its_own_team_and_not_the_same_team_id_of_another_database(
    two: tuple[Router, Router], redis_url: str
) -> None:
    a, b = two
    ours = feed_channel(a.store.installation_id(), 1)
    theirs = feed_channel(b.store.installation_id(), 1)
    assert ours != theirs
    a.send(1, to=LEAD, content="Hello from A.")
    cursor = a.events(1)[-1].cursor
    got: list[FeedItem] = []
    # The re-read timer and the wait are longer than the test: the reader returns only for a
    # signal on its own channel.
    reader = threading.Thread(target=lambda: got.extend(a.events(1, after=cursor, wait=3600.0)))
    reader.start()
    _listening(redis_url, ours)
    assert _subscribers(redis_url, theirs) == 0
    # B's team 1: a piece of a reply being written, and a committed message to its lead.
    b.delta_sink(1, LEAD)(Delta(stream="theirs", seq=0, text="secret of B"))
    b.send(1, to=LEAD, content="Hello from B.")
    assert reader.is_alive()
    # Then A's own piece: the first (and only) thing the reader hears. Had B's piece or
    # notification reached it, it would have returned with that first (Redis delivers a
    # subscriber's messages in the order they were published).
    a.delta_sink(1, LEAD)(Delta(stream="ours", seq=0, text="hello"))
    reader.join(timeout=120.0)
    assert not reader.is_alive()
    assert [(i.kind, i.stream, i.content) for i in got] == [("delta", "ours", "hello")]
    # A's next read finds only A's messages.
    assert [i.content for i in a.events(1) if i.kind == "user"] == ["Hello from A."]


def test_a_committed_message_wakes_only_its_own_database_s_reader(
    two: tuple[Router, Router], redis_url: str
) -> None:
    a, b = two
    cursor_a = a.events(1)[-1].cursor if a.events(1) else 0
    got: list[FeedItem] = []
    reader = threading.Thread(target=lambda: got.extend(a.events(1, after=cursor_a, wait=3600.0)))
    reader.start()
    _listening(redis_url, feed_channel(a.store.installation_id(), 1))
    for n in range(3):
        b.send(1, to=LEAD, content=f"B's message {n}")
    a.send(1, to=LEAD, content="A's message")
    reader.join(timeout=120.0)
    assert not reader.is_alive()
    assert [i.content for i in got if i.kind == "user"] == ["A's message"]


def test_wake_lists_are_the_database_s_own(two: tuple[Router, Router], redis_url: str) -> None:
    a, b = two
    assert isinstance(a.waker, RedisWaker) and isinstance(b.waker, RedisWaker)
    key_a, key_b = a.waker.key(1), b.waker.key(1)
    assert key_a != key_b and a.store.installation_id() in key_a
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(key_a, key_b)
        b.waker.notify(1, "token of B")
        # B's signal is on B's list alone: A's waiter on question 1 has nothing to pop.
        assert client.lrange(key_b, 0, -1) == [b"token of B"]
        assert client.exists(key_a) == 0
        a.waker.notify(1, "token of A")
        assert a.waker.wait(1, 3600.0, "token of A") is True
        # A signal with another token on A's own list (another release, a stale row) ends no
        # wait: the waiter re-reads its database.
        a.waker.notify(1, "another token")
        assert a.waker.wait(1, 3600.0, "token of A") is False
        assert client.lrange(key_b, 0, -1) == [b"token of B"]
    finally:
        client.delete(key_a, key_b)
        client.close()


def test_the_installation_id_is_read_once_per_store(tmp_path: Path, redis_url: str) -> None:
    router = _router(f"sqlite:///{tmp_path / 'once.db'}", redis_url)
    try:
        router.create_schema()
        team = router.create_team()
        seen, record = _statements(router)
        try:
            for n in range(5):
                router.send(team.id, to=LEAD, content=f"message {n}")
                router.delta_sink(team.id, LEAD)(Delta(stream="s", seq=n, text="x"))
                router.events(team.id, after=10**9, wait=0.01)
        finally:
            sa.event.remove(router.store.engine, "before_cursor_execute", record)
        assert len([s for s in seen if "ar_installation" in s]) == 1
    finally:
        router.close()


def _read_in_another_process(url: str) -> str:
    code = (
        "import sys\n"
        "from agent_router import Router, Settings\n"
        "r = Router(Settings(database_url=sys.argv[1]), publisher=None)\n"
        "print(r.store.installation_id())\n"
        "r.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, url], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip()


def test_the_installation_id_is_one_per_database_and_the_same_in_every_process(
    tmp_path: Path,
) -> None:
    urls = [f"sqlite:///{tmp_path / name}" for name in ("one.db", "two.db")]
    ids = []
    for url in urls:
        router = Router(Settings(database_url=url), publisher=None)
        try:
            router.create_schema()
            ids.append(router.store.installation_id())
            router.create_schema()  # a second time keeps it
        finally:
            router.close()
        assert _read_in_another_process(url) == ids[-1]
    assert ids[0] != ids[1]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'migrated.db'}"
    return str(request.getfixturevalue("fresh_pg_url"))


def test_the_migration_writes_one_installation_id_that_later_upgrades_keep(
    empty_url: str,
) -> None:
    migrate.upgrade(empty_url, "0013")
    migrate.upgrade(empty_url)
    first = _read_in_another_process(empty_url)
    migrate.upgrade(empty_url)  # at head already: nothing changes
    router = Router(Settings(database_url=empty_url), publisher=None)
    try:
        router.create_schema()  # a database that has one keeps it
        assert router.store.installation_id() == first
        with router.store.engine.connect() as conn:
            count = conn.execute(sa.text("SELECT count(*) FROM ar_installation")).scalar_one()
        assert count == 1
    finally:
        router.close()
    assert _read_in_another_process(empty_url) == first
