"""The sweeper on an in-process timer: the embedded mode's stand-in for ``celery beat``, and
what every standalone worker runs (:mod:`agent_router.worker.bootstep`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from agent_router.logfields import get_logger
from agent_router.router import Router
from agent_router.sweeper import SweepReport

logger = get_logger(__name__)


class SweeperThread:
    """Runs :meth:`Router.sweep` every ``period`` seconds (default ``Settings.sweep_seconds``)
    on a daemon thread until :meth:`stop`. A pass that raises is logged and the timer goes on:
    the next pass repairs whatever this one could not."""

    def __init__(
        self,
        router: Router,
        *,
        period: float | None = None,
        first_after: float | None = None,
        on_report: Callable[[SweepReport], None] | None = None,
        ready: threading.Event | None = None,
    ) -> None:
        self.router = router
        # Until ``ready`` is set (the worker consumes), passes only take over expired leases.
        self.ready = ready
        # Told every pass's report (the worker counts them in its metrics).
        self.on_report = on_report
        self.period = router.settings.sweep_seconds if period is None else period
        # When the first pass runs (default: one period in). Workers that each run a timer
        # start theirs at a random point of the period, so that their passes interleave.
        self.first_after = self.period if first_after is None else first_after
        self.passes = 0
        self.last_report: SweepReport | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-router-sweeper", daemon=True)

    def start(self) -> SweeperThread:
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the timer and wait for a pass in progress to finish."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def __enter__(self) -> SweeperThread:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        # Passes are due on a fixed grid, so a slow pass does not push every later one back.
        due = time.monotonic() + self.first_after
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            due = max(due + self.period, time.monotonic())
            try:
                takeovers_only = self.ready is not None and not self.ready.is_set()
                self.last_report = self.router.sweep(takeovers_only=takeovers_only)
                if self.on_report is not None:
                    self.on_report(self.last_report)
            except Exception:
                logger.exception("sweep failed", extra={"action": "sweep_failed"})
            self.passes += 1
