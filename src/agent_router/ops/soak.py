"""``agent-router bench --soak MINUTES``: production-shaped load for minutes or hours, with what
grows printed as it grows.

The run starts a private Redis (broker and wake keys; unless ``redis_url`` is given), a private
database on the PostgreSQL server it is given, an OpenAI-compatible model server of its own
(:class:`ScriptedServer`: the built-in :class:`~agent_router.agents.llm.ScriptedModel` behind
real HTTP, each reply delayed 0.1-0.3 s) and ``workers`` ``agent-router worker`` processes whose
runtime (:func:`soak_runtime`) calls it through the OpenAI SDK. It creates ``teams`` teams of a
lead and three sub-agents and sends tasks to random sub-agents at a steady ``rate`` per second,
a share ``asks`` of them telling the sub-agent to ask its lead first.

Every ``period`` seconds (a minute by default) it prints one row: turns ended, worker CPU per
turn, the mean model request size, worker memory, Redis and PostgreSQL connections, storage
and rows per send, the backlog. At the end it prints each figure's slope per minute with its
standard error (a slope within about two standard errors of zero is no growth), stops sending,
waits for every team to rest and checks each one (nothing lost, duplicated or reordered,
``check`` clean). With ``tracemalloc_frames`` the workers take tracemalloc snapshots
(:func:`soak_runtime`) and the run prints what grew most in each.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from agent_router.agents.llm import DEFAULT_SCRIPT, ScriptedModel, directive
from agent_router.domain import RESTING_STATES, AgentState, MessageType
from agent_router.settings import Settings
from agent_router.store import make_engine

if TYPE_CHECKING:
    from celery import Celery

    from agent_router.router import Router
    from agent_router.worker.runtime import Runtime

SUB_AGENT_ROLES = ("Engineer", "Designer", "Writer")
MODEL_NAME = "soak-scripted"
#: The environment variable that makes a soak worker take tracemalloc snapshots: the number of
#: frames each allocation keeps, and where the snapshots go.
TRACEMALLOC_ENV = "AGENT_ROUTER_SOAK_TRACEMALLOC"
TRACEMALLOC_DIR_ENV = "AGENT_ROUTER_SOAK_TRACEMALLOC_DIR"


# ---------------------------------------------------------------------- the model server


class ScriptedServer:
    """An OpenAI-compatible Chat Completions server on 127.0.0.1: each request is answered by a
    :class:`ScriptedModel` of the agent its system prompt names (the lead's script for the
    Team Leader, the default sub-agent script for the others), after a delay drawn from
    ``delay``. It counts requests and their bytes."""

    def __init__(self, delay: tuple[float, float] = (0.1, 0.3)) -> None:
        self.delay = delay
        self.requests = 0
        self.request_bytes = 0
        self.largest_request = 0  # bytes
        self._lock = threading.Lock()
        self._models: dict[str, ScriptedModel] = {}
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> ScriptedServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def counts(self) -> tuple[int, int]:
        """Requests and their bytes so far."""
        with self._lock:
            return self.requests, self.request_bytes

    def reply(self, raw: bytes) -> dict[str, Any]:
        body = json.loads(raw)
        messages = body.get("messages") or []
        system = str(messages[0].get("content") or "") if messages else ""
        name, lead = _agent_named(system)
        with self._lock:
            self.requests += 1
            self.request_bytes += len(raw)
            self.largest_request = max(self.largest_request, len(raw))
            model = self._models.get(name)
            if model is None:
                script = None if lead else DEFAULT_SCRIPT
                model = self._models[name] = ScriptedModel(script=script, name=name)
        time.sleep(random.uniform(*self.delay))
        message = model.complete(messages, body.get("tools") or [])
        calls = message.get("tool_calls") or []
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL_NAME,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": len(raw) // 4,
                "completion_tokens": 20,
                "total_tokens": len(raw) // 4 + 20,
            },
        }


def _agent_named(system: str) -> tuple[str, bool]:
    """The agent a system prompt names (``You are NAME, ...``), and whether it is the lead."""
    for line in system.splitlines():
        if line.startswith("You are ") and ", " in line:
            name, _, who = line[len("You are ") :].partition(", ")
            return name, who.startswith("the Team Leader")
    return "agent", False


def _handler(server: ScriptedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                self._send(200, server.reply(raw))
            except Exception as exc:  # a reply the script cannot make: the client retries
                self._send(500, {"error": {"message": repr(exc), "type": "server_error"}})

        def do_GET(self) -> None:
            self._send(200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]})

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


# ---------------------------------------------------------------------- the workers' runtime


def soak_runtime(settings: Settings, app: Celery) -> Runtime:
    """``AGENT_ROUTER_RUNTIME_FACTORY`` of a soak worker: every agent runs with the
    OpenAI-compatible model of the ``openai_*`` settings (the run's :class:`ScriptedServer`)
    and the built-in tools (``do_work`` included, which the scripted sub-agents call). With
    :data:`TRACEMALLOC_ENV` set, a thread of the worker writes a tracemalloc snapshot to
    :data:`TRACEMALLOC_DIR_ENV` every 30 s."""
    from agent_router.agents.builder import for_router
    from agent_router.agents.roles import roles_from_env
    from agent_router.agents.toolbox import agent_tools
    from agent_router.worker.runtime import Runtime, worker_router

    frames = os.environ.get(TRACEMALLOC_ENV)
    if frames:
        _start_snapshots(int(frames), Path(os.environ[TRACEMALLOC_DIR_ENV]))
    router = worker_router(settings, app)
    return Runtime(
        router=router,
        models=for_router(router).models,
        tools=agent_tools(settings, roles_from_env()),  # the built-in tools, do_work included
        app=app,
    )


#: How often a soak worker takes a tracemalloc snapshot.
SNAPSHOT_SECONDS = 30.0


def _start_snapshots(frames: int, directory: Path, every: float = SNAPSHOT_SECONDS) -> None:
    import tracemalloc

    tracemalloc.start(frames)

    def snapshots() -> None:
        n = 0
        while True:
            time.sleep(every)
            tracemalloc.take_snapshot().dump(str(directory / f"{os.getpid()}-{n:04d}.snap"))
            n += 1

    threading.Thread(target=snapshots, name="soak-tracemalloc", daemon=True).start()


def tracemalloc_growth(directory: Path, top: int = 12) -> list[str]:
    """For each worker's snapshots: the allocation sites that grew most between its second
    snapshot (the worker warmed up) and its last (taken at rest, once every team rested), one
    line each, its frames from the oldest call to the allocation."""
    import tracemalloc

    lines: list[str] = []
    by_pid: dict[str, list[Path]] = {}
    for path in sorted(directory.glob("*.snap")):
        by_pid.setdefault(path.name.partition("-")[0], []).append(path)
    for pid, paths in sorted(by_pid.items()):
        if len(paths) < 3:
            continue
        first = tracemalloc.Snapshot.load(str(paths[1]))
        last = tracemalloc.Snapshot.load(str(paths[-1]))
        stats = last.compare_to(first, "traceback")
        lines.append(f"worker {pid}: {len(paths) - 2} snapshot intervals")
        for stat in stats[:top]:
            frames = " -> ".join(
                f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in stat.traceback
            )
            lines.append(
                f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  {frames}"
            )
    return lines


# ---------------------------------------------------------------------- the run


@dataclass(frozen=True, kw_only=True)
class SoakOptions:
    minutes: float
    database_url: str  # a PostgreSQL server: the run creates (and drops) a database of its own
    redis_url: str | None = None  # None: a private redis-server
    workers: int = 2
    concurrency: int = 8
    teams: int = 20
    rate: float = 2.0  # sends per second
    asks: float = 0.0  # percent of the tasks that ask the lead first
    period: float = 60.0  # seconds per row
    warmup: float = 0.0  # minutes whose rows the slopes leave out (the transcripts filling up)
    unbudgeted: bool = False  # teams without budgets (few teams reach the context target)
    settle_seconds: float = 300.0  # how long the end waits for every team to rest
    tracemalloc_frames: int = 0
    keep_database: bool = False


#: The figures of a row, in print order: (key, heading, format).
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("minute", "min", "{:5.1f}"),
    ("sends", "sends", "{:6d}"),
    ("turns", "turns", "{:6d}"),
    ("cpu_ms_per_turn", "cpu ms/turn", "{:11.1f}"),
    ("delivered", "delivered", "{:9d}"),
    ("cpu_ms_per_message", "cpu ms/msg", "{:10.2f}"),
    ("request_kib", "req KiB", "{:7.1f}"),
    ("worker_rss_mib", "RSS MiB", "{:7.1f}"),
    ("redis_connections", "redis conn", "{:10d}"),
    ("pg_connections", "pg conn", "{:7d}"),
    ("bytes_per_send", "bytes/send", "{:10.0f}"),
    ("rows_per_send", "rows/send", "{:9.2f}"),
    ("backlog", "backlog", "{:7d}"),
)
#: The figures whose slope the end reports.
SLOPED = (
    "cpu_ms_per_turn",
    "cpu_ms_per_message",
    "request_kib",
    "worker_rss_mib",
    "redis_connections",
    "pg_connections",
    "bytes_per_send",
    "rows_per_send",
    "backlog",
)


@dataclass
class SoakResult:
    rows: list[dict[str, float]] = field(default_factory=list)
    slopes: dict[str, tuple[float, float]] = field(default_factory=dict)  # per minute, SE
    sends: int = 0
    teams_checked: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    violations: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    settled: bool = False
    tracemalloc: list[str] = field(default_factory=list)
    #: The minute by whose row every agent that called the model had a request reach the
    #: context target (None: not every one did).
    target_reached_minute: float | None = None

    @property
    def ok(self) -> bool:
        return (
            self.settled
            and not (self.lost or self.duplicated or self.reordered)
            and not (self.violations or self.failures)
        )


def slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """The least-squares slope of ``ys`` over ``xs`` and its standard error (NaN with fewer
    than three points)."""
    n = len(xs)
    if n < 2:
        return math.nan, math.nan
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return math.nan, math.nan
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    if n < 3:
        return b, math.nan
    a = my - b * mx
    residual = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return b, math.sqrt(residual / (n - 2) / sxx)


def run(options: SoakOptions, out: Callable[[str], None] = print) -> SoakResult:
    """The soak: set up, send for ``options.minutes`` printing a row each period, then settle
    and check. Prints as it goes; returns what it printed."""
    from agent_router.ops.chaos_processes import PrivateRedis, private_database

    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ar-soak-")))
        redis_url = options.redis_url
        if redis_url is None:
            private = PrivateRedis(workdir)
            private.start()
            stack.callback(private.stop)
            redis_url = private.url
        admin = sa.engine.make_url(options.database_url)
        if options.keep_database:
            name = f"ar_soak_{os.getpid()}_{uuid.uuid4().hex[:6]}"
            engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
            with engine.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
            engine.dispose()
            out(f"database {name} (kept)")
        else:
            name = stack.enter_context(private_database(options.database_url))
        database_url = admin.set(database=name).render_as_string(hide_password=False)
        server = ScriptedServer().start()
        stack.callback(server.stop)
        soak = _Soak(
            options,
            database_url=database_url,
            redis_url=redis_url,
            server=server,
            workdir=workdir,
            out=out,
        )
        return soak.run(stack)
    raise AssertionError("unreachable")  # pragma: no cover


class _Soak:
    def __init__(
        self,
        options: SoakOptions,
        *,
        database_url: str,
        redis_url: str,
        server: ScriptedServer,
        workdir: Path,
        out: Callable[[str], None],
    ) -> None:
        self.options = options
        self.database_url = database_url
        self.redis_url = redis_url
        self.server = server
        self.workdir = workdir
        self.out = out
        self.queue = f"agent_router.soak.{uuid.uuid4().hex[:8]}"
        self.settings = Settings(
            database_url=database_url,
            broker_url=redis_url,
            redis_url=redis_url,
            queue=self.queue,
            worker_sweeper=False,  # the workers sweep
        )
        self.sends = 0
        self.sent_lock = threading.Lock()
        self.result = SoakResult()

    def _worker_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            AGENT_ROUTER_DATABASE_URL=self.database_url,
            AGENT_ROUTER_BROKER_URL=self.redis_url,
            AGENT_ROUTER_REDIS_URL=self.redis_url,
            AGENT_ROUTER_QUEUE=self.queue,
            AGENT_ROUTER_RUNTIME_FACTORY=f"{__name__}:soak_runtime",
            AGENT_ROUTER_OPENAI_BASE_URL=self.server.base_url,
            AGENT_ROUTER_OPENAI_MODEL=MODEL_NAME,
            AGENT_ROUTER_OPENAI_API_KEY="soak",
            AGENT_ROUTER_WORK_SECONDS="0",
            AGENT_ROUTER_WORKER_SWEEPER="true",
        )
        if self.options.tracemalloc_frames:
            (self.workdir / "tracemalloc").mkdir()
            env[TRACEMALLOC_ENV] = str(self.options.tracemalloc_frames)
            env[TRACEMALLOC_DIR_ENV] = str(self.workdir / "tracemalloc")
        return env

    def run(self, stack: contextlib.ExitStack) -> SoakResult:
        from agent_router.broker import CeleryPublisher, create_app
        from agent_router.ops.chaos_processes import Workers
        from agent_router.router import Router

        options = self.options
        app = create_app(self.settings, main=f"agent_router_soak_{uuid.uuid4().hex[:6]}")
        stack.callback(app.close)
        router = Router(self.settings, publisher=CeleryPublisher(app))
        stack.callback(router.close)
        router.create_schema()
        workers = Workers(self._worker_env(), options.concurrency, self.workdir)
        for i in range(options.workers):
            workers.start(i)
        stack.callback(workers.stop_all)
        self._wait_for_workers(app, workers)
        teams = [self._team(router) for _ in range(options.teams)]
        self.out(
            f"soak: {options.workers} workers x {options.concurrency} slots, {options.teams} "
            f"teams of 4{' without budgets' if options.unbudgeted else ''}, "
            f"{options.rate:g} sends/s, {options.asks:g}% asks, "
            f"{options.minutes:g} min, a row every {options.period:g} s"
        )
        self.out("  ".join(heading for _, heading, _ in COLUMNS))
        stop = threading.Event()
        sender = threading.Thread(target=self._send_loop, args=(router, teams, stop), daemon=True)
        probe = _Probe(self, router, workers)
        started = time.monotonic()
        sender.start()
        try:
            end = started + options.minutes * 60
            next_row = started + options.period
            while next_row <= end + 1e-6:
                time.sleep(max(0.0, next_row - time.monotonic()))
                row = probe.row((time.monotonic() - started) / 60)
                self.result.rows.append(row)
                self.out(_format_row(row))
                next_row += options.period
        finally:
            stop.set()
            sender.join()
        self.result.sends = self.sends
        self._slopes()
        self._settle_and_check(router, teams)
        self.at_rest(probe)
        if options.tracemalloc_frames:
            # The last snapshot of each worker is then one of a worker at rest: what it still
            # holds once its turns are over.
            time.sleep(SNAPSHOT_SECONDS + 5)
            workers.stop_all()
            self.result.tracemalloc = tracemalloc_growth(self.workdir / "tracemalloc")
            for line in self.result.tracemalloc:
                self.out(line)
        return self.result

    def _wait_for_workers(self, app: Celery, workers: Any, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            replies = app.control.ping(timeout=1.0)
            if len(replies or ()) >= self.options.workers:
                return
            for proc in workers.procs.values():
                if proc.poll() is not None:
                    logs = sorted(self.workdir.glob("worker*.log"))
                    tail = logs[0].read_text()[-2000:] if logs else ""
                    raise RuntimeError(f"a soak worker exited with {proc.returncode}:\n{tail}")
        raise RuntimeError(f"the soak workers did not answer a ping within {timeout:.0f} s")

    def _team(self, router: Router) -> tuple[int, list[str]]:
        from agent_router.budgeting import NO_LIMITS

        team = router.create_team(budget=NO_LIMITS if self.options.unbudgeted else None)
        names = [router.create_agent(team.id, role=r).display_name for r in SUB_AGENT_ROLES]
        return team.id, names

    def _send_loop(
        self, router: Router, teams: list[tuple[int, list[str]]], stop: threading.Event
    ) -> None:
        interval = 1.0 / self.options.rate
        due = time.monotonic()
        n = 0
        while not stop.is_set():
            team_id, names = random.choice(teams)
            name = random.choice(names)
            content = f"Soak task {n}: work on part {n % 97} of the project."
            if random.uniform(0, 100) < self.options.asks:
                question = f"{name}: which part first? ({n})"
                content += "\n" + directive("ask_master", question=question)
            router.send(team_id, to=name, content=content, sender="user", type=MessageType.TASK)
            n += 1
            with self.sent_lock:
                self.sends = n
            due += interval
            stop.wait(max(0.0, due - time.monotonic()))

    def _slopes(self) -> None:
        # Reached: every agent that called the model had a request reach it.
        reached = next(
            (
                r["minute"]
                for r in self.result.rows
                if r["at_target"] and r["at_target"] >= r["calling"]
            ),
            None,
        )
        self.result.target_reached_minute = reached
        target = self.settings.context_target_tokens
        last = self.result.rows[-1] if self.result.rows else {"at_target": 0, "calling": 0}
        agents = f"{int(last['at_target'])} of {int(last['calling'])} agents' requests"
        if reached is None:
            self.out(
                f"context target reached: no ({target} tokens: {agents}; the largest request "
                f"was {self.server.largest_request / 1024:.1f} KiB)"
            )
        else:
            first = next(r["minute"] for r in self.result.rows if r["at_target"])
            self.out(
                f"context target reached: yes ({target} tokens: {agents}, the first by minute "
                f"{first:.1f}, every one by minute {reached:.1f})"
            )
        # Past the warm-up and the target: the rows of requests that no longer grow.
        start = max(self.options.warmup, reached or 0.0)
        warm = [r for r in self.result.rows if r["minute"] > start]
        rows = warm if len(warm) >= 3 else self.result.rows
        xs = [r["minute"] for r in rows]
        since = f", from minute {rows[0]['minute']:.1f}" if rows and rows[0]["minute"] > 1 else ""
        self.out(f"slopes per minute (± standard error{since}):")
        for key in SLOPED:
            b, se = slope(xs, [r[key] for r in rows])
            self.result.slopes[key] = (b, se)
            self.out(f"  {key:<18} {b:+12.4f} ± {se:.4f}")

    def _settle_and_check(self, router: Router, teams: list[tuple[int, list[str]]]) -> None:
        from agent_router.ops.checks import check_team

        deadline = time.monotonic() + self.options.settle_seconds
        settled = False
        while time.monotonic() < deadline:
            if _resting(router):
                settled = True
                break
            time.sleep(0.5)
        self.result.settled = settled
        for team_id, _names in teams:
            report = check_team(router, team_id, quiescent=settled)
            self.result.teams_checked += 1
            self.result.lost += report.lost
            self.result.duplicated += report.duplicated
            self.result.reordered += report.reordered
            self.result.violations += [f"team {team_id}: {v}" for v in report.violations]
            self.result.failures += [f"team {team_id}: {f}" for f in report.failures]
        r = self.result
        self.out(
            f"checks: {r.sends} sends, {r.teams_checked} teams, "
            f"settled={'yes' if settled else 'no'}, "
            f"lost={r.lost} duplicated={r.duplicated} reordered={r.reordered} "
            f"violations={len(r.violations)} failures={len(r.failures)}: "
            f"{'OK' if r.ok else 'FAILED'}"
        )
        for line in (r.violations + r.failures)[:20]:
            self.out(f"  {line}")
        self.out(_agents_updates(router))

    def at_rest(self, probe: _Probe) -> None:
        """The workers' resident size once every team rests (their turns are over), and the
        storage per send of each table."""
        time.sleep(2.0)
        sizes = ", ".join(f"{rss / 2**20:.1f}" for rss in probe.rss())
        self.out(f"workers at rest: RSS MiB {sizes}")
        sends = max(self.result.sends, 1)
        self.out("per send, by table (rows, bytes with indexes and TOAST):")
        for table, rows, size in probe.tables():
            self.out(f"  {table:<18} {rows / sends:8.2f} {size / sends:10.0f}")


#: The soak's own engines on the databases it watches (one per URL, for its statistics reads).
_ENGINES: dict[str, sa.Engine] = {}


def _database(router: Router) -> sa.Engine:
    """The soak's own engine on the router's database: its probes read statistics and
    states there, beside the router's pool, never through it."""
    url = router.settings.database_url
    if url not in _ENGINES:
        _ENGINES[url] = make_engine(router.settings)
    return _ENGINES[url]


def _agents_updates(router: Router) -> str:
    """ar_agents' updates and the share written HOT, and its dead rows (the statistics
    collector's figures, flushed at each transaction's end)."""
    with _database(router).connect() as conn:
        upd, hot, dead = conn.execute(
            sa.text(
                "SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup FROM pg_stat_user_tables "
                "WHERE relname = 'ar_agents'"
            )
        ).one()
    share = 100 * hot / upd if upd else 0.0
    return f"ar_agents: {upd} updates, {hot} HOT ({share:.1f}%), {dead} dead rows"


def _resting(router: Router) -> bool:
    with _database(router).connect() as conn:
        busy = conn.execute(
            sa.text("SELECT count(*) FROM ar_agents WHERE NOT (state = ANY(:resting))"),
            {"resting": [s.value for s in (*RESTING_STATES, AgentState.TERMINATED)]},
        ).scalar_one()
    return bool(busy == 0)


def _format_row(row: dict[str, float]) -> str:
    cells = []
    for key, heading, fmt in COLUMNS:
        value = row[key]
        text = fmt.format(int(value) if "d}" in fmt else value)
        cells.append(text.rjust(len(heading)))
    return "  ".join(cells)


class _Probe:
    """Reads one row's figures: differences since the last row for the rates, levels for the
    rest."""

    def __init__(self, soak: _Soak, router: Router, workers: Any) -> None:
        import redis

        self.soak = soak
        self.router = router
        self.workers = workers
        self.redis = redis.Redis.from_url(soak.redis_url)
        self.last_turns = self._turns()
        self.last_cpu = self._cpu()
        self.last_requests = soak.server.counts()
        self.last_sends = 0
        self.last_delivered = 0

    def _turns(self) -> int:
        with _database(self.router).connect() as conn:
            return int(
                conn.execute(
                    sa.text("SELECT count(*) FROM ar_turns WHERE ended_at IS NOT NULL")
                ).scalar_one()
            )

    def _pids(self) -> list[int]:
        return [p.pid for p in self.workers.procs.values() if p.poll() is None]

    def _cpu(self) -> float:
        """CPU seconds the workers used (Linux ``/proc``; the thread pool is one process)."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in self._pids():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        return total

    def rss(self) -> list[int]:
        found = []
        for pid in self._pids():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        found.append(int(line.split()[1]) * 1024)
        return found

    def tables(self) -> list[tuple[str, int, int]]:
        """Each ar_* table's rows and bytes (pg_total_relation_size), largest first."""
        found = []
        with _database(self.router).connect() as conn:
            names = conn.execute(
                sa.text(
                    "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE 'ar\\_%'"
                )
            ).scalars()
            for table in list(names):
                rows = conn.execute(sa.text(f'SELECT count(*) FROM "{table}"')).scalar_one()
                size = conn.execute(
                    sa.text("SELECT pg_total_relation_size(:t)"), {"t": table}
                ).scalar_one()
                found.append((str(table), int(rows), int(size)))
        return sorted(found, key=lambda t: -t[2])

    def row(self, minute: float) -> dict[str, float]:
        turns, cpu, requests = self._turns(), self._cpu(), self.soak.server.counts()
        with self.soak.sent_lock:
            sends = self.soak.sends
        ended = turns - self.last_turns
        asked = requests[0] - self.last_requests[0]
        rss = self.rss()
        with _database(self.router).connect() as conn:
            tables = (
                conn.execute(
                    sa.text(
                        "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE 'ar\\_%'"
                    )
                )
                .scalars()
                .all()
            )
            size = sum(
                conn.execute(sa.text("SELECT pg_total_relation_size(:t)"), {"t": t}).scalar_one()
                for t in tables
            )
            stored = sum(
                conn.execute(sa.text(f'SELECT count(*) FROM "{t}"')).scalar_one() for t in tables
            )
            pg_connections = conn.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
            ).scalar_one()
            scheduled = conn.execute(
                sa.text("SELECT count(*) FROM ar_agents WHERE state = 'scheduled'")
            ).scalar_one()
            delivered = int(
                conn.execute(
                    sa.text("SELECT count(*) FROM ar_messages WHERE status = 'delivered'")
                ).scalar_one()
            )
            # A model call whose request window moved (it left entries out to stay near the
            # context target) ledgers what it left out: its agent's requests reached the target.
            at_target, calling = conn.execute(
                sa.text(
                    "SELECT count(DISTINCT agent_id) FILTER (WHERE detail ? 'context'), "
                    "count(DISTINCT agent_id) FROM ar_ledger WHERE action = 'model_call'"
                )
            ).one()
        spent = cpu - self.last_cpu
        moved = delivered - self.last_delivered
        row = {
            "minute": minute,
            "sends": sends - self.last_sends,
            "turns": ended,
            "cpu_ms_per_turn": spent * 1000 / ended if ended else 0.0,
            # Under a backlog a turn takes in more messages: the work per message is the rate.
            "delivered": moved,
            "cpu_ms_per_message": spent * 1000 / moved if moved else 0.0,
            "request_kib": (requests[1] - self.last_requests[1]) / asked / 1024 if asked else 0.0,
            "worker_rss_mib": statistics.fmean(rss) / 2**20 if rss else 0.0,
            "redis_connections": int(self.redis.info("clients")["connected_clients"]) - 1,
            "pg_connections": int(pg_connections) - 1,  # not this probe's
            "bytes_per_send": size / sends if sends else 0.0,
            "rows_per_send": stored / sends if sends else 0.0,
            "backlog": int(scheduled) + int(self.redis.llen(self.soak.queue)),
            "at_target": int(at_target),  # agents whose requests reached the context target
            "calling": int(calling),  # agents that called the model
        }
        self.last_turns, self.last_cpu, self.last_requests = turns, cpu, requests
        self.last_sends, self.last_delivered = sends, delivered
        return row
