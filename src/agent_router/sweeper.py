"""The sweeper: one pass that repairs whatever a crash, a lost signal or a dead worker left
behind. Beat runs it every ``Settings.sweep_seconds``; the embedded mode runs it on a timer.
Every step is idempotent, so two sweepers running at once only duplicate fenced signals.

Every repair is made for one agent at a time, in a transaction of its own, behind a bulkhead
(:class:`Bulkhead`): a repair that fails for one agent (its rows refused by the database, a bug
its data runs into) is ledgered (``sweep_failed``), counted in the pass's report (a metric in a
worker), the agent is left alone for a while (quarantined when it keeps failing: ``check``
names it), and the pass goes on for every other agent. Only the database being out of reach
ends a pass: then no repair could be made or recorded.

A turn task found lost is enqueued again, but not one still queued behind a backlog: the
broker's depth of the agent's queue tells them apart (:func:`still_queued`), so a deep backlog
is never multiplied by copies the fence would refuse.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from agent_router import errors
from agent_router.domain import SweepStep
from agent_router.logfields import get_logger
from agent_router.outbox import QueueDepth
from agent_router.store.models import utcnow
from agent_router.store.recovery import (
    BACKLOG_WINDOWS,
    backoff_windows,
    behind_a_backlog,
    still_queued,
)
from agent_router.store.values import Scheduled

if TYPE_CHECKING:
    from agent_router.domain import BackgroundJob, OutboxEntry
    from agent_router.outbox import Publisher
    from agent_router.settings import Settings
    from agent_router.store import Store

logger = get_logger(__name__)

T = TypeVar("T")


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

    def republish(self, entry: OutboxEntry) -> None: ...

    def finish_background(self, job_id: int, *, ok: bool, result: str) -> BackgroundJob: ...


@dataclass(frozen=True, kw_only=True)
class SweepFailure:
    """A repair that failed for one agent (the pass went on for the others)."""

    agent_id: int
    step: SweepStep
    error: str


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    republished: int  # outbox rows published again (the first publish was lost)
    taken_over: int  # running turns whose lease expired, fenced and recovered
    reenqueued: int  # agents stuck in `scheduled` whose turn task vanished
    expired: int  # questions resolved `expired` past their deadline
    reminded: int = 0  # questions to the user sent once more at half their time
    jobs_reported: int = 0  # background jobs whose completion callback was lost
    ledger_pruned: int = 0  # routine ledger events past ledger_retention_days, deleted
    failed: int = 0  # repairs that failed for an agent (each ledgered `sweep_failed`)
    skipped: int = 0  # agents left alone: a repair failed for them in an earlier pass
    failures: tuple[SweepFailure, ...] = ()

    @property
    def idle(self) -> bool:
        return not (
            self.republished
            or self.taken_over
            or self.reenqueued
            or self.expired
            or self.reminded
            or self.jobs_reported
            or self.failed
        )

    def counts(self) -> dict[str, int]:
        """Every count of the report, by field (``failures`` left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "failures"}


