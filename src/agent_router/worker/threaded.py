"""A full Celery worker on threads inside this process: what ``run`` uses on its embedded
broker, the bench on a real one, and the pytest plugin's worker fixture.

It is Celery's own (``celery.contrib.testing.worker.start_worker``: consumer, thread pool,
acks, events; it returns once the consumer is ready), with two things of its own, so that it
shares a process with other workers (a host's test worker, another of ours):

- **An event loop of its own.** kombu keeps one current event loop per process
  (``kombu.asynchronous``) and a starting worker takes the one it finds: two workers running
  at once would share one loop, polled by both consumer threads, and before kombu 5.6.1 a
  stopped worker's closed loop stayed current for the next. On kombu 5.3.0 a suite that starts
  Redis workers one after another saw, about one run in ten, a consumer wait to read the reply
  to a command it had not sent (no BRPOP pending, a socket without a timeout): that worker took
  no more tasks and never stopped. So the worker starts with no loop current (its own is
  made), and whatever was current before is current again once it has started: no other
  worker takes its loop.
- **A stop of its own.** Celery's testing worker stops on a flag that every worker of the
  process reads (``celery.worker.state.should_terminate``), so stopping one stopped the others
  too. This one is stopped inside its own loop first (the loop raises Celery's
  ``WorkerTerminate``, as the flag would make it), and only then does ``start_worker`` set
  the flag, for the moment it takes to see that thread has ended. A worker without a loop
  (the in-memory broker: the embedded mode's one worker) stops on the flag."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery import Celery
    from celery.worker import WorkController


@contextmanager
def thread_worker(
    app: Celery,
    *,
    concurrency: int,
    queues: Sequence[str] | None = None,
    shutdown_timeout: float = 60.0,
    loglevel: str = "WARNING",
) -> Iterator[WorkController]:
    """Run a worker of ``app`` on ``concurrency`` threads (consuming ``queues``, or the app's
    default queue) while the block runs, on an event loop no other worker uses, stopped
    without stopping the others. ``shutdown_timeout``: how long its stop may take before it
    raises (a loaded machine stops the threads slowly). The ping check needs a result backend,
    so it is off."""
    from celery.contrib.testing.worker import TestWorkController, start_worker
    from celery.exceptions import WorkerTerminate
    from kombu.asynchronous import get_event_loop, set_event_loop

    threads: list[threading.Thread] = []

    class OwnWorker(TestWorkController):
        """Tells the thread it runs on, to be stopped alone."""

        def start(self) -> None:
            threads.append(threading.current_thread())
            super().start()

    options: dict[str, Any] = {} if queues is None else {"queues": list(queues)}
    before = get_event_loop()
    set_event_loop(None)  # the worker's Hub step makes a new one
    try:
        with start_worker(
            app,
            pool="threads",
            concurrency=concurrency,
            perform_ping_check=False,
            shutdown_timeout=shutdown_timeout,
            loglevel=loglevel,
            WorkController=OwnWorker,
            **options,
        ) as worker:
            set_event_loop(before)  # the worker holds its own (worker.hub)
            blueprint: Any = worker.blueprint
            running = blueprint.state
            try:
                yield worker
            finally:
                hub: Any = worker.hub

                def terminate() -> None:
                    if blueprint.state == running:  # not when it stops already
                        raise WorkerTerminate(0)

                if hub is not None and threads:
                    hub.call_soon(terminate)
                    threads[0].join(shutdown_timeout)
    finally:
        set_event_loop(before)
