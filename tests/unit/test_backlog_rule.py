"""The rule that tells a turn task still queued behind a backlog from a lost one, by the
broker's depth of its queue (``store.recovery.still_queued``)."""

from __future__ import annotations

from datetime import datetime, timedelta

from agent_router.store.recovery import backoff_windows, still_queued
from agent_router.store.values import Scheduled

T0 = datetime(2026, 12, 1, 12, 0, 0)


def _agent(published_at: datetime, sent: int = 1) -> Scheduled:
    return Scheduled(
        agent_id=1,
        team_id=1,
        epoch=1,
        runner=None,
        sent=sent,
        unpublished=0,
        last_published=published_at,
    )


def _published(count: int) -> list[datetime]:
    """``count`` tasks published a second apart, from T0 on."""
    return [T0 + timedelta(seconds=i) for i in range(count)]


def test_a_task_is_queued_while_the_queue_holds_every_task_from_its_own_on() -> None:
    published = _published(300)  # a backlog of 300 tasks, none lost
    later = T0 + timedelta(hours=1)  # however long ago, in delivery windows
    for i in (0, 150, 299):
        behind = 300 - i
        agent = _agent(published[i])
        assert still_queued(agent, published, behind, as_of=later)
        assert not still_queued(agent, published, behind - 1, as_of=later)


def test_a_lost_task_is_told_whatever_the_depth() -> None:
    published = _published(300)
    # The broker lost everything (a restart): an empty queue holds nobody's task.
    assert not any(still_queued(_agent(p), published, 0, as_of=T0 + timedelta(hours=1))
                   for p in published)  # fmt: skip
    # A worker died holding the two oldest (taken from the queue, never claimed): the queue
    # holds the other 298. Those two are told lost; every agent behind them is still queued.
    later = T0 + timedelta(hours=1)
    assert not still_queued(_agent(published[0]), published, 298, as_of=later)
    assert not still_queued(_agent(published[1]), published, 298, as_of=later)
    assert all(still_queued(_agent(p), published, 298, as_of=later) for p in published[2:])


def test_publishes_the_depth_did_not_see_are_not_counted() -> None:
    """The depth is read first; a task published after it is not in it, and does not make an
    agent ahead of it look lost."""
    published = _published(10)
    depth_read = published[4]  # five tasks queued when the broker answered
    agent = _agent(published[2])  # three of them from this agent's on
    assert still_queued(agent, published, 3, as_of=depth_read)
    assert not still_queued(agent, published, 2, as_of=depth_read)


def test_re_enqueues_of_one_epoch_back_off() -> None:
    assert [backoff_windows(_agent(T0, sent=n)) for n in (1, 2, 3, 4, 7, 20)] == [
        1,
        2,
        4,
        8,
        32,
        32,
    ]
