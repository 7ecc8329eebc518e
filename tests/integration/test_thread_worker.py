"""In-process Celery workers started one after another on a real Redis broker: each runs on an
event loop of its own, takes every task sent to it, and stops."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from celery import Celery

from agent_router.worker.threaded import thread_worker

WORKERS = 6
TASKS = 4
TIMEOUT = 60.0


def test_workers_one_after_another_each_run_on_a_loop_of_their_own_and_take_every_task(
    redis_url: str,
) -> None:
    app = Celery(f"thread_worker_{uuid.uuid4().hex[:6]}", broker=redis_url)
    app.conf.broker_connection_retry_on_startup = True
    ran: list[tuple[int, int]] = []
    lock = threading.Lock()

    @app.task(name="thread_worker_test.note")
    def note(worker: int, task: int) -> None:
        with lock:
            ran.append((worker, task))

    hubs = []
    try:
        for w in range(WORKERS):
            queue = f"thread_worker_test.{uuid.uuid4().hex[:8]}"
            with thread_worker(app, concurrency=2, queues=[queue], shutdown_timeout=30.0) as worker:
                for t in range(TASKS):
                    note.apply_async((w, t), queue=queue)
                deadline = time.monotonic() + TIMEOUT
                while sum(1 for r in ran if r[0] == w) < TASKS and time.monotonic() < deadline:
                    time.sleep(0.02)
                # The loop's ticks poll this worker's connection only: a hub taken over from
                # an earlier worker kept polling that worker's connection as well.
                hub: Any = worker.hub  # kombu's Hub (Celery's stubs leave out its on_tick)
                assert hub is not None and len(hub.on_tick) == 1
                hubs.append(hub)
            assert sorted(t for v, t in ran if v == w) == list(range(TASKS))
    finally:
        app.close()
    assert len({id(hub) for hub in hubs}) == WORKERS  # every worker on an event loop of its own


def test_a_worker_started_while_another_runs_has_a_loop_of_its_own_and_the_first_goes_on(
    redis_url: str,
) -> None:
    app = Celery(f"thread_worker_{uuid.uuid4().hex[:6]}", broker=redis_url)
    app.conf.broker_connection_retry_on_startup = True
    ran: list[str] = []
    lock = threading.Lock()

    @app.task(name="thread_worker_test.mark")
    def mark(tag: str) -> None:
        with lock:
            ran.append(tag)

    def settle(tags: list[str]) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not set(tags) <= set(ran) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert set(tags) <= set(ran)

    first_queue, second_queue = (f"thread_worker_test.{uuid.uuid4().hex[:8]}" for _ in "ab")
    try:
        with thread_worker(app, concurrency=2, queues=[first_queue]) as first:
            with thread_worker(app, concurrency=2, queues=[second_queue]) as second:
                assert second.hub is not first.hub
                tags = [f"{q}:{i}" for q in (first_queue, second_queue) for i in range(TASKS)]
                for tag in tags:
                    mark.apply_async((tag,), queue=tag.split(":")[0])
                settle(tags)
            # The second stopped; the first still takes what is sent to it.
            after = [f"{first_queue}:after:{i}" for i in range(TASKS)]
            for tag in after:
                mark.apply_async((tag,), queue=first_queue)
            settle(after)
    finally:
        app.close()
    assert len(ran) == len(set(ran)) == 3 * TASKS  # each once
