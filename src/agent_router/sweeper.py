"""The sweeper: one pass that repairs whatever a crash, a lost signal or a dead worker left
behind. Beat runs it every ``Settings.sweep_seconds``; the embedded mode runs it on a timer.
Every step is idempotent, so two sweepers running at once only duplicate fenced signals."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent_router.router import Router

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    republished: int  # outbox rows published again (the first publish was lost)
    taken_over: int  # running turns whose lease expired, fenced and recovered
    reenqueued: int  # agents stuck in `scheduled` whose turn task vanished
    expired: int  # questions resolved `expired` past their deadline

    @property
    def idle(self) -> bool:
        return not (self.republished or self.taken_over or self.reenqueued or self.expired)


def sweep(router: Router) -> SweepReport:
    settings = router.settings
    # Rows younger than a sweep period are probably being published right now by their writer.
    republished = (
        router.publish_outbox(older_than_seconds=settings.sweep_seconds)
        if router.publisher is not None
        else 0
    )
    taken_over = 0
    for agent_id in router.store.expired_leases():
        epoch, effects = router.store.take_over_expired(agent_id)
        if epoch is not None:
            taken_over += 1
            router.publish_effects(effects)
    reenqueued = 0
    if router.publisher is not None:
        # A turn task should start within a broker round trip; after a lease of waiting it is lost.
        entries = router.store.stuck_scheduled(older_than_seconds=settings.lease_seconds)
        reenqueued = len(entries)
        if entries:
            router.publish_entries(entries)
    expired = router.expire_questions()
    report = SweepReport(
        republished=republished, taken_over=taken_over, reenqueued=reenqueued, expired=expired
    )
    if not report.idle:
        logger.info(
            "sweep",
            extra={
                "action": "sweep",
                "republished": republished,
                "taken_over": taken_over,
                "reenqueued": reenqueued,
                "expired": expired,
            },
        )
    return report
