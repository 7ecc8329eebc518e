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
``capacity`` of them, and at most ``max_entries`` entries in all (those read and those a view
holds), so that a process's memory stays bounded while the transcripts grow. An agent let go is
read again at its next turn's first call: its request window from where it last stood (see
:class:`~agent_router.agents.context.ContextWindow`), its whole transcript only for a reader of
the whole (:meth:`~agent_router.turn.Turn.history`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sized
from typing import Any

#: Reads the entries after a position (all with ``None``), with their positions.
ReadAfter = Callable[[int, int | None], list[tuple[int, dict[str, Any]]]]


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

    def refresh(self, read_after: ReadAfter) -> int:
        """Append the entries written since the last read; returns how many were read."""
        with self.lock:
            if self.position is None:
                return self._extend(read_after(self.agent_id, None))
            rows = read_after(self.agent_id, self.position - 1)
            if rows and rows[0][0] == self.position and rows[0][1] == self.entries[-1]:
                return self._extend(rows[1:])
            self.entries = []
            self.position = None
            self.views = {}
            self.generation += 1
            return self._extend(read_after(self.agent_id, None))

    def size(self) -> int:
        """The entries held: read, and held by the views (their ``len``)."""
        return len(self.entries) + sum(
            len(view) for view in self.views.values() if isinstance(view, Sized)
        )

    def _extend(self, rows: list[tuple[int, dict[str, Any]]]) -> int:
        if rows:
            self.entries.extend(payload for _position, payload in rows)
            self.position = rows[-1][0]
        return len(rows)


class TranscriptCache:
    """The transcripts this process read most recently, at most ``capacity`` agents' and
    ``max_entries`` entries in all (the most recent agent is kept whatever its length); safe
    between threads."""

    def __init__(self, capacity: int, max_entries: int | None = None) -> None:
        self.capacity = capacity
        self.max_entries = max_entries
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
            if self.max_entries is not None:
                held = sum(kept.size() for kept in self._agents.values())
                while held > self.max_entries and len(self._agents) > 1:
                    _agent, oldest = self._agents.popitem(last=False)
                    held -= oldest.size()
            return cached

    def entries(self) -> int:
        """The entries held, of every agent kept (:meth:`CachedTranscript.size`)."""
        with self._lock:
            return sum(kept.size() for kept in self._agents.values())

    def forget(self, agent_id: int) -> None:
        with self._lock:
            self._agents.pop(agent_id, None)

    def clear(self) -> None:
        with self._lock:
            self._agents.clear()


__all__ = ["CachedTranscript", "ReadAfter", "TranscriptCache"]
