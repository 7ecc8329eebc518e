"""Giving a worker's freed memory back to the system once its turns are over.

A turn loads its agent's transcript, builds the model request from it and parses the reply:
megabytes for a long conversation, allocated and freed on the worker's threads. CPython hands
large blocks to the C allocator, and glibc keeps what was freed in per-thread arenas for the
next allocation instead of returning it, so a thread-pool worker's resident size follows the
largest turns it has run, not the ones it runs, and stays there when it goes idle. When the
last running turn of the process ends, :func:`turn_running` asks glibc to release its free
pages (``malloc_trim(0)``), at most once per :data:`TRIM_INTERVAL_SECONDS`. Elsewhere (musl,
macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: The least time between two trims: a busy worker whose turns keep overlapping never trims
#: on every turn's end.
TRIM_INTERVAL_SECONDS = 10.0


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


class _Turns:
    lock = threading.Lock()
    running = 0
    trimmed_at = -TRIM_INTERVAL_SECONDS
    trim = _malloc_trim()


def trim() -> bool:
    """Return the C allocator's free pages to the system now; false where it cannot."""
    if _Turns.trim is None:
        return False
    _Turns.trim(0)
    return True


@contextmanager
def turn_running() -> Iterator[None]:
    """Around one turn: the last of the process's running turns to end trims (see the module
    docstring)."""
    with _Turns.lock:
        _Turns.running += 1
    try:
        yield
    finally:
        with _Turns.lock:
            _Turns.running -= 1
            now = time.monotonic()
            due = _Turns.running == 0 and now - _Turns.trimmed_at >= TRIM_INTERVAL_SECONDS
            if due:
                _Turns.trimmed_at = now
        if due:
            trim()
