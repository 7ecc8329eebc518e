"""A worker gives its freed memory back when its last running turn ends: glibc's malloc_trim,
called once per quiet spell, not on every turn's end."""

from __future__ import annotations

import threading

import pytest

from agent_router.worker import memory


def test_trim_works_here() -> None:
    assert memory.trim() is True  # glibc Linux, as the workers run


def test_the_last_turn_to_end_trims_at_most_once_an_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trims: list[int] = []

    def counted(pad: int) -> int:
        trims.append(pad)
        return 1

    monkeypatch.setattr(memory._Turns, "trim", counted)
    monkeypatch.setattr(memory._Turns, "trimmed_at", -memory.TRIM_INTERVAL_SECONDS)
    first_started, second_ended = threading.Event(), threading.Event()

    def overlapping() -> None:
        with memory.turn_running():
            first_started.set()
            second_ended.wait(10)

    thread = threading.Thread(target=overlapping)
    thread.start()
    first_started.wait(10)
    with memory.turn_running():
        pass
    assert trims == []  # another turn still runs
    second_ended.set()
    thread.join(10)
    assert trims == [0]  # the last one out trims
    with memory.turn_running():
        pass
    assert trims == [0]  # within the interval: not again
    monkeypatch.setattr(memory._Turns, "trimmed_at", -memory.TRIM_INTERVAL_SECONDS)
    with memory.turn_running():
        pass
    assert trims == [0, 0]
