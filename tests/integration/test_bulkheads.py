"""Bulkheads: a repair the database refuses for one agent (a trigger plays a row it cannot
write) is recorded, counted and quarantined, and every sweeper pass still repairs every other
team; a turn whose end the database refuses is left, and taken over, like a crashed one. On
SQLite and PostgreSQL."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from agent_router import AgentState, LedgerAction, MessageType, Router, Settings
from agent_router.agents.loop import TurnOutcome, run_turn
from agent_router.agents.tools import default_registry
from agent_router.domain import SweepStep, TurnStatus, TurnTrigger
from agent_router.ops.checks import check_team
from agent_router.outbox import RecordingPublisher
from agent_router.store.quarantine import QUARANTINE_AFTER
from agent_router.worker.metrics import PrometheusHooks

from .helpers import assistant, start_running, tool_call

LEASE = 0.5  # a turn whose worker died is taken over this long after its last renewal
# The sweep period: the first failure leaves its agent alone this long. Longer than what a
# pass and the test's reads after it take on a loaded machine (with five test processes on
# two cores they took more than 2 s), so that the pass right after a failure comes within it.
PERIOD = 4.0


@pytest.fixture(params=["sqlite", "postgresql"])
def own_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of the test's own: its passes see only this test's teams."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'bulkheads.db'}"
    return str(request.getfixturevalue("own_pg_schema_url"))


@pytest.fixture
def router(own_database: str) -> Iterator[Router]:
    settings = Settings(
        database_url=own_database,
        lease_seconds=LEASE,
        heartbeat_seconds=0.1,
        sweep_seconds=PERIOD,
        work_seconds=0,
    )
    r = Router(settings, publisher=RecordingPublisher())
    r.create_schema()
    yield r
    r.close()


@contextmanager
def refused_update(router: Router, turn_id: int, *statuses: str) -> Iterator[None]:
    """The database refuses to move the turn ``turn_id`` to any of ``statuses`` (a row one
    agent's repair cannot write), until the block ends."""
    name = f"poison_{uuid.uuid4().hex[:8]}"
    listed = ", ".join(f"'{s}'" for s in statuses)
    engine = router.store.engine
    if engine.dialect.name == "sqlite":
        create = [
            f"CREATE TRIGGER {name} BEFORE UPDATE OF status ON ar_turns "
            f"WHEN OLD.id = {turn_id} AND NEW.status IN ({listed}) "
            "BEGIN SELECT RAISE(ABORT, 'poisoned row'); END"
        ]
        drop = [f"DROP TRIGGER {name}"]
    else:
        create = [
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'poisoned row'; END $$",
            f"CREATE TRIGGER {name} BEFORE UPDATE ON ar_turns FOR EACH ROW "
            f"WHEN (OLD.id = {turn_id} AND NEW.status::text IN ({listed})) "
            f"EXECUTE FUNCTION {name}()",
        ]
        drop = [f"DROP TRIGGER {name} ON ar_turns", f"DROP FUNCTION {name}()"]
    with engine.begin() as conn:
        for statement in create:
            conn.execute(sa.text(statement))
    try:
        yield
    finally:
        with engine.begin() as conn:
            for statement in drop:
                conn.execute(sa.text(statement))


def _events(router: Router, team_id: int, action: LedgerAction) -> list[str]:
    return [str(e.agent_name) for e in router.ledger(team_id) if e.action is action]


def _failures(hooks: PrometheusHooks, step: SweepStep) -> float:
    value = hooks.registry.get_sample_value(
        "agent_router_sweep_failures_total", {"step": step.value}
    )
    return value or 0.0


def test_one_poisoned_agent_stops_no_pass_and_is_quarantined(router: Router) -> None:
    hooks = PrometheusHooks(CollectorRegistry())
    # The poisoned team: a dead turn whose take-over the database refuses.
    poisoned = router.create_team()
    router.create_agent(poisoned.id, role="Engineer")
    stuck = start_running(router, poisoned.id, "Engineer_1")
    # The healthy team, with one of everything a pass repairs.
    healthy = router.create_team()
    for _ in range(4):
        router.create_agent(healthy.id, role="Engineer")
    start_running(router, healthy.id, "Engineer_1")  # its worker died
    asker = start_running(router, healthy.id, "Engineer_2")
    asker.append_assistant(assistant(None, tool_call("ask-1", "ask_master")))
    asker.ask("Team Leader", "which module?", tool_call_id="ask-1", timeout_seconds=0.2)
    router.send(healthy.id, to="Engineer_3", content="go")  # its task is lost: never claimed
    publisher, router.publisher = router.publisher, None
    router.send(healthy.id, to="Engineer_4", content="go")  # its publish is lost
    router.publisher = publisher
    time.sleep(PERIOD * 1.5)  # leases and unpublished rows both past due

    with refused_update(router, stuck.id, "fenced"):
        first = router.sweep()
        hooks.record_sweep(first)
        # Everything of the healthy team was repaired; the poisoned agent's take-over failed.
        assert _events(router, healthy.id, LedgerAction.TAKE_OVER) == ["Engineer_1", "Engineer_2"]
        assert "Engineer_3" in _events(router, healthy.id, LedgerAction.REENQUEUED)
        assert _events(router, healthy.id, LedgerAction.QUESTION_EXPIRED) == ["Engineer_2"]
        assert first.republished >= 1 and not router.store.reads.unpublished()
        [failure] = first.failures
        assert (failure.agent_id, failure.step) == (stuck.agent_id, SweepStep.TAKE_OVER)
        assert "poisoned row" in failure.error
        assert check_team(router, healthy.id).ok

        # Left alone for a sweep period, then tried again, with a doubling backoff.
        again = router.sweep()
        assert (again.failed, again.skipped) == (0, 1)
        for failures, backoff in ((2, 1), (3, 2)):
            time.sleep(PERIOD * backoff + 0.1)
            report = router.sweep()
            hooks.record_sweep(report)
            assert report.failed == 1, (failures, report)
        assert _events(router, poisoned.id, LedgerAction.SWEEP_FAILED) == ["Engineer_1"] * 3
        assert _events(router, poisoned.id, LedgerAction.QUARANTINED) == ["Engineer_1"]
        assert _failures(hooks, SweepStep.TAKE_OVER) == QUARANTINE_AFTER
        # check names it: quarantined, and its turn past the lease that nobody took over.
        checked = check_team(router, poisoned.id)
        assert (checked.quarantined, checked.stuck_turns) == (1, 1)
        assert any("Engineer_1: quarantined" in f and "take_over" in f for f in checked.failures)
        assert not any("CONTEXT" in f or "psycopg" in f for f in checked.failures)
        quiet = check_team(router, poisoned.id, quiescent=True)
        assert any(
            f"turn {stuck.id} (epoch {stuck.epoch}" in v and "still running" in v
            for v in quiet.violations
        ), quiet.violations
        assert not any("TurnRecord" in v for v in quiet.violations)
        # In the router's words: what the database said, never the driver's text (PL/pgSQL's
        # CONTEXT with the function's arguments, the exception's class).
        for event in router.ledger(poisoned.id):
            if event.action is LedgerAction.SWEEP_FAILED:
                assert "poisoned row" in event.detail["error"]
                assert "CONTEXT" not in event.detail["error"], event.detail
                assert "psycopg" not in event.detail["error"], event.detail
        assert check_team(router, healthy.id).ok

    # The row can be written again: once its backoff is over, the take-over goes through.
    time.sleep(PERIOD * 4 + 0.1)
    healed = router.sweep()
    assert (healed.taken_over, healed.failed) == (1, 0)
    assert _events(router, poisoned.id, LedgerAction.QUARANTINE_LIFTED) == ["Engineer_1"]
    assert router.store.reads.quarantined() == []
    agent = router.agent(poisoned.id, "Engineer_1")
    assert (agent.state, agent.pending_trigger) == (AgentState.SCHEDULED, TurnTrigger.RECOVERY)
    assert check_team(router, poisoned.id).ok


def test_an_epoch_at_its_columns_end_fails_its_take_over_on_both_databases(
    router: Router,
) -> None:
    """An epoch is a 32-bit column on both databases: a dead turn at epoch 2^31-1 cannot be
    fenced by a bump (PostgreSQL refuses the value, and so does SQLite's column type), so its
    take-over fails in the same words and the agent is quarantined, on either database."""
    team = router.create_team()
    engineer = router.create_agent(team.id, role="Engineer")
    with router.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE ar_agents SET epoch = :epoch WHERE id = :id"),
            {"epoch": 2**31 - 2, "id": engineer.id},
        )
    stuck = start_running(router, team.id, "Engineer_1")
    assert stuck.epoch == 2**31 - 1
    time.sleep(LEASE * 2)  # its worker died
    first = router.sweep()
    [failure] = first.failures
    assert (failure.agent_id, failure.step) == (engineer.id, SweepStep.TAKE_OVER)
    assert failure.error == "StoreError: database error: integer out of range (SQLSTATE 22003)"
    for backoff in (1, 2):
        time.sleep(PERIOD * backoff + 0.1)
        assert router.sweep().failed == 1
    assert _events(router, team.id, LedgerAction.QUARANTINED) == ["Engineer_1"]
    assert router.agent(team.id, "Engineer_1").epoch == 2**31 - 1


