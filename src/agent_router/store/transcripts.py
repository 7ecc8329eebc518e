"""The transcripts this process has read, kept so that a model call reads only what is new.

A transcript only grows: entries are appended at the agent's next position and never changed
(a prune or a team deletion removes an agent's rows with the agent). So a process that read an
agent's transcript up to position ``p`` brings it up to date by reading the entries after ``p``,
whichever process appended them: another worker's turn, the router's answers, drained messages.
The read starts at ``p`` itself and checks that the entry there is the one kept: if it is not
(the rows were deleted, or SQLite gave a deleted agent's id to a new one), the transcript is
read again whole.

:class:`CachedTranscript` also keeps ``views``: what a reader derives from the transcript (the
agent loop's request window, :mod:`agent_router.agents.context`, which holds only the entries
its requests hold and reads only those). The cache holds the agents used most recently: at most
``capacity`` of them, at most ``max_entries`` entries in all (those read and those a view
holds) and at most ``max_bytes`` bytes of them (:func:`entry_bytes`, counted once per entry as
it is read or taken into a view), so that a process's memory stays bounded while the
transcripts grow, whatever the size of their entries. An agent let go is
read again at its next turn's first call: its request window from where it last stood (see
:class:`~agent_router.agents.context.ContextWindow`), its whole transcript only for a reader of
the whole (:meth:`~agent_router.turn.Turn.history`).
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sized
from typing import Any

#: Reads the entries after a position (all with ``None``), with their positions.
ReadAfter = Callable[[int, int | None], list[tuple[int, dict[str, Any]]]]


def entry_bytes(value: Any) -> int:
    """The memory an entry holds: its strings' and containers' sizes as Python keeps them
    (``sys.getsizeof``), summed over its parts. Strings shared with another entry are
    counted in each, so the sum errs high."""
    if isinstance(value, dict):
        return sys.getsizeof(value) + sum(entry_bytes(k) + entry_bytes(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sys.getsizeof(value) + sum(entry_bytes(v) for v in value)
    return sys.getsizeof(value)


class CachedTranscript:
    """One agent's transcript as this process last read it. ``entries`` only grows while the
    agent's rows stay (see the module docstring); hold ``lock`` while reading it or its views
    if another thread may refresh it."""

    def __init__(self, agent_id: int) -> None:
        self.agent_id = agent_id
        self.lock = threading.RLock()
        self.entries: list[dict[str, Any]] = []
        self.position: int | None = None  # of the last entry in ``entries``
        self.generation = 0  # bumped when the entries were read again whole
        self.views: dict[str, Any] = {}
        self._bytes = 0  # of ``entries`` (:func:`entry_bytes`)

    def refresh(self, read_after: ReadAfter) -> int:
        """Append the entries written since the last read; returns how many were read."""
        with self.lock:
            if self.position is None:
                return self._extend(read_after(self.agent_id, None))
            rows = read_after(self.agent_id, self.position - 1)
            if rows and rows[0][0] == self.position and rows[0][1] == self.entries[-1]:
                return self._extend(rows[1:])
            self.entries = []
            self._bytes = 0
            self.position = None
            self.views = {}
            self.generation += 1
            return self._extend(read_after(self.agent_id, None))

    def size(self) -> int:
        """The entries held: read, and held by the views (their ``len``)."""
        return len(self.entries) + sum(
            len(view) for view in self.views.values() if isinstance(view, Sized)
        )

    def nbytes(self) -> int:
        """The bytes held (:func:`entry_bytes`): of the entries read, and of the views' (their
        ``nbytes``)."""
        return self._bytes + sum(getattr(view, "nbytes", 0) for view in self.views.values())

    def _extend(self, rows: list[tuple[int, dict[str, Any]]]) -> int:
        if rows:
            self.entries.extend(payload for _position, payload in rows)
            self._bytes += sum(entry_bytes(payload) for _position, payload in rows)
            self.position = rows[-1][0]
        return len(rows)


class TranscriptCache:
    """The transcripts this process read most recently, at most ``capacity`` agents',
    ``max_entries`` entries and ``max_bytes`` bytes in all (the most recent agent is kept
    whatever its size); safe between threads."""

    def __init__(
        self, capacity: int, max_entries: int | None = None, max_bytes: int | None = None
    ) -> None:
        self.capacity = capacity
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._agents: OrderedDict[int, CachedTranscript] = OrderedDict()

    def get(self, agent_id: int) -> CachedTranscript:
        """The agent's cached transcript (empty until refreshed), now the most recent; the
        least recent are let go while the cache holds more than it may."""
        with self._lock:
            cached = self._agents.get(agent_id)
            if cached is None:
                cached = self._agents[agent_id] = CachedTranscript(agent_id)
            else:
                self._agents.move_to_end(agent_id)
            while len(self._agents) > max(1, self.capacity):
                self._agents.popitem(last=False)
            for bound, size in ((self.max_entries, CachedTranscript.size),
                                (self.max_bytes, CachedTranscript.nbytes)):  # fmt: skip
                if bound is None:
                    continue
                held = sum(size(kept) for kept in self._agents.values())
                while held > bound and len(self._agents) > 1:
                    _agent, oldest = self._agents.popitem(last=False)
                    held -= size(oldest)
            return cached

    def entries(self) -> int:
        """The entries held, of every agent kept (:meth:`CachedTranscript.size`)."""
        with self._lock:
            return sum(kept.size() for kept in self._agents.values())

    def nbytes(self) -> int:
        """The bytes held, of every agent kept (:meth:`CachedTranscript.nbytes`)."""
        with self._lock:
            return sum(kept.nbytes() for kept in self._agents.values())

    def forget(self, agent_id: int) -> None:
        with self._lock:
            self._agents.pop(agent_id, None)

    def clear(self) -> None:
        with self._lock:
            self._agents.clear()


__all__ = ["CachedTranscript", "ReadAfter", "TranscriptCache", "entry_bytes"]
