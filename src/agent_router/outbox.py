"""Publishing side effects that routing committed to the outbox.

The database is the truth; a publisher only turns an outbox row into a signal (a Celery task, a
wake key). A lost signal is repaired by re-publishing unpublished rows; a duplicated one is
harmless because turn tasks are fenced by ``(agent_id, epoch)``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from agent_router.domain import OutboxEntry
from agent_router.logfields import get_logger

logger = get_logger(__name__)


class Publisher(Protocol):
    """Turns one committed outbox entry into a signal. Raising leaves the row unpublished."""

    def publish(self, entry: OutboxEntry) -> None: ...


@runtime_checkable
class QueueDepth(Protocol):
    """A publisher that can tell how many messages wait in a queue of its broker: with it the
    sweeper tells a turn task still queued behind a backlog from a lost one."""

    def queue_depth(self, queue: str) -> int | None:
        """Messages waiting in ``queue`` (not those a worker holds); ``None`` when the broker
        cannot be asked."""


class CallbackPublisher:
    """Hands each entry to a function: for hosts that run turns themselves, and for tests."""

    def __init__(self, callback: Callable[[OutboxEntry], None]) -> None:
        self._callback = callback

    def publish(self, entry: OutboxEntry) -> None:
        self._callback(entry)


class RecordingPublisher:
    """Keeps every published entry in memory, in publish order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries: list[OutboxEntry] = []

    def publish(self, entry: OutboxEntry) -> None:
        with self._lock:
            self.entries.append(entry)