class Bulkhead:
    """Each agent's repairs in a unit of their own. An agent a repair failed for before is
    left alone until its backoff is over (:mod:`agent_router.store.quarantine`); a repair
    that fails now is recorded and its agent left alone for the rest of the pass; one that
    succeeds for an agent with failures behind it lifts them."""

    def __init__(self, router: Sweepable) -> None:
        self.router = router
        now = utcnow()
        held = router.store.reads.quarantined()
        self.held = {q.agent_id for q in held}
        self.resting = {q.agent_id for q in held if q.until > now}
        self.failures: list[SweepFailure] = []
        self.skipped: set[int] = set()
        self.tried: set[int] = set()

    def run(self, agent_id: int, step: SweepStep, repair: Callable[[], T]) -> T | None:
        """``repair()`` for the agent, or ``None`` when it is left alone or failed."""
        if agent_id in self.resting:
            self.skipped.add(agent_id)
            return None
        self.tried.add(agent_id)
        try:
            done = repair()
        except errors.StoreError as exc:
            if exc.transient:
                raise  # the database is away: nothing could be repaired nor recorded
            self._failed(agent_id, step, exc)
            return None
        except Exception as exc:
            self._failed(agent_id, step, exc)
            return None
        if agent_id in self.held:
            self.held.discard(agent_id)
            self.router.store.lift_quarantine(agent_id, reason=f"{step.value} succeeded")
        return done

    def _failed(self, agent_id: int, step: SweepStep, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        logger.warning(
            "sweep repair failed: %s",
            error,
            exc_info=exc,
            extra={"action": "sweep_failed", "agent_id": agent_id, "step": step.value},
        )
        self.failures.append(SweepFailure(agent_id=agent_id, step=step, error=error))
        self.resting.add(agent_id)  # no other repair of it in this pass
        try:
            self.router.store.record_sweep_failure(
                agent_id, step, error, period_seconds=self.router.settings.sweep_seconds
            )
        except errors.StoreError as store_exc:
            if store_exc.transient:
                raise
            logger.exception("sweep failure not recorded", extra={"action": "sweep_failed"})

    def close(self) -> None:
        """Lift the failures of agents no repair needs any more."""
        if self.held:
            self.router.store.lift_settled_quarantines(keep=self.tried | self.skipped)

    def report(self, report: SweepReport) -> SweepReport:
        return dataclasses.replace(
            report,
            failed=len(self.failures),
            skipped=len(self.skipped),
            failures=tuple(self.failures),
        )


def sweep(router: Sweepable, *, takeovers_only: bool = False) -> SweepReport:
    """One pass. ``takeovers_only``: only take over expired leases, which needs nothing but the
    database (a worker that is not consuming yet, its broker perhaps away, runs such passes:
    re-enqueueing agents it sees scheduled would re-send a whole backlog it is about to take)."""
    bulkhead = Bulkhead(router)
    if takeovers_only:
        report = SweepReport(
            republished=0,
            taken_over=_take_over_expired(router, bulkhead),
            reenqueued=0,
            expired=0,
        )
    else:
        report = _whole_pass(router, bulkhead)
    bulkhead.close()
    report = bulkhead.report(report)
    # A pass that repaired nothing (it may have pruned the ledger or left quarantined agents
    # alone, as every pass does) is routine: DEBUG, so that a worker's INFO lines are turns.
    level = logging.DEBUG if report.idle else logging.INFO
    logger.log(level, "sweep", extra={"action": "sweep", **report.counts()})
    return report


def _whole_pass(router: Sweepable, bulkhead: Bulkhead) -> SweepReport:
    return SweepReport(
        republished=_republish(router, bulkhead),
        taken_over=_take_over_expired(router, bulkhead),
        reenqueued=_reenqueue(router, bulkhead),
        reminded=router.store.remind_user(),
        expired=_expire(router, bulkhead),
        jobs_reported=poll_jobs(router, bulkhead),
        ledger_pruned=_prune_ledger(router),
    )


def _prune_ledger(router: Sweepable) -> int:
    """One batch of the ledger's retention by age, when ``ledger_retention_days`` is set: a
    pass deletes at most :data:`~agent_router.store.lifecycle.LEDGER_PRUNE_BATCH` rows, more
    than a busy deployment writes in a sweep period, so the ledger of live teams stays within
    its retention without a job of its own."""
    days = router.settings.ledger_retention_days
    if days is None:
        return 0
    return router.store.prune_ledger(older_than_seconds=days * 86400, batches=1)


#: Publishes that fail in a row, with none taken by the broker in the pass, after which the
#: sweeper asks the broker whether it is there at all.
BROKER_AWAY_AFTER = 2


def _republish(router: Sweepable, bulkhead: Bulkhead) -> int:
    """Publish again the outbox rows a lost publish left (those younger than a sweep period
    are probably being published by their writer right now). A publish that fails is its
    row's failure, recorded in its agent's bulkhead (left alone with backoff, quarantined when
    it keeps failing, which ``check`` reports), and the pass goes on to the other rows: a row
    that can never be published holds back no other. Only a broker that is away ends the
    step: after :data:`BROKER_AWAY_AFTER` failures in a row with none published, a broker that
    cannot be asked for its queue's depth is taken to be away (those rows are not charged with
    a failure; every row waits for the next pass, each would wait out the publisher's
    retries), and one that answers leaves the failures to the rows."""
    if router.publisher is None:
        return 0
    entries = router.store.claim_unpublished(older_than_seconds=router.settings.sweep_seconds)
    published = 0
    failing: list[tuple[OutboxEntry, Exception]] = []
    broker_answers = False
    for entry in entries:
        if entry.agent_id in bulkhead.resting:
            bulkhead.skipped.add(entry.agent_id)
            continue
        try:
            router.republish(entry)
        except Exception as exc:
            failing.append((entry, exc))
            if published or broker_answers or len(failing) < BROKER_AWAY_AFTER:
                continue
            if not _broker_answers(router):
                logger.warning(
                    "outbox publish failed: %s; the broker is away, the rows wait for the next "
                    "pass",
                    exc,
                    extra={"action": "publish"},
                )
                return published
            broker_answers = True
            continue
        published += 1
        bulkhead.run(entry.agent_id, SweepStep.REPUBLISH, _nothing)  # lifts failures before
    if failing and not published and not broker_answers and not _broker_answers(router):
        # Every publish of the pass failed, and the broker cannot be asked: it is away.
        logger.warning("outbox publish failed: %s", failing[-1][1], extra={"action": "publish"})
        return published
    for entry, error in failing:
        _fail_publish(bulkhead, entry, error)
    return published


def _broker_answers(router: Sweepable) -> bool:
    """Can the broker be reached? Asked of a publisher that can tell a queue's depth; one that
    cannot is taken to be reachable (its failures are then its rows')."""
    publisher = router.publisher
    if not isinstance(publisher, QueueDepth):
        return True
    return publisher.queue_depth(router.settings.queue) is not None


def _nothing() -> None:
    """The repair already made (a publish): run in the bulkhead to lift earlier failures."""


def _fail_publish(bulkhead: Bulkhead, entry: OutboxEntry, exc: Exception) -> None:
    def fail() -> None:
        raise exc

    bulkhead.run(entry.agent_id, SweepStep.REPUBLISH, fail)


def _take_over_expired(router: Sweepable, bulkhead: Bulkhead) -> int:
    """Fence and recover every running turn whose lease expired; how many."""
    taken_over = 0
    for agent_id in router.store.reads.expired_leases():
        epoch = bulkhead.run(agent_id, SweepStep.TAKE_OVER, _taker(router, agent_id))
        if epoch is not None:
            taken_over += 1
    return taken_over


def _reenqueue(router: Sweepable, bulkhead: Bulkhead) -> int:
    """Enqueue again the turns of agents left ``scheduled`` whose task was lost: published
    longer ago than their delivery window (a lease, doubling with each re-enqueue of the
    epoch), and no longer in their queue (:func:`still_queued`, by the broker's depth of it;
    where that is not known, not while turns started since are all of agents scheduled
    before it, for at most :data:`BACKLOG_WINDOWS`)."""
    if router.publisher is None:
        return 0
    window = router.settings.lease_seconds
    now = utcnow()
    due = [
        agent
        for agent in router.store.reads.scheduled(older_than_seconds=window)
        if not agent.unpublished  # the outbox re-publisher's
        and (
            agent.last_published is None
            or agent.last_published < now - timedelta(seconds=window * backoff_windows(agent))
        )
    ]
    if not due:
        return 0
    # The broker first, then the database: a task taken between the two reads leaves the
    # database's list of what is queued, never the depth (see still_queued).
    as_of = utcnow()
    depths = _depths(router.publisher, {_queue(router.settings, a.runner) for a in due})
    queued = _by_queue(router.settings, router.store.reads.queued_publishes())
    running: list[tuple[datetime, datetime]] | None = None
    patience = now - timedelta(seconds=window * BACKLOG_WINDOWS)
    reenqueued = 0
    for agent in due:
        queue = _queue(router.settings, agent.runner)
        depth = depths.get(queue) if queue is not None else None
        last = agent.last_published
        if last is not None and depth is not None:
            if still_queued(agent, queued.get(queue, []), depth, as_of=as_of):
                continue
        elif last is not None and last >= patience:
            running = router.store.reads.running_turns() if running is None else running
            if behind_a_backlog(running, last):
                continue
        if bulkhead.run(agent.agent_id, SweepStep.REENQUEUE, _reenqueuer(router, agent)):
            reenqueued += 1
    return reenqueued


def _taker(router: Sweepable, agent_id: int) -> Callable[[], int | None]:
    return lambda: router.store.take_over_expired(agent_id)


def _reenqueuer(router: Sweepable, agent: Scheduled) -> Callable[[], bool]:
    return lambda: router.store.reenqueue(agent, windows=backoff_windows(agent))


def _queue(settings: Settings, runner: str | None) -> str | None:
    """The queue an agent's turn tasks go to: the library's (``Settings.queue``), the one a
    host's runner names (``name@queue``), or ``None`` (a host task routed by the host)."""
    if runner is None:
        return settings.queue
    _task, _at, queue = runner.partition("@")
    return queue or None


def _by_queue(
    settings: Settings, by_runner: Mapping[str | None, list[datetime]]
) -> dict[str | None, list[datetime]]:
    merged: dict[str | None, list[datetime]] = {}
    for runner, times in by_runner.items():
        merged.setdefault(_queue(settings, runner), []).extend(times)
    for times in merged.values():
        times.sort()
    return merged


def _depths(publisher: Publisher | None, queues: set[str | None]) -> dict[str, int | None]:
    """The broker's depth of each queue, where the publisher can tell it."""
    if not isinstance(publisher, QueueDepth):
        return {}
    return {q: publisher.queue_depth(q) for q in queues if q is not None}


def _expire(router: Sweepable, bulkhead: Bulkhead) -> int:
    """Close every open question past its deadline with an ``expired`` result; how many."""
    expired = 0
    for question_id, asker in router.store.reads.overdue_questions():
        closed = bulkhead.run(asker, SweepStep.EXPIRE, _expirer(router, question_id))
        expired += closed or 0
    return expired


def _expirer(router: Sweepable, question_id: int) -> Callable[[], int]:
    return lambda: router.store.expire_questions(question_id=question_id)


def poll_jobs(router: Sweepable, bulkhead: Bulkhead | None = None) -> int:
    """The completion poller: report background jobs that finished but whose link callback
    never arrived (lost with a worker or a broker restart). Jobs younger than a sweep period
    are left to their callback."""
    outcomes = router.publisher
    if not isinstance(outcomes, JobOutcomes):
        return 0
    bulkhead = bulkhead or Bulkhead(router)
    reported = 0
    for job in router.store.reads.running_jobs(older_than_seconds=router.settings.sweep_seconds):
        try:
            outcome = outcomes.job_outcome(job.task_id)
        except Exception:  # the result backend is down: try again next pass
            logger.warning("job outcome unavailable", extra={"action": "poll_jobs"})
            break
        if outcome is None:
            continue
        ok, text = outcome
        done = bulkhead.run(job.agent_id, SweepStep.POLL_JOB, _reporter(router, job.id, ok, text))
        if done is not None:
            reported += 1
    return reported


def _reporter(router: Sweepable, job_id: int, ok: bool, text: str) -> Callable[[], object]:
    return lambda: router.finish_background(job_id, ok=ok, result=text)
