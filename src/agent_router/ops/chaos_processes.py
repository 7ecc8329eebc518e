"""The processes the chaos run starts, kills and restarts: a private Redis, a private PostgreSQL
database and the ``agent-router worker`` processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import sqlalchemy as sa


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """A private redis-server on its own port (no persistence: a restart loses everything), so
    that stopping it disturbs nobody else's Redis (the chaos run; the broker-down test)."""

    def __init__(self, workdir: Path) -> None:
        self.port = _free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with suppress(redis.RedisError):
                if redis.Redis(port=self.port).ping():
                    return
            time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@contextmanager
def private_database(admin_url: str) -> Iterator[str]:
    """A new PostgreSQL database (its name), dropped afterwards whoever still holds it."""
    name = f"ar_chaos_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


class Workers:
    """The run's ``agent-router worker`` processes, started, killed and restarted by number."""

    def __init__(self, env: dict[str, str], concurrency: int, logdir: Path) -> None:
        self.env = env
        self.concurrency = concurrency
        self.logdir = logdir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.exe = str(Path(sys.executable).parent / "agent-router")

    def start(self, i: int) -> None:
        log = (self.logdir / f"worker{i}.log").open("ab")
        self.procs[i] = subprocess.Popen(
            [
                self.exe,
                "worker",
                # The harness is the supervisor (restart_exited): a SIGKILL must hit the Celery
                # worker itself, not a supervising parent whose child would live on.
                "--no-supervise",
                f"--concurrency={self.concurrency}",
                "--loglevel=WARNING",
                f"--hostname=chaos{i}-{uuid.uuid4().hex[:4]}@localhost",
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()

    def restart_exited(self) -> list[tuple[int, int]]:
        """What a supervisor (compose's ``restart: unless-stopped``) does: start again every
        worker that exited on its own. Returns ``(worker, exit code)`` of each."""
        exited = [(i, p.returncode) for i, p in self.procs.items() if p.poll() is not None]
        for i, _code in exited:
            self.start(i)
        return exited

    def stop_all(self, timeout: float = 60.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # warm shutdown: running turns finish first
        for proc in self.procs.values():
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
