"""The lease settings: a heartbeat shorter than the lease, and defaults under which a worker
killed mid-turn has its turn taken over within lease + sweep period."""

from __future__ import annotations

import pydantic
import pytest

from agent_router import Settings


def test_a_heartbeat_not_shorter_than_the_lease_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"heartbeat_seconds .* lease_seconds"):
        Settings(lease_seconds=3.0, heartbeat_seconds=3.0)
    assert Settings(lease_seconds=3.0, heartbeat_seconds=1.0).heartbeat_seconds == 1.0


def test_the_defaults_take_a_dead_turn_over_within_fifteen_seconds() -> None:
    defaults = Settings()
    assert defaults.heartbeat_seconds < defaults.lease_seconds
    assert defaults.lease_seconds + defaults.sweep_seconds <= 15.0
