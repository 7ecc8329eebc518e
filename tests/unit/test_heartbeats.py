"""The process's heartbeat thread: it renews each running turn's lease when due, and a turn whose
renewal was refused (fenced) is beaten no more while it winds down."""

from __future__ import annotations

import time

from agent_router.agents.loop import Heartbeat


class LeasedTurn:
    """What a heartbeat reads of a turn: its ids, when a transition last renewed its lease, and
    the renewal (refused from the ``fenced_after``-th on)."""

    def __init__(self, agent_id: int, fenced_after: int) -> None:
        self.agent_id, self.epoch, self.team_id, self.id = agent_id, 1, 1, agent_id
        self.display_name = f"Agent_{agent_id}"
        self.renewed_at = time.monotonic()
        self.renewals = 0
        self._fenced_after = fenced_after

    def heartbeat(self) -> bool:
        self.renewals += 1
        return self.renewals < self._fenced_after


class CountedHeartbeat(Heartbeat):
    """Counts how often the thread asks when its next beat is due."""

    asked = 0

    def due(self) -> float:
        self.asked += 1
        return super().due()


def test_a_fenced_turn_is_beaten_no_more_while_a_running_one_goes_on_being_renewed() -> None:
    fenced_turn, running_turn = LeasedTurn(1, fenced_after=2), LeasedTurn(2, fenced_after=10**6)
    fenced = CountedHeartbeat(fenced_turn, 0.02)  # type: ignore[arg-type]
    running = Heartbeat(running_turn, 0.02)  # type: ignore[arg-type]
    with running, fenced:
        assert fenced.fenced.wait(10)
        asked, renewals = fenced.asked, running_turn.renewals
        deadline = time.monotonic() + 10
        while running_turn.renewals < renewals + 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        # Five renewals of the running turn later, the fenced one was looked at no more (a
        # thread that kept beating it asked thousands of times in that while).
        assert running_turn.renewals >= renewals + 5
        assert fenced.asked - asked <= 2
    assert fenced_turn.renewals == 2 and not running.fenced.is_set()
