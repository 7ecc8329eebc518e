"""Group commit: the sends of one process's threads that arrive while another send is in the
database are routed together, in one transaction, by whichever of those threads leads.

A send on its own is not delayed: the first thread finds nobody leading, leads and routes its
message alone, as it always did. Threads that send meanwhile queue; when the leader's
transaction ends, the first of them leads and routes the whole queue (up to
:data:`MAX_BATCH`) in one transaction: one ``BEGIN`` and one ``COMMIT`` (one flush of the
write-ahead log) for all of them, where each would have paid its own. Each thread then
publishes what its own message wrote (a turn task, a wake signal) and returns, as after a
send of its own: a send still returns once its message is committed and published.

What each message sees does not change. They are routed one after the other, each as it
would be alone, in the order every transaction locks agents in (team, then agent id; the ids
are read first, in one statement); messages to one target keep the order they arrived in, and
a thread has one send in the queue at a time, so its own sends keep their order. If one
message of a batch is refused, or the transaction fails before its ``COMMIT``, nothing of the
batch is written and every message of it is routed again on its own, in its own thread: each
gets its own delivery or its own refusal, ledgered once. A ``COMMIT`` whose outcome is unknown
is never repeated: every sender of the batch gets
:class:`~agent_router.errors.CommitUnknownError`, as a send of its own would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import Generic, TypeVar

from agent_router import errors
from agent_router.domain import Delivery, OutboxEntry
from agent_router.store import faults, routing
from agent_router.store.tx import Refused, Tx
from agent_router.store.values import SendRequest

T = TypeVar("T")
R = TypeVar("R")

#: The most messages one transaction routes together; more wait for the next one.
MAX_BATCH = 32


class _Slot(Generic[T, R]):
    """One thread's item in the queue: ``ready`` is set when its outcome (``finish``, run by
    that thread) is known, or when the thread is to lead (``leads``)."""

    __slots__ = ("finish", "item", "leads", "ready")

    def __init__(self, item: T) -> None:
        self.item = item
        self.ready = threading.Event()
        self.leads = False
        self.finish: Callable[[], R] | None = None


class Combiner(Generic[T, R]):
    """Flat combining: :meth:`run` from many threads, one of them (the leader) doing the work
    of everyone queued, one batch at a time.

    ``alone(item)`` does an item's work by itself; the leader calls it for a batch of one.
    ``together(items)`` does a batch's work and returns, for each item in order, what its
    thread then runs to get its result (or its error); it never raises."""

    def __init__(
        self,
        alone: Callable[[T], R],
        together: Callable[[list[T]], list[Callable[[], R]]],
        *,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self._alone = alone
        self._together = together
        self._max_batch = max_batch
        self._lock = threading.Lock()
        self._queue: list[_Slot[T, R]] = []
        self._leading = False

    @property
    def leading(self) -> bool:
        """A thread is doing a batch's work now."""
        return self._leading

    @property
    def queued(self) -> int:
        """Threads waiting for the leader (or to lead)."""
        return len(self._queue)

    def run(self, item: T) -> R:
        slot: _Slot[T, R] = _Slot(item)
        with self._lock:
            self._queue.append(slot)
            leads = not self._leading
            self._leading = True
        if not leads:
            slot.ready.wait()
            leads = slot.leads
        if leads:
            self._lead()
        assert slot.finish is not None
        return slot.finish()

    def _lead(self) -> None:
        """Take the queue's head (this thread's slot first), do its work, hand the lead to the
        next thread queued, then release the batch."""
        with self._lock:
            batch = self._queue[: self._max_batch]
            del self._queue[: self._max_batch]
        try:
            if len(batch) == 1:
                batch[0].finish = _settled(self._alone, batch[0].item)
            else:
                finishes = self._together([slot.item for slot in batch])
                for slot, finish in zip(batch, finishes, strict=True):
                    slot.finish = finish
        finally:
            with self._lock:
                if self._queue:
                    head = self._queue[0]
                    head.leads = True
                    head.ready.set()
                else:
                    self._leading = False
            for slot in batch:
                if slot.finish is None:  # the work was cut short: each does its own
                    slot.finish = partial(self._alone, slot.item)
                slot.ready.set()


def _settled(fn: Callable[[T], R], item: T) -> Callable[[], R]:
    """``fn(item)`` run now; what returns its result, or raises its error, later."""
    try:
        result = fn(item)
    except Exception as exc:
        error = exc

        def fail() -> R:
            raise error

        return fail
    return lambda: result


class _RefusedInBatchError(Exception):
    """A message of the batch was refused: the batch is rolled back and routed one by one."""


class Sends:
    """The store's routing of single sends through a :class:`Combiner`. ``tx(publish)`` opens
    the store's transaction (``publish=False``: the committed outbox rows are not handed to
    the publisher); ``publish`` hands rows to it."""

    def __init__(
        self,
        tx: Callable[[bool], AbstractContextManager[Tx]],
        publish: Callable[[list[OutboxEntry]], None],
    ) -> None:
        self._tx = tx
        self._publish = publish
        self._combiner: Combiner[SendRequest, Delivery] = Combiner(self._alone, self._together)

    @property
    def combiner(self) -> Combiner[SendRequest, Delivery]:
        return self._combiner

    def route(self, req: SendRequest) -> Delivery:
        return self._combiner.run(req)

    @faults.retrying
    def _alone(self, req: SendRequest) -> Delivery:
        with self._tx(True) as tx:
            return routing.route(tx, req)

    def _together(self, reqs: list[SendRequest]) -> list[Callable[[], Delivery]]:
        try:
            routed = self._commit_together(reqs)
        except errors.CommitUnknownError as exc:
            return [partial(_commit_unknown, str(exc)) for _ in reqs]
        except Exception:
            return [partial(self._alone, req) for req in reqs]
        return [partial(self._published, delivery, entries) for delivery, entries in routed]

    @faults.retrying
    def _commit_together(
        self, reqs: Sequence[SendRequest]
    ) -> list[tuple[Delivery, list[OutboxEntry]]]:
        """Route ``reqs`` in one transaction; for each, its delivery and the outbox rows it
        wrote (published by its own thread)."""
        routed: dict[int, tuple[Delivery, list[OutboxEntry]]] = {}
        with self._tx(False) as tx:
            for i in routing.lock_order(tx, reqs):
                written = len(tx.entries)
                try:
                    delivery = routing.route(tx, reqs[i])
                except Refused:
                    raise _RefusedInBatchError from None
                routed[i] = (delivery, tx.entries[written:])
        return [routed[i] for i in range(len(reqs))]

    def _published(self, delivery: Delivery, entries: list[OutboxEntry]) -> Delivery:
        if entries:
            self._publish(entries)
        return delivery


def _commit_unknown(message: str) -> Delivery:
    raise errors.CommitUnknownError(message)