class Finishing:
    """A model that ends its turn at once."""

    def complete(self, messages: list[dict[str, object]], tools: object) -> dict[str, object]:
        return {"role": "assistant", "content": "Done."}


def test_a_turn_whose_end_cannot_be_written_is_taken_over_like_a_crashed_one(
    router: Router,
) -> None:
    team = router.create_team()
    router.send(team.id, to="Team Leader", content="go", type=MessageType.TASK)
    turn = router.claim_turn(team.id, "Team Leader")
    assert turn is not None
    with refused_update(router, turn.id, "ended", "failed"):
        outcome = run_turn(router, turn, models=lambda agent: Finishing(), tools=default_registry())
        assert outcome is TurnOutcome.INTERRUPTED
        lease = router.store.reads.turn_leases(team.id)[turn.id]
        time.sleep(LEASE * 2)
        # Nothing renews its lease once the loop returned: it runs out as a dead worker's.
        assert router.store.reads.turn_leases(team.id)[turn.id] == lease
        report = router.sweep()
    assert (report.taken_over, report.failed) == (1, 0)
    [record] = [t for t in router.store.reads.turns(turn.agent_id) if t.id == turn.id]
    assert record.status is TurnStatus.FENCED
    lead = router.agent(team.id, "Team Leader")
    assert (lead.state, lead.pending_trigger) == (AgentState.SCHEDULED, TurnTrigger.RECOVERY)
    recovery = router.claim(lead.id)
    assert recovery is not None
    assert run_turn(
        router, recovery, models=lambda agent: Finishing(), tools=default_registry()
    ) is (TurnOutcome.ENDED)
    assert check_team(router, team.id, quiescent=True).ok


