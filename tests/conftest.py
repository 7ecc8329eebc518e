"""Fixtures shared by every tier. Real services only: a PostgreSQL or Redis that cannot be reached
fails the test (``./dev test`` brings them up first); nothing is skipped for a missing service."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from agent_router import Router, Settings
from agent_router.agents.roles import DEMO_ROLES, ROLES_FILE_ENV
from agent_router.ops.chaos_processes import PrivatePgBouncer, private_pgbouncer
from agent_router.outbox import RecordingPublisher

PG_ADMIN_URL = os.environ.get(
    "AGENT_ROUTER_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("AGENT_ROUTER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("AGENT_ROUTER_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
BACKENDS = ("sqlite", "postgresql")

# The suite's teams are the demo's software team (UI Operator, Full-Stack Engineer): every
# registry built without a catalogue, and every process the tests start that keeps the
# environment, staffs from the demo's roles (AGENT_ROUTER_ROLES_FILE=demo). Tests of the shipped
# default catalogue name it (``RoleCatalogue.default()``) or clear the variable; the chat hosts'
# tests drop every AGENT_ROUTER_* variable and get the default.
os.environ.setdefault(ROLES_FILE_ENV, DEMO_ROLES)
#: Both databases, and PostgreSQL through a PgBouncer in transaction pooling (fewer server
#: connections than the test's threads): a test, or a module's ``pytestmark``, that must hold
#: behind a pooler too.
with_pgbouncer = pytest.mark.parametrize("database_url", (*BACKENDS, "pgbouncer"), indirect=True)
#: Server connections of the tests' PgBouncer per database: fewer than the threads and
#: processes of any test that uses it, so that clients queue for server connections.
PGBOUNCER_POOL = 2


class _Drops:
    """This test process's dropped databases, dropped by a thread of its own: DROP DATABASE waits
    for a checkpoint (seconds on a busy disk), which the test done with the database need not
    wait for. The session's end waits for every drop and fails on any that failed."""

    def __init__(self) -> None:
        self._names: queue.Queue[str | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.failures: list[str] = []

    def drop(self, name: str) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="drop-databases", daemon=True)
            self._thread.start()
        self._names.put(name)

    def _run(self) -> None:
        admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        try:
            while (name := self._names.get()) is not None:
                try:
                    with admin.connect() as conn:
                        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                except sa.exc.SQLAlchemyError as exc:
                    self.failures.append(f"{name}: {exc}")
        finally:
            admin.dispose()

    def wait(self) -> None:
        if self._thread is not None:
            self._names.put(None)
            self._thread.join()
            self._thread = None


_DROPS = _Drops()


@pytest.fixture(scope="session", autouse=True)
def _database_drops() -> Iterator[None]:
    """Waits, at the session's end (after the session's own databases), for every drop."""
    yield
    _DROPS.wait()
    if _DROPS.failures:
        pytest.fail("databases not dropped:\n" + "\n".join(_DROPS.failures))


@contextlib.contextmanager
def _new_database(prefix: str, *, template: str | None = None) -> Iterator[str]:
    """A new PostgreSQL database, empty or a copy of ``template`` (a database nobody is
    connected to), dropped afterwards (whoever still holds connections) by :data:`_DROPS`."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    copy = f' TEMPLATE "{template}"' if template else ""
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"{copy}'))
    except sa.exc.OperationalError as exc:
        pytest.fail(f"PostgreSQL is required at {PG_ADMIN_URL} (run ./dev test): {exc}")
    finally:
        admin.dispose()
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        _DROPS.drop(name)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, dropped afterwards."""
    with _new_database("ar_test") as url:
        yield url


@pytest.fixture
def fresh_pg_url() -> Iterator[str]:
    """An empty PostgreSQL database of the test's own (no schema), dropped afterwards."""
    with _new_database("ar_fresh") as url:
        yield url


@pytest.fixture(scope="session")
def pg_schema_url(pg_url: str) -> str:
    """The session database with the schema created once; tests isolate by team."""
    Router(Settings(database_url=pg_url)).create_schema()
    return pg_url


@pytest.fixture(scope="session")
def pg_schema_template() -> Iterator[str]:
    """The name of a database with the schema that nothing connects to once it is made: what
    :func:`own_pg_schema_url` copies (a copy takes a fraction of creating the tables and the
    store's functions)."""
    with _new_database("ar_template") as url:
        router = Router(Settings(database_url=url))
        router.create_schema()
        router.close()
        yield url.rsplit("/", 1)[1]


@pytest.fixture
def own_pg_schema_url(pg_schema_template: str) -> Iterator[str]:
    """A database of the test's own, with the schema: for a test that sweeps or publishes the
    outbox. Both take over, re-enqueue or republish whatever is stale in their whole database;
    in the session database that is what every earlier test left behind, which would then be
    counted by, or run on (and hold the threads of), this test's worker."""
    with _new_database("ar_fresh", template=pg_schema_template) as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'router.db'}"


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'router.db'}"
        Router(Settings(database_url=url)).create_schema()
        return url
    if request.param == "pgbouncer":
        return str(request.getfixturevalue("pgbouncer_url"))
    return str(request.getfixturevalue("pg_schema_url"))


@pytest.fixture
def pgbouncer(tmp_path: Path) -> Iterator[PrivatePgBouncer]:
    """A PgBouncer of the test's own (Debian's package, which ``scripts/services.sh`` installs)
    in front of the test PostgreSQL server, on a free port: transaction pooling, PGBOUNCER_POOL
    server connections per database; stopped afterwards. Missing, the test fails (never skips)."""
    if PrivatePgBouncer.find_binary() is None:
        pytest.fail("pgbouncer is required (Debian package pgbouncer; run scripts/services.sh)")
    with private_pgbouncer(tmp_path, PG_ADMIN_URL, pool_size=PGBOUNCER_POOL) as bouncer:
        yield bouncer


@pytest.fixture
def pgbouncer_url(pgbouncer: PrivatePgBouncer, own_pg_schema_url: str) -> str:
    """A database of the test's own, with the schema, reached through :func:`pgbouncer`."""
    return pgbouncer.url(own_pg_schema_url)


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url)


@pytest.fixture
def publisher() -> RecordingPublisher:
    return RecordingPublisher()


@pytest.fixture
def router(settings: Settings, publisher: RecordingPublisher) -> Iterator[Router]:
    r = Router(settings, publisher=publisher)
    yield r
    r.close()


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis is required at {REDIS_URL} (run ./dev test): {exc}")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """RabbitMQ, for the tests that show it works as the broker too."""
    from kombu import Connection

    with Connection(AMQP_URL, connect_timeout=5) as conn:
        try:
            conn.ensure_connection(max_retries=3, interval_start=1, interval_step=1)
        except Exception as exc:  # kombu raises the transport's own errors
            pytest.fail(f"RabbitMQ is required at {AMQP_URL} (run ./dev test): {exc!r}")
    return AMQP_URL
