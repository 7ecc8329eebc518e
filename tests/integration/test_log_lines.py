"""What a host's worker log shows of the router: a host's formatter prints a record's message
alone, so the router's records carry their team, agent and turn in the message itself; and a
sweeper pass that repaired nothing is DEBUG, not INFO."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from agent_router import LedgerAction, Router, Settings
from agent_router.ops import logs
from agent_router.outbox import RecordingPublisher

from .helpers import start_running

#: A host's own log format: the message and nothing of the record's extra fields.
HOST_FORMAT = logging.Formatter("[%(levelname)s/%(name)s] %(message)s")


def _lines(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [HOST_FORMAT.format(r) for r in caplog.records if r.name == name]


def test_a_turns_lines_name_its_team_agent_and_turn(
    router: Router, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_router")
    team = router.create_team()
    turn = start_running(router, team.id, "Team Leader")
    lines = _lines(caplog, "agent_router.store")
    said = {line.split()[1]: line for line in lines}
    for action in (LedgerAction.ROUTE, LedgerAction.TURN_CLAIMED, LedgerAction.DRAIN):
        line = said[action.value]
        assert f"team_id={team.id} " in line, line
        assert 'agent="Team Leader"' in line, line
        assert f"agent_id={turn.agent_id} " in line, line
    for action in (LedgerAction.TURN_CLAIMED, LedgerAction.DRAIN):
        assert f"turn_id={turn.id}" in said[action.value]
    # Rendered once, however many handlers the record passes (ops.logs' own filter included).
    handler = logging.Handler()
    logs.apply(handler, "text")
    record = next(r for r in caplog.records if r.getMessage().startswith("drain "))
    before = record.getMessage()
    handler.filter(record)
    assert record.getMessage() == before and before.count("team_id=") == 1


def test_json_lines_keep_the_message_and_the_fields_apart(
    router: Router, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_router")
    team = router.create_team()
    start_running(router, team.id, "Team Leader")
    record = next(r for r in caplog.records if r.getMessage().startswith("turn_claimed "))
    entry = logs.JsonFormatter().format(record)
    assert '"message": "turn_claimed"' in entry and f'"team_id": {team.id}' in entry


@pytest.fixture
def fast_router(sqlite_url: str) -> Iterator[Router]:
    # A database of the test's own: the sweeper is global, another test's team would be seen.
    settings = Settings(
        database_url=sqlite_url, lease_seconds=0.3, heartbeat_seconds=0.1, sweep_seconds=0.1
    )
    router = Router(settings, publisher=RecordingPublisher())
    router.create_schema()
    yield router
    router.close()


def test_a_sweep_that_repaired_nothing_is_debug_and_a_repair_is_info(
    fast_router: Router, caplog: pytest.LogCaptureFixture
) -> None:
    router = fast_router
    caplog.set_level(logging.DEBUG, logger="agent_router.sweeper")
    team = router.create_team()
    router.sweep()
    router.sweep()
    passes = [r for r in caplog.records if r.name == "agent_router.sweeper"]
    assert [r.levelno for r in passes] == [logging.DEBUG, logging.DEBUG]
    caplog.clear()
    router.create_agent(team.id, role="Engineer")
    start_running(router, team.id, "Engineer_1")  # its worker dies: no heartbeat
    time.sleep(0.3 * 1.5)
    assert router.sweep().taken_over == 1
    (taken,) = [r for r in caplog.records if r.name == "agent_router.sweeper"]
    assert taken.levelno == logging.INFO
    assert "taken_over=1" in taken.getMessage()
