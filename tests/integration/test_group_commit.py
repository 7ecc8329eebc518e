"""Group commit on SQLite and PostgreSQL, with real threads: sends that queue while another is
in the database commit in one transaction; each sender gets its own delivery (or its own
refusal, ledgered once), and nothing is lost, repeated or misattributed.

The send in the database is held there by a second connection that holds the lock it needs
(its target's row on PostgreSQL, the write lock on SQLite) until every other sender queued."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from agent_router import (
    AgentTerminatedError,
    CommitUnknownError,
    Delivery,
    LedgerAction,
    RouteOutcome,
    Router,
    Settings,
)
from agent_router.store.models import AgentRow

from .test_store_faults import FaultAt

QUEUED = 7


@pytest.fixture
def quiet_router(database_url: str) -> Iterator[Router]:
    """No publisher: the only transactions are the sends' own."""
    router = Router(Settings(database_url=database_url))
    yield router
    router.close()


@contextmanager
def held(router: Router, agent_id: int) -> Iterator[None]:
    """Hold ``agent_id``'s row lock (SQLite: the write lock) until the block ends."""
    with router.store.engine.connect() as conn:
        conn.begin()
        conn.execute(sa.select(AgentRow.id).where(AgentRow.id == agent_id).with_for_update())
        yield
        conn.rollback()


def commits(router: Router) -> list[int]:
    counted: list[int] = []
    event.listen(router.store.engine, "commit", lambda conn: counted.append(1))
    return counted


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def queue_behind_a_held_send(
    router: Router, team_id: int, names: list[str], send: Callable[[str], Any]
) -> list[Future[Any]]:
    """``send(names[0])`` held in the database, then ``send`` to each other name queued behind
    it; the hold is released once all of them queued. The futures, in ``names`` order."""
    combiner = router.store._sends.combiner
    first = router.agent(team_id, names[0])
    pool = ThreadPoolExecutor(max_workers=len(names))
    try:
        with held(router, first.id):
            futures = [pool.submit(send, names[0])]
            wait_for(lambda: combiner.leading and combiner.queued == 0)
            futures += [pool.submit(send, name) for name in names[1:]]
            wait_for(lambda: combiner.queued == len(names) - 1)
        for future in futures:
            future.exception(60)
    finally:
        pool.shutdown()
    return futures


def team_of(router: Router, n: int) -> tuple[int, list[str]]:
    team = router.create_team()
    names = [router.create_agent(team.id, role="Engineer").display_name for _ in range(n)]
    return team.id, names


def test_sends_queued_behind_one_in_the_database_commit_together(quiet_router: Router) -> None:
    router = quiet_router
    team_id, names = team_of(router, QUEUED + 1)
    counted = commits(router)
    futures = queue_behind_a_held_send(
        router, team_id, names, lambda to: router.send(team_id, to=to, content=f"for {to}")
    )
    deliveries: list[Delivery] = [f.result() for f in futures]
    # The held send's own transaction, then one for the seven queued behind it.
    assert len(counted) == 2
    assert all(d.outcome is RouteOutcome.TRIGGERED_NEW_TURN for d in deliveries)
    messages = {m.id: m for m in router.messages(team_id)}
    assert len(messages) == len(names) == len({d.message_id for d in deliveries})
    for name, delivery in zip(names, deliveries, strict=True):
        message = messages[delivery.message_id]
        assert message.content == f"for {name}"
        assert message.target_agent_id == router.agent(team_id, name).id
    for outbox in router.outbox(team_id):
        assert outbox.payload["agent"] in names
    assert len(router.outbox(team_id)) == len(names)  # one turn task each, none twice


def test_a_refused_send_of_a_batch_is_refused_alone_and_the_others_deliver(
    quiet_router: Router,
) -> None:
    router = quiet_router
    team_id, names = team_of(router, QUEUED + 1)
    gone = names[3]
    router.terminate(team_id, gone, reason="left the team")
    futures = queue_behind_a_held_send(
        router, team_id, names, lambda to: router.send(team_id, to=to, content=f"for {to}")
    )
    outcomes = dict(zip(names, futures, strict=True))
    with pytest.raises(AgentTerminatedError):
        outcomes.pop(gone).result()
    deliveries = {name: future.result() for name, future in outcomes.items()}
    messages = {m.id: m for m in router.messages(team_id)}
    assert sorted(m.content for m in messages.values()) == sorted(f"for {n}" for n in deliveries)
    assert all(messages[d.message_id].content == f"for {n}" for n, d in deliveries.items())
    rejected = [e for e in router.ledger(team_id) if e.action is LedgerAction.SEND_REJECTED]
    assert len(rejected) == 1 and gone in str(rejected[0].detail)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_batch_whose_commit_is_unknown_tells_every_sender_and_keys_make_retries_safe(
    quiet_router: Router,
) -> None:
    router = quiet_router
    team_id, names = team_of(router, QUEUED + 1)

    def send(to: str) -> Delivery:
        return router.send(team_id, to=to, content=f"for {to}", dedup_key=f"key-{to}")

    # The held send's commit and the batch's are both lost on the way.
    with FaultAt(router, "before_commit", times=2):
        futures = queue_behind_a_held_send(router, team_id, names, send)
    assert all(isinstance(f.exception(), CommitUnknownError) for f in futures)
    # Each sender retries with its key: every message is there once.
    retried = [send(name) for name in names]
    again = [send(name) for name in names]
    assert [d.message_id for d in again] == [d.message_id for d in retried]
    assert all(d.duplicate for d in again)
    assert sorted(m.content for m in router.messages(team_id)) == sorted(f"for {n}" for n in names)


def test_many_senders_many_rounds_each_message_once_in_each_senders_order(
    quiet_router: Router,
) -> None:
    """Eight threads, each an agent, send forty numbered messages each to four agents in
    turn; every message arrives once, and each target sees each sender's messages in order."""
    router = quiet_router
    threads, per = 8, 40
    team_id, agents = team_of(router, 4 + threads)
    names, senders = agents[:4], agents[4:]

    def sender(t: int) -> list[int]:
        return [
            router.send(
                team_id, to=names[(t + i) % len(names)], content=f"{t}:{i}", sender=senders[t]
            ).message_id
            for i in range(per)
        ]

    with ThreadPoolExecutor(max_workers=threads) as pool:
        sent = list(pool.map(sender, range(threads)))
    messages = router.messages(team_id)
    assert sorted(m.id for m in messages) == sorted(i for ids in sent for i in ids)
    assert sorted(m.content for m in messages) == sorted(
        f"{t}:{i}" for t in range(threads) for i in range(per)
    )
    for name in names:
        target = router.agent(team_id, name).id
        inbox = sorted((m for m in messages if m.target_agent_id == target), key=lambda m: m.seq)
        for t in range(threads):
            own = [int(m.content.split(":")[1]) for m in inbox if m.content.startswith(f"{t}:")]
            assert own == sorted(own)
