"""The combiner behind group commit, with real threads: every caller gets the result of its
own item (or its own error), each item's work is done once, a batch is done by one thread
while the others wait, and a lone caller does its work by itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_router.store.group_commit import Combiner


class ItemFailedError(Exception):
    pass


class Work:
    """``alone`` and ``together`` that record what they did; an item below zero fails.
    ``gate``, when given, holds every batch's work until it is set."""

    def __init__(self, gate: threading.Event | None = None, *, pause: float = 0.0) -> None:
        self.gate = gate
        self.pause = pause
        self.lock = threading.Lock()
        self.done: list[int] = []
        self.batches: list[list[int]] = []
        self.alone_threads: dict[int, int] = {}

    def _hold(self) -> None:
        if self.gate is not None:
            assert self.gate.wait(30)
        time.sleep(self.pause)  # while it works, other callers queue

    def alone(self, item: int) -> int:
        self._hold()
        with self.lock:
            self.done.append(item)
            self.alone_threads[item] = threading.get_ident()
        if item < 0:
            raise ItemFailedError(item)
        return item * 10

    def together(self, items: list[int]) -> list[Callable[[], int]]:
        self._hold()
        with self.lock:
            self.batches.append(list(items))
            self.done.extend(i for i in items if i >= 0)
        # A failing item is done again on its own, by its own thread.
        return [partial(self.alone, i) if i < 0 else partial(_times_ten, i) for i in items]


def _times_ten(item: int) -> int:
    return item * 10


def run_all(combiner: Combiner[int, int], items: list[int]) -> dict[int, int | str]:
    def one(item: int) -> int | str:
        try:
            return combiner.run(item)
        except ItemFailedError as exc:
            return f"failed {exc.args[0]}"

    with ThreadPoolExecutor(max_workers=len(items) or 1) as pool:
        return dict(zip(items, pool.map(one, items), strict=True))


def test_a_lone_caller_does_its_own_work_and_leaves_nobody_leading() -> None:
    work = Work()
    combiner = Combiner(work.alone, work.together)
    assert combiner.run(4) == 40
    assert work.alone_threads == {4: threading.get_ident()} and work.batches == []
    assert not combiner.leading and combiner.queued == 0


def test_callers_queued_behind_a_busy_leader_are_done_in_one_batch() -> None:
    gate = threading.Event()
    work = Work(gate)
    combiner = Combiner(work.alone, work.together)
    with ThreadPoolExecutor(max_workers=8) as pool:
        first = pool.submit(combiner.run, 1)
        _wait(lambda: combiner.leading and combiner.queued == 0)
        rest = [pool.submit(combiner.run, i) for i in range(2, 9)]
        _wait(lambda: combiner.queued == 7)
        gate.set()
        assert first.result(30) == 10
        assert [f.result(30) for f in rest] == [i * 10 for i in range(2, 9)]
    assert work.alone_threads.keys() == {1}
    assert [sorted(b) for b in work.batches] == [list(range(2, 9))]
    assert not combiner.leading and combiner.queued == 0


def test_a_batch_is_at_most_max_batch_and_the_rest_lead_next() -> None:
    gate = threading.Event()
    work = Work(gate)
    combiner = Combiner(work.alone, work.together, max_batch=3)
    with ThreadPoolExecutor(max_workers=8) as pool:
        first = pool.submit(combiner.run, 1)
        _wait(lambda: combiner.leading)
        rest = [pool.submit(combiner.run, i) for i in range(2, 9)]
        _wait(lambda: combiner.queued == 7)
        gate.set()
        assert [f.result(30) for f in [first, *rest]] == [i * 10 for i in range(1, 9)]
    # The leader's own item alone, then two batches of three; the last one queued is alone.
    assert [len(b) for b in work.batches] == [3, 3] and len(work.alone_threads) == 2
    assert sorted(work.done) == list(range(1, 9))


def test_a_failing_item_fails_only_its_own_caller() -> None:
    gate = threading.Event()
    work = Work(gate)
    combiner = Combiner(work.alone, work.together)
    with ThreadPoolExecutor(max_workers=8) as pool:
        first = pool.submit(combiner.run, -1)  # fails on its own, while leading
        _wait(lambda: combiner.leading)
        rest = {i: pool.submit(combiner.run, i) for i in (2, -3, 4, 5)}
        _wait(lambda: combiner.queued == 4)
        gate.set()
        try:
            first.result(30)
        except ItemFailedError as exc:
            assert exc.args == (-1,)
        else:
            raise AssertionError("the leader's own failure did not reach it")
        outcomes: dict[int, int | str] = {}
        for i, future in rest.items():
            try:
                outcomes[i] = future.result(30)
            except ItemFailedError as exc:
                outcomes[i] = f"failed {exc.args[0]}"
    assert outcomes == {2: 20, -3: "failed -3", 4: 40, 5: 50}
    # The failing queued item was done again by its own thread, not by the leader.
    assert work.alone_threads[-3] != work.alone_threads[-1]


def test_a_together_cut_short_leaves_each_caller_to_do_its_own() -> None:
    def broken(items: list[int]) -> list[Callable[[], int]]:
        raise KeyboardInterrupt  # not an Exception: it escapes even a careful together

    gate = threading.Event()
    work = Work(gate)
    combiner = Combiner(work.alone, broken)
    with ThreadPoolExecutor(max_workers=4) as pool:
        first = pool.submit(combiner.run, 1)
        _wait(lambda: combiner.leading)
        rest = [pool.submit(combiner.run, i) for i in (2, 3)]
        _wait(lambda: combiner.queued == 2)
        gate.set()
        assert first.result(30) == 10
        outcomes: list[int | str] = []
        for future in rest:
            try:
                outcomes.append(future.result(30))
            except KeyboardInterrupt:
                outcomes.append("interrupted")
    # The thread that led the batch met the interruption; the other did its own work.
    assert sorted(map(str, outcomes)) in (["20", "interrupted"], ["30", "interrupted"])
    assert not combiner.leading and combiner.queued == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=-50, max_value=50), min_size=1, max_size=24, unique=True))
def test_every_caller_gets_its_own_outcome_and_every_item_is_done_once(items: list[int]) -> None:
    work = Work(pause=0.001)
    combiner = Combiner(work.alone, work.together, max_batch=5)
    outcomes = run_all(combiner, items)
    assert outcomes == {i: (f"failed {i}" if i < 0 else i * 10) for i in items}
    assert sorted(work.done) == sorted(items)
    assert all(1 < len(b) <= 5 for b in work.batches)
    assert not combiner.leading and combiner.queued == 0


def test_many_rounds_of_many_threads_lose_and_repeat_nothing() -> None:
    work = Work(pause=0.001)
    combiner = Combiner(work.alone, work.together, max_batch=4)
    for round_ in range(50):
        items = list(range(round_ * 100, round_ * 100 + 16))
        assert run_all(combiner, items) == {i: i * 10 for i in items}
    assert sorted(work.done) == [r * 100 + i for r in range(50) for i in range(16)]
    assert work.batches and all(1 < len(b) <= 4 for b in work.batches)


def _wait(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)
