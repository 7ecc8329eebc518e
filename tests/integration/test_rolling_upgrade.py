"""A rolling deploy on PostgreSQL: the previous release's workers and senders keep running turns
with model calls while this release's upgrade runs and its workers start; then the old ones
stop and ``agent-router db upgrade --finish`` drops their functions. No turn fails, no old
worker logs an error, and every message accepted is delivered once, in order.

The previous release is the commit :data:`PREVIOUS` of this repository's history, the last
one before store functions had versioned names (its upgrade installed ``ar_send``, ...). It is
installed without dependencies: its ``src/agent_router`` taken from ``git archive`` into a
directory of the test's own, which its processes get as ``PYTHONPATH`` ahead of this release's
package; they run on this interpreter and its dependencies. A CI clone has the history
(``CI=true``: a missing commit fails the test); elsewhere a clone without it skips the test.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from celery import Celery

from agent_router import Router, Settings
from agent_router.agents.llm import SCRIPTED_MODEL
from agent_router.agents.roles import ROLES_FILE_ENV
from agent_router.broker import create_app
from agent_router.domain import MessageStatus, TurnStatus
from agent_router.ops.checks import check_team
from agent_router.ops.demo import is_quiescent
from agent_router.store import functions

from .conftest import _wait_for_worker

pytestmark = pytest.mark.alone

ROOT = Path(__file__).resolve().parents[2]
#: The previous release: main before store functions had versioned names.
PREVIOUS = "997dd8f56f5775bd2186f965445ac41b750d78d6"
SENDER = str(ROOT / "tests" / "support" / "rolling_sender.py")
CLI = str(Path(sys.executable).parent / "agent-router")
TEAMS = 3
#: Seconds any one phase may take (a worker's start, a team settling) before the test fails.
PHASE_SECONDS = 60.0
#: A turn task a worker finished, as Celery logs it.
SUCCEEDED = re.compile(r"Task agent_router\.[a-z_.]+\[[0-9a-f-]+\] succeeded")


@pytest.fixture
def previous_release(tmp_path: Path) -> Path:
    """The previous release's package, in a directory of its own (for ``PYTHONPATH``)."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS, "src/agent_router"],
        capture_output=True,
        check=False,
    )
    if found.returncode != 0:
        why = f"commit {PREVIOUS} is not in {ROOT}'s git history: {found.stderr.decode()}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    target = tmp_path / "previous"
    with tarfile.open(fileobj=io.BytesIO(found.stdout)) as archive:
        archive.extractall(target, filter="data")
    return target / "src"


