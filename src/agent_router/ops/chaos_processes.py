"""The processes the chaos run starts, kills and restarts: a private Redis, a private PostgreSQL
server (or, without its binaries, a private database on a shared server), optionally a private
PgBouncer in front of it, and the ``agent-router worker`` processes."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg
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


class PrivatePostgres:
    """A private PostgreSQL server: ``initdb`` into the run's directory, its own port, trust
    authentication on 127.0.0.1, so that restarting it disturbs nobody else's databases. Run as
    root, the server runs as the ``postgres`` user (PostgreSQL refuses root)."""

    def __init__(self, workdir: Path, bindir: Path) -> None:
        self.port = _free_port()
        self.bindir = bindir
        self.data = workdir / "pg-data"
        self.sockets = workdir / "pg-sockets"
        self.log = workdir / "postgres.log"
        self.as_root = os.geteuid() == 0
        self.user = "postgres" if self.as_root else pwd.getpwuid(os.geteuid()).pw_name

    @staticmethod
    def find_bindir() -> Path | None:
        """Where ``initdb`` and ``pg_ctl`` are (Debian keeps them out of PATH), or None."""
        found = shutil.which("pg_ctl")
        if found and shutil.which("initdb"):
            return Path(found).parent
        versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=_version_key)
        return Path(versions[-1]).parent if versions else None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.as_root:
            command = ["runuser", "-u", self.user, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def init(self) -> None:
        for directory in (self.data, self.sockets):
            directory.mkdir()
        self.log.touch()
        if self.as_root:
            entry = pwd.getpwnam(self.user)
            self.data.parent.chmod(0o755)  # the server user walks into the run's directory
            for path in (self.data, self.sockets, self.log):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", self.user, "--auth=trust",
                  "--encoding=UTF8", "--locale=C", "--no-sync")  # fmt: skip

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.sockets}"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """``fast``: every client connection is cut, as in a planned restart."""
        with suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(p) for p in Path(path).parent.parent.name.split(".") if p.isdigit())


@contextmanager
def private_server(workdir: Path) -> Iterator[PrivatePostgres | None]:
    """A started :class:`PrivatePostgres`, stopped afterwards; None without the binaries."""
    bindir = PrivatePostgres.find_bindir()
    if bindir is None:
        yield None
        return
    server = PrivatePostgres(workdir, bindir)
    server.init()
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")


class PrivatePgBouncer:
    """A private PgBouncer (Debian's ``pgbouncer``) on its own port, in front of the PostgreSQL
    server of ``server_url``: transaction pooling with ``pool_size`` server connections per
    database and user, however many clients connect, so that a pool smaller than its clients is
    what they get. Every database of that server is reachable through it (:meth:`url`).

    Authentication is trust for the URL's user: PgBouncer lets it in without a password and logs
    in to the server as that user, which the server (on trust for 127.0.0.1, like this machine's
    and the private :class:`PrivatePostgres`) accepts. PgBouncer refuses to run as root: run as
    root, it is started as the ``postgres`` user (it reads its files before it switches). The
    URL's user is its admin too: :meth:`sample_waits` and :meth:`waits_line` read its console."""

    BINARY = "pgbouncer"

    def __init__(self, workdir: Path, server_url: str, *, pool_size: int = 2) -> None:
        self.port = _free_port()
        self.server = sa.make_url(server_url)
        self.pool_size = pool_size
        self.config = workdir / "pgbouncer.ini"
        self.users = workdir / "pgbouncer-users.txt"
        self.log = workdir / "pgbouncer.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.most_waiting = 0  # the most clients seen waiting at once for a server connection
        self.longest_wait = 0.0  # the longest wait seen, in seconds

    @classmethod
    def find_binary(cls) -> Path | None:
        """Where ``pgbouncer`` is (Debian installs it in /usr/sbin, outside a user's PATH)."""
        found = shutil.which(cls.BINARY) or shutil.which(cls.BINARY, path="/usr/sbin:/usr/bin")
        return Path(found) if found else None

    def url(self, database_url: str) -> str:
        """``database_url`` (a database of the same server) through this PgBouncer."""
        through = sa.make_url(database_url).set(host="127.0.0.1", port=self.port)
        return through.render_as_string(hide_password=False)

    def start(self) -> None:
        binary = self.find_binary()
        if binary is None:
            raise RuntimeError("pgbouncer is not installed (scripts/services.sh installs it)")
        user = self.server.username or pwd.getpwuid(os.geteuid()).pw_name
        self.users.write_text(f'"{user}" ""\n')
        self.config.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={self.server.host or '127.0.0.1'} port={self.server.port or 5432}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {self.users}",
                    f"admin_users = {user}",
                    "pool_mode = transaction",
                    f"default_pool_size = {self.pool_size}",
                    "max_client_conn = 500",
                    # After a failed login to the server (it is restarting), try again within a
                    # second rather than the default 15 s, which every client would wait out.
                    "server_login_retry = 1",
                    "",
                ]
            )
        )
        command = [str(binary), str(self.config)]
        if os.geteuid() == 0:
            command[1:1] = ["-u", "postgres"]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited with {self.proc.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")  # fmt: skip
            with suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("pgbouncer did not start listening")

    def _console(self, command: str) -> list[dict[str, Any]]:
        """``command`` (``SHOW POOLS``, ``SHOW STATS``) on PgBouncer's admin console."""
        user = self.server.username or pwd.getpwuid(os.geteuid()).pw_name
        with psycopg.connect(
            host="127.0.0.1", port=self.port, dbname="pgbouncer", user=user, autocommit=True
        ) as conn:
            cursor = conn.execute(command)  # no parameters: the simple protocol it speaks
            names = [column.name for column in cursor.description or ()]
            return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]

    def sample_waits(self, database: str) -> None:
        """Note how many clients of ``database`` wait for a server connection now, and how
        long the oldest has waited (a PgBouncer that cannot answer is skipped)."""
        with suppress(psycopg.Error):  # the console is a diagnosis, never a fault of the run
            for pool in self._console("SHOW POOLS"):
                if pool["database"] == database:
                    self.most_waiting = max(self.most_waiting, int(pool["cl_waiting"]))
                    wait = int(pool["maxwait"]) + int(pool["maxwait_us"]) / 1e6
                    self.longest_wait = max(self.longest_wait, wait)

    def waits_line(self, database: str) -> str:
        """``database``'s transactions through PgBouncer, their mean wait for a server
        connection, and the most waiting clients and longest wait :meth:`sample_waits` saw."""
        stats = next((r for r in self._console("SHOW STATS") if r["database"] == database), None)
        if stats is None:
            return f"PgBouncer: no transactions of {database}"
        transactions = int(stats["total_xact_count"])
        mean_ms = int(stats["total_wait_time"]) / 1000 / max(transactions, 1)
        return (
            f"PgBouncer ({self.pool_size} server connections): {transactions} transactions, "
            f"mean wait for a server connection {mean_ms:.2f} ms; at most {self.most_waiting} "
            f"clients waiting at once (sampled), the longest wait {self.longest_wait:.2f} s"
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: PgBouncer closes every connection and exits
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def private_pgbouncer(
    workdir: Path, server_url: str, *, pool_size: int = 2
) -> Iterator[PrivatePgBouncer]:
    """A started :class:`PrivatePgBouncer`, stopped afterwards."""
    bouncer = PrivatePgBouncer(workdir, server_url, pool_size=pool_size)
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


@contextmanager
def private_database(admin_url: str) -> Iterator[str]:
    """A new PostgreSQL database (its name), dropped afterwards whoever still holds it."""
    name = f"ar_chaos_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    # No pool: the server may have been restarted in between, cutting a pooled connection.
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


class Workers:
    """The run's ``agent-router worker`` processes, started, killed and restarted by number.

    :meth:`supervise` plays the deployment's supervisor (compose's ``restart: unless-stopped``,
    systemd's ``Restart=always``): a thread of its own starts again, within ``period``, every
    worker that exited on its own, whatever the run's main loop is busy with (a server restart
    blocks it for seconds)."""

    def __init__(self, env: dict[str, str], concurrency: int, logdir: Path) -> None:
        self.env = env
        self.concurrency = concurrency
        self.logdir = logdir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.exe = str(Path(sys.executable).parent / "agent-router")
        # Held while a worker's process is replaced, so that the supervisor never sees a worker
        # the run is killing as exited and starts a second one in its slot.
        self._lock = threading.Lock()
        self._exits: list[tuple[float, int, int]] = []  # (monotonic, worker, exit code)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, i: int) -> None:
        log = (self.logdir / f"worker{i}.log").open("ab")
        self.procs[i] = subprocess.Popen(
            [
                self.exe,
                "worker",
                # The harness is the supervisor: a SIGKILL must hit the Celery worker itself,
                # not a supervising parent whose child would live on.
                "--no-supervise",
                # A worker started again while Redis restarts waits for it, as a supervised one.
                "--wait-for-broker",
                f"--concurrency={self.concurrency}",
                "--loglevel=WARNING",
                f"--hostname=chaos{i}-{uuid.uuid4().hex[:4]}@localhost",
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill(self, i: int) -> None:
        """SIGKILL worker ``i`` and start it again."""
        with self._lock:
            self.procs[i].send_signal(signal.SIGKILL)
            self.procs[i].wait()
            self.start(i)

    def supervise(self, period: float = 0.1) -> None:
        """Start the supervisor thread (until :meth:`stop_all` or :meth:`kill_all`)."""
        self._thread = threading.Thread(
            target=self._supervise, args=(period,), name="chaos-supervisor", daemon=True
        )
        self._thread.start()

    def _supervise(self, period: float) -> None:
        while not self._stop.wait(period):
            with self._lock:
                for i, proc in list(self.procs.items()):
                    if proc.poll() is not None:
                        self._exits.append((time.monotonic(), i, proc.returncode))
                        self.start(i)

    def exits(self) -> list[tuple[float, int, int]]:
        """The exits the supervisor restarted since the last call: ``(monotonic, worker, exit
        code)``."""
        with self._lock:
            done, self._exits = self._exits, []
        return done

    def _unsupervise(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def kill_all(self) -> None:
        """SIGKILL whatever still runs (a run that ends early)."""
        self._unsupervise()
        for proc in self.procs.values():
            proc.kill()
            proc.wait()

    def stop_all(self, timeout: float = 60.0) -> None:
        self._unsupervise()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # warm shutdown: running turns finish first
        for proc in self.procs.values():
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