def test_two_rows_the_broker_refuses_hold_back_no_other_team(
    own_database: str, redis_url: str, tmp_path: Path
) -> None:
    """Two outbox rows whose publish fails for themselves (their host runner's queue is a Redis
    key holding a string: WRONGTYPE) sit ahead of another team's three. The pass publishes the
    three, charges each bad row's agent with a failure (ledgered, left alone with backoff),
    and the bad agents end quarantined, which ``check`` names. A broker that is away charges
    no row."""
    import redis

    from agent_router.broker import CeleryPublisher, create_app
    from agent_router.ops.chaos_processes import PrivateRedis

    queue = f"agent_router.test.{uuid.uuid4().hex[:10]}"
    settings = Settings(
        database_url=own_database, broker_url=redis_url, queue=queue, sweep_seconds=0.2
    )
    router = Router(settings, publisher=None)  # every row stays unpublished
    router.create_schema()
    client = redis.Redis.from_url(redis_url)
    bad_teams = []
    try:
        for _ in range(2):
            bad_queue = f"agent_router.test.bad.{uuid.uuid4().hex[:10]}"
            client.set(bad_queue, "not a list")
            team = router.create_team(lead_runner=f"host.lead_turn@{bad_queue}")
            router.send(team.id, to="Team Leader", content="hello", type=MessageType.TASK)
            bad_teams.append(team.id)
        good = router.create_team()
        for role in ("Engineer", "Designer"):
            router.create_agent(good.id, role=role)
        for name in ("Team Leader", "Engineer_1", "Designer_1"):
            router.send(good.id, to=name, content="go", type=MessageType.TASK)
        router.publisher = CeleryPublisher(create_app(settings))
        time.sleep(settings.sweep_seconds * 1.5)  # the rows are past a sweep period

        first = router.sweep()
        assert (first.republished, first.failed) == (3, 2), first
        assert [e.agent_id for e in router.store.reads.unpublished()] == [
            router.team(t).lead.id for t in bad_teams
        ]
        for team_id in bad_teams:
            assert _events(router, team_id, LedgerAction.SWEEP_FAILED) == ["Team Leader"]

        # Each failure leaves its agent alone a while, then it is tried again, until quarantined.
        def held() -> list[int]:
            return [
                q.team_id
                for q in router.store.reads.quarantined()
                if q.failures >= QUARANTINE_AFTER
            ]

        deadline = time.monotonic() + 60
        while len(held()) < 2 and time.monotonic() < deadline:
            time.sleep(settings.sweep_seconds)
            router.sweep()
        assert sorted(held()) == bad_teams
        checked = check_team(router, bad_teams[0])
        assert checked.quarantined == 1
        assert any("quarantined" in f and "republish" in f for f in checked.failures)
    finally:
        client.close()
        router.close()

    # A broker that is away: the pass ends, and no row is charged with a failure.
    server = PrivateRedis(tmp_path)
    server.start()
    away = Router(settings.model_copy(update={"broker_url": server.url}), publisher=None)
    try:
        team = away.create_team()
        away.send(team.id, to="Team Leader", content="hello", type=MessageType.TASK)
        away.create_agent(team.id, role="Engineer")
        away.send(team.id, to="Engineer_1", content="hello", type=MessageType.TASK)
        away.publisher = CeleryPublisher(create_app(away.settings))
        server.stop()
        time.sleep(settings.sweep_seconds * 1.5)
        report = away.sweep()
        assert (report.republished, report.failed) == (0, 0), report
        assert _events(away, team.id, LedgerAction.SWEEP_FAILED) == []
    finally:
        away.close()
