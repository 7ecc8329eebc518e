"""The sweeper: one pass that repairs whatever a crash, a lost signal or a dead worker left
behind. Beat runs it every ``Settings.sweep_seconds``; the embedded mode runs it on a timer.
Every step is idempotent, so two sweepers running at once only duplicate fenced signals."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agent_router.domain import BackgroundJob
    from agent_router.outbox import Publisher
    from agent_router.settings import Settings
    from agent_router.store import Store

logger = logging.getLogger(__name__)


@runtime_checkable
class JobOutcomes(Protocol):
    """Where the poller reads a background job's outcome (a Celery result backend)."""

    def job_outcome(self, task_id: str) -> tuple[bool, str] | None:
        """``(succeeded, result text)`` once the task finished; ``None`` while it has not (or
        nothing is known about it)."""


class Sweepable(Protocol):
    """What a pass needs of the router (:class:`~agent_router.router.Router` is one)."""

    settings: Settings
    store: Store
    publisher: Publisher | None

    def publish_outbox(
        self, publisher: Publisher | None = None, *, older_than_seconds: float = 0.0
    ) -> int: ...

    def expire_questions(self) -> int: ...

    def finish_background(self, job_id: int, *, ok: bool, result: str) -> BackgroundJob: ...


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    republished: int  # outbox rows published again (the first publish was lost)
    taken_over: int  # running turns whose lease expired, fenced and recovered
    reenqueued: int  # agents stuck in `scheduled` whose turn task vanished
    expired: int  # questions resolved `expired` past their deadline
    jobs_reported: int = 0  # background jobs whose completion callback was lost

    @property
    def idle(self) -> bool:
        return not (
            self.republished
            or self.taken_over
            or self.reenqueued
            or self.expired
            or self.jobs_reported
        )


def sweep(router: Sweepable, *, takeovers_only: bool = False) -> SweepReport:
    """One pass. ``takeovers_only``: only take over expired leases, which needs nothing but the
    database (a worker that is not consuming yet, its broker perhaps away, runs such passes:
    re-enqueueing agents it sees scheduled would re-send a whole backlog it is about to take)."""
    if takeovers_only:
        report = SweepReport(
            republished=0, taken_over=_take_over_expired(router), reenqueued=0, expired=0
        )
    else:
        report = _whole_pass(router)
    if not report.idle:
        logger.info("sweep", extra={"action": "sweep", **dataclasses.asdict(report)})
    return report


def _whole_pass(router: Sweepable) -> SweepReport:
    settings = router.settings
    # Rows younger than a sweep period are probably being published right now by their writer.
    republished = (
        router.publish_outbox(older_than_seconds=settings.sweep_seconds)
        if router.publisher is not None
        else 0
    )
    taken_over = _take_over_expired(router)
    reenqueued = 0
    if router.publisher is not None:
        # A turn task should start within a broker round trip; after a lease of waiting it is lost.
        reenqueued = router.store.stuck_scheduled(older_than_seconds=settings.lease_seconds)
    return SweepReport(
        republished=republished,
        taken_over=taken_over,
        reenqueued=reenqueued,
        expired=router.expire_questions(),
        jobs_reported=poll_jobs(router),
    )


def _take_over_expired(router: Sweepable) -> int:
    """Fence and recover every running turn whose lease expired; how many."""
    taken_over = 0
    for agent_id in router.store.reads.expired_leases():
        if router.store.take_over_expired(agent_id) is not None:
            taken_over += 1
    return taken_over


def poll_jobs(router: Sweepable) -> int:
    """The completion poller: report background jobs that finished but whose link callback
    never arrived (lost with a worker or a broker restart). Jobs younger than a sweep period
    are left to their callback."""
    outcomes = router.publisher
    if not isinstance(outcomes, JobOutcomes):
        return 0
    reported = 0
    for job in router.store.reads.running_jobs(older_than_seconds=router.settings.sweep_seconds):
        try:
            outcome = outcomes.job_outcome(job.task_id)
        except Exception:  # the result backend is down: try again next pass
            logger.warning("job outcome unavailable", extra={"action": "poll_jobs"})
            break
        if outcome is not None:
            ok, text = outcome
            router.finish_background(job.id, ok=ok, result=text)
            reported += 1
    return reported
