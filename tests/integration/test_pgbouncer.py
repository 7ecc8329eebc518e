"""PostgreSQL behind a real PgBouncer (Debian's, 1.18) in transaction pooling, with fewer server
connections than clients: what the ``database_prepare`` setting decides, what preparing does
there, many senders sharing two server connections, and a worker team's turns through it.

The routing table, the races of many senders and the asks run through PgBouncer too, in their
own modules (``with_pgbouncer``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import event

from agent_router import AgentState, Router, Settings, StoreError
from agent_router.ops.chaos_processes import PrivatePgBouncer
from agent_router.ops.checks import check_team
from agent_router.ops.demo import run_scenarios, setup_team
from agent_router.outbox import RecordingPublisher
from agent_router.store.engine import PREPARE_THRESHOLD, make_engine
from agent_router.worker.runtime import Runtime

from ..conftest import PG_ADMIN_URL, PGBOUNCER_POOL
from .helpers import assistant
from .test_celery_turns import TIMEOUT, assert_scenarios


def _prepared_after_repeats(engine: sa.Engine) -> int:
    """Run one statement past psycopg's threshold in one transaction (so on one server
    connection, also through a pooler) and count the statements that session prepared."""
    with engine.connect() as conn, conn.begin():
        for _ in range(PREPARE_THRESHOLD + 2):
            conn.execute(sa.text("SELECT count(*) FROM ar_teams"))
        return int(
            conn.execute(sa.text("SELECT count(*) FROM pg_prepared_statements")).scalar_one()
        )


@pytest.mark.parametrize(
    ("prepare", "through_pgbouncer", "prepares"),
    [
        ("auto", False, True),
        ("auto", True, False),
        ("off", False, False),
        ("on", False, True),
    ],
)
def test_the_setting_decides_what_the_server_prepares(
    pgbouncer: PrivatePgBouncer,
    own_pg_schema_url: str,
    prepare: str,
    through_pgbouncer: bool,
    prepares: bool,
) -> None:
    """``auto`` prepares on a connection to PostgreSQL itself and never through PgBouncer, which
    gives each client a process id of its own; ``off`` never does; ``on`` always does."""
    url = pgbouncer.url(own_pg_schema_url) if through_pgbouncer else own_pg_schema_url
    engine = make_engine(Settings(database_url=url, database_prepare=prepare))
    try:
        with engine.connect() as conn:
            threshold = conn.connection.dbapi_connection.prepare_threshold  # type: ignore[union-attr]
        assert threshold == (PREPARE_THRESHOLD if prepares else None)
        assert (_prepared_after_repeats(engine) > 0) is prepares
    finally:
        engine.dispose()


def _causes(exc: BaseException) -> Iterator[BaseException]:
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]


def test_preparing_on_behind_transaction_pooling_fails(pgbouncer_url: str) -> None:
    """What ``on`` does behind PgBouncer 1.18 in transaction pooling: each client's psycopg names
    its first prepared statement ``_pg3_0`` and prepares it on whichever server connection runs
    that transaction. One client more than the server pool prepares it at least twice on one
    server connection, and the server refuses the second: the send fails with a StoreError."""
    failures: list[StoreError] = []
    for _ in range(PGBOUNCER_POOL + 1):  # one client after another: each its own connection
        settings = Settings(database_url=pgbouncer_url, database_prepare="on")
        router = Router(settings, publisher=RecordingPublisher())
        try:
            team = router.create_team()
            router.create_agent(team.id, role="Engineer")
            for i in range(3 * PREPARE_THRESHOLD):
                router.send(team.id, to="Engineer_1", content=f"m{i}", sender="Team Leader")
        except StoreError as exc:
            failures.append(exc)
        finally:
            router.close()
    assert failures
    for failure in failures:
        drivers = [c for c in _causes(failure) if isinstance(c, psycopg.Error)]
        assert drivers, repr(failure)
        assert isinstance(
            drivers[0],
            psycopg.errors.DuplicatePreparedStatement | psycopg.errors.InvalidSqlStatementName,
        ), repr(drivers[0])
        assert "_pg3_" in str(failure)


@pytest.mark.parametrize("prepare", ["off", "auto"])
def test_many_senders_share_two_server_connections(
    pgbouncer_url: str, own_pg_schema_url: str, prepare: str
) -> None:
    """Eight threads send to four agents (each thread its own client connection) while a loop
    per agent claims, drains and ends its turns: everything is delivered once and in order,
    over at most PGBOUNCER_POOL server connections."""
    settings = Settings(database_url=pgbouncer_url, database_prepare=prepare)
    router = Router(settings, publisher=RecordingPublisher())
    opened: list[int] = []
    event.listen(router.store.engine, "connect", lambda *_: opened.append(1))
    senders, per_sender = 8, 15
    try:
        team = router.create_team()
        names = [router.create_agent(team.id, role="Engineer").display_name for _ in range(4)]
        done = threading.Event()
        errors: list[BaseException] = []

        def send(s: int) -> None:
            try:
                for k in range(per_sender):
                    router.send(
                        team.id, to=names[(s + k) % 4], content=f"{s}:{k}", sender=f"job:s{s}"
                    )
            except BaseException as exc:
                errors.append(exc)

        def work(name: str) -> None:
            try:
                while not (done.is_set() and router.agent(team.id, name).state is not (
                    AgentState.SCHEDULED
                )):  # fmt: skip
                    turn = router.claim_turn(team.id, name)
                    if turn is None:
                        time.sleep(0.01)
                        continue
                    turn.drain()
                    turn.append_assistant(assistant("ok"))
                    turn.end()
            except BaseException as exc:
                errors.append(exc)

        loops = [threading.Thread(target=work, args=(n,)) for n in names]
        threads = [threading.Thread(target=send, args=(s,)) for s in range(senders)]
        for t in [*loops, *threads]:
            t.start()
        for t in threads:
            t.join(120)
        done.set()
        for t in loops:
            t.join(120)
        assert not errors, errors
        report = check_team(router, team.id, quiescent=True)
        assert report.ok, report.violations
        assert report.delivered == senders * per_sender
        assert len(opened) > PGBOUNCER_POOL  # clients outnumbered the server connections
    finally:
        router.close()
    database = sa.make_url(own_pg_schema_url).database
    admin = sa.create_engine(PG_ADMIN_URL, poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as conn:
            servers = conn.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :db"),
                {"db": database},
            ).scalar_one()
    finally:
        admin.dispose()
    assert 0 < servers <= PGBOUNCER_POOL


@pytest.fixture
def celery_settings(
    pgbouncer_url: str, broker_url: str, redis_url: str, celery_settings: Settings
) -> Settings:
    """The Celery fixtures' settings on a database of the test's own, through PgBouncer, with
    preparing off as docs/deployment.md says for PgBouncer before 1.22."""
    return celery_settings.model_copy(
        update={"database_url": pgbouncer_url, "database_prepare": "off"}
    )


@pytest.fixture
def worker_env_extra() -> dict[str, str]:
    return {"AGENT_ROUTER_DATABASE_PREPARE": "off"}


def test_demo_scenarios_with_a_worker_through_pgbouncer(
    pgbouncer: PrivatePgBouncer, subprocess_worker: Runtime
) -> None:
    """An ``agent-router worker`` process (eight slots) and this process's router, both through
    PgBouncer's two server connections: the demo's scenarios hold as on PostgreSQL itself."""
    router = subprocess_worker.router
    assert sa.make_url(router.settings.database_url).port == pgbouncer.port
    result = run_scenarios(router, setup_team(router), timeout=TIMEOUT)
    assert_scenarios(router, result)