class Processes:
    """The deploy's processes, each writing to a log file of its own; stopped at the end."""

    def __init__(self, directory: Path, settings: Settings) -> None:
        self.directory = directory
        self.running: list[subprocess.Popen[bytes]] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
        self.env.update(
            AGENT_ROUTER_DATABASE_URL=settings.database_url,
            AGENT_ROUTER_BROKER_URL=settings.broker_url,
            AGENT_ROUTER_REDIS_URL=settings.redis_url or "",
            AGENT_ROUTER_QUEUE=settings.queue,
            AGENT_ROUTER_OPENAI_MODEL=SCRIPTED_MODEL,
            AGENT_ROUTER_ROLES_FILE=os.environ[ROLES_FILE_ENV],
            AGENT_ROUTER_WORK_SECONDS="0.1",
            AGENT_ROUTER_SCRIPTED_WRITE_SECONDS="0.2",
            AGENT_ROUTER_WORKER_SWEEPER="false",
        )

    def start(self, name: str, args: list[str], package: Path | None) -> subprocess.Popen[bytes]:
        """``args`` run by this interpreter; ``package``: the release first on the path."""
        env = dict(self.env)
        if package is not None:
            env["PYTHONPATH"] = str(package)
        with (self.directory / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen([sys.executable, *args], env=env, stdout=log, stderr=log)
        self.running.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.directory / f"{name}.log").read_text(errors="replace")

    def stop(self, proc: subprocess.Popen[bytes]) -> int:
        """A warm shutdown (running turns finish first)."""
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=PHASE_SECONDS)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def stop_all(self) -> None:
        for proc in self.running:
            if proc.poll() is None:
                self.stop(proc)


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PHASE_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def _run(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def settings(fresh_pg_url: str, redis_url: str) -> Settings:
    return Settings(
        database_url=fresh_pg_url,
        broker_url=redis_url,
        redis_url=redis_url,
        queue=f"agent_router.test.{uuid.uuid4().hex[:10]}",
    )


@pytest.fixture
def app(settings: Settings) -> Iterator[Celery]:
    app = create_app(settings, main=f"agent_router_rolling_{uuid.uuid4().hex[:6]}")
    yield app
    app.close()


@pytest.fixture
def processes(tmp_path: Path, settings: Settings) -> Iterator[Processes]:
    procs = Processes(tmp_path, settings)
    yield procs
    procs.stop_all()


def _succeeded(text: str) -> int:
    return len(SUCCEEDED.findall(text))


def test_the_previous_releases_workers_run_through_the_upgrade(
    previous_release: Path, settings: Settings, app: Celery, processes: Processes, tmp_path: Path
) -> None:
    old_cli = ["-m", "agent_router.ops.cli"]
    old_env = {**processes.env, "PYTHONPATH": str(previous_release)}
    # The previous release's database: its migrations and its (unversioned) functions.
    _run([sys.executable, *old_cli, "db", "upgrade"], old_env)
    teams = [int(t) for t in _run([sys.executable, SENDER, "create", str(TEAMS)], old_env).split()]
    ids = [str(t) for t in teams]

    def worker(name: str, package: Path | None) -> subprocess.Popen[bytes]:
        hostname = f"{name}-{uuid.uuid4().hex[:6]}@localhost"
        args = [*old_cli, "worker", "--concurrency=4", "--loglevel=INFO", f"--hostname={hostname}"]
        proc = processes.start(name, args, package)
        _wait_for_worker(app, hostname, proc, tmp_path / f"{name}.log")
        return proc

    old_worker = worker("old-worker", previous_release)
    old_stop, new_stop = tmp_path / "old-stop", tmp_path / "new-stop"
    old_sender = processes.start(
        "old-sender", [SENDER, "send", "old", str(old_stop), *ids], previous_release
    )
    _until(lambda: _succeeded(processes.log("old-worker")) >= 2 * TEAMS, "the old worker's turns")

    # This release's upgrade, while the old worker runs turns and the old sender sends: it
    # adds this release's functions and leaves the old release's as they were.
    old_functions = _functions(settings.database_url)
    upgraded_at = len(processes.log("old-worker"))
    _run([CLI, "db", "upgrade"], processes.env)
    assert old_functions.items() <= _functions(settings.database_url).items()
    new_worker = worker("new-worker", None)
    new_sender = processes.start("new-sender", [SENDER, "send", "new", str(new_stop), *ids], None)
    _until(
        lambda: (
            _succeeded(processes.log("old-worker")[upgraded_at:]) >= TEAMS
            and _succeeded(processes.log("new-worker")) >= TEAMS
        ),
        "turns on both releases' workers after the upgrade",
    )

    # The old release leaves: its sender, then its worker (running turns finish first).
    old_stop.touch()
    assert old_sender.wait(timeout=PHASE_SECONDS) == 0, processes.log("old-sender")
    assert processes.stop(old_worker) == 0, processes.log("old-worker")
    _run([CLI, "db", "upgrade", "--finish"], processes.env)
    finished_at = _succeeded(processes.log("new-worker"))
    _until(
        lambda: _succeeded(processes.log("new-worker")) >= finished_at + TEAMS,
        "the new worker's turns after --finish",
    )
    new_stop.touch()
    assert new_sender.wait(timeout=PHASE_SECONDS) == 0, processes.log("new-sender")

    router = Router(Settings(database_url=settings.database_url), publisher=None)
    try:
        _until(lambda: all(is_quiescent(router, t) for t in teams), "every team to settle")
        processes.stop(new_worker)
        accepted = {
            int(m)
            for name in ("old-sender", "new-sender")
            for m in processes.log(name).split()[1::2]
        }
        delivered = set()
        for team in teams:
            report = check_team(router, team, quiescent=True)
            assert report.ok and report.failed_turns == 0, (report.summary(), report.violations)
            delivered |= {
                m.id for m in router.messages(team) if m.status is MessageStatus.DELIVERED
            }
            for agent in router.agents(team):
                turns = router.reads.turns(agent.id)
                assert {t.status for t in turns} == {TurnStatus.ENDED}, agent.display_name
        assert accepted <= delivered
        # Both senders' messages, and sub-agents both releases' leads created.
        contents = {m.content.split()[0] for t in teams for m in router.messages(t)}
        assert {"old", "new"} <= contents
    finally:
        router.close()
    old_log = processes.log("old-worker") + processes.log("old-sender")
    assert not re.search(r"ERROR|CRITICAL|Traceback|StoreError", old_log), old_log
    assert set(_functions(settings.database_url)) == {
        functions.installed_name(name) for name in functions.names()
    }


def _functions(url: str) -> dict[str, int]:
    """Our functions in the database, by name: their oids (a function dropped and made
    again has another)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT proname, oid FROM pg_proc WHERE proname LIKE 'ar\\_%'")
            )
            return {name: int(oid) for name, oid in rows}
    finally:
        engine.dispose()
