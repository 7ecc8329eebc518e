"""The chaos run: a scripted team talks under fire, then the database is checked.

Six scripted agents (the lead and ``Chaos_1``..``Chaos_5``) send each other messages and asks
(``turn.ask`` + ``turn.wait_for``; answers through ``router.send``) while the harness SIGKILLs a
random worker every few seconds (and restarts it), restarts Redis once while asks are
blocked, terminates the workers' PostgreSQL backends once, and restarts the PostgreSQL server
once while asks are blocked. Then it lets the team settle, stops the workers with a warm
shutdown, and checks guarantees 2-5 and 7 from the database (:func:`agent_router.ops.checks`),
and that no turn failed.

The agents run on :func:`agent_router.ops.chaos_agent.run_chaos_turn`, a host-style loop over
the turn API that a recovered turn resumes where the dead one stopped.

Everything runs on a private Redis (another port) and a private PostgreSQL server (initdb into
the run's directory, another port), so other users of the machine's services are not disturbed.
Without PostgreSQL's server binaries the run uses a private database on the shared server and
skips the server restart (``ChaosResult.pg_restarted`` says which).

With ``pgbouncer_pool``, the workers (and their beat) reach the database through a private
PgBouncer in transaction pooling with that many server connections, fewer than the workers'
slots, and with preparing off (``database_prepare``), as a deployment behind PgBouncer before
1.22 runs; the harness itself reads and writes PostgreSQL directly. The faults strike behind
it: the workers' server connections are terminated, and the server restarts under PgBouncer,
whose client connections stay open.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from agent_router import errors
from agent_router.agents.llm import SCRIPTED_MODEL
from agent_router.broker import CeleryPublisher, create_app
from agent_router.budgeting import NO_LIMITS
from agent_router.domain import (
    RESTING_STATES,
    LedgerAction,
    MessageType,
    QuestionStatus,
    TurnStatus,
    TurnTrigger,
)
from agent_router.ops.chaos_agent import ROLE, SUB_AGENTS, TASK_PREFIX
from agent_router.ops.chaos_agent import now as utc_now
from agent_router.ops.chaos_processes import (
    PrivatePgBouncer,
    PrivatePostgres,
    PrivateRedis,
    Workers,
    private_database,
    private_pgbouncer,
    private_server,
)
from agent_router.ops.checks import TeamReport, check_team
from agent_router.router import Router
from agent_router.settings import Settings
from agent_router.store import make_engine
from agent_router.store.engine import kill_connections

logger = logging.getLogger(__name__)

WORKER_APP_NAME = "ar-chaos-worker"
#: How much later than the harness noted a kill the dead worker's last heartbeat may commit.
KILL_SLACK = 0.25
#: On top of lease + sweep period, before a kill must have been taken over: the sweep pass's own
#: run time (a few queries, up to about half a second on two shared, busy cores), and the timer
#: thread's wake-up in a worker busy with turns.
TAKEOVER_SLACK = 1.0


@dataclass(frozen=True, kw_only=True)
class Profile:
    sends_per_agent: int
    asks_per_agent: int
    duration: float  # most seconds of chaos before it stops killing and lets the team settle
    kill_every: tuple[float, float] = (3.0, 6.0)
    lease_seconds: float = 3.0
    heartbeat_seconds: float = 1.0
    sweep_seconds: float = 1.0
    ask_block_seconds: float = 2.0
    concurrency: int = 4
    settle_seconds: float = 120.0
    seed: int = 6

    @property
    def takeover_bound(self) -> float:
        """Most seconds from a kill to the sweeper's takeover of the dead turn: its lease runs
        out, then the next pass of any worker's sweeper timer takes it over."""
        return self.lease_seconds + self.sweep_seconds + TAKEOVER_SLACK


#: CI: at least 1,000 messages and 100 asks (questions opened) in about two minutes on two
#: shared cores; the run ends once every agent has sent its share.
CI_PROFILE = Profile(sends_per_agent=130, asks_per_agent=25, duration=160.0, settle_seconds=45.0)
#: ``agent-router chaos --duration 600``: enough to keep the team talking for ten minutes of kills
#: (the run ends at ``duration`` or once every agent has sent its share, whichever comes first).
LONG_PROFILE = Profile(sends_per_agent=900, asks_per_agent=150, duration=600.0)


@dataclass(frozen=True, kw_only=True)
class Recovery:
    """One turn lost to a SIGKILL and recovered, split where the time goes: the lease running
    out, the sweeper noticing (both bounded by the router: lease + sweep period), then the
    recovery turn waiting for a free worker slot (queueing, bounded by the deployment)."""

    agent: str
    killed_at: datetime
    lease_expired_at: datetime  # the dead turn's lease as its last heartbeat left it
    taken_over_at: datetime  # the sweeper's TAKE_OVER ledger event
    running_at: datetime  # the recovery turn's start

    @property
    def to_takeover(self) -> float:
        return (self.taken_over_at - self.killed_at) / timedelta(seconds=1)

    @property
    def to_running(self) -> float:
        return (self.running_at - self.taken_over_at) / timedelta(seconds=1)

    @property
    def total(self) -> float:
        return (self.running_at - self.killed_at) / timedelta(seconds=1)

    def line(self) -> str:
        lease = (self.lease_expired_at - self.killed_at) / timedelta(seconds=1)
        sweep = (self.taken_over_at - self.lease_expired_at) / timedelta(seconds=1)
        return (
            f"recovered {self.agent} killed at {self.killed_at:%H:%M:%S.%f}: "
            f"kill->lease expiry {lease:.2f}s, expiry->takeover "
            f"{sweep:.2f}s, takeover->running {self.to_running:.2f}s, total {self.total:.2f}s"
        )


def _median_max(name: str, values: list[float]) -> str:
    return f"{name} median={statistics.median(values):.2f}s max={max(values):.2f}s"


@dataclass(kw_only=True)
class ChaosResult:
    report: TeamReport
    questions: int = 0
    open_questions: int = 0
    recovered_turns: int = 0
    kills: int = 0
    recoveries: list[Recovery] = field(default_factory=list)
    takeover_bound: float = 0.0  # Profile.takeover_bound of the run
    events: list[str] = field(default_factory=list)
    #: Each server fault done ("redis restart", "postgres backends", "postgres restart") and
    #: the questions open (asks blocked) when it struck.
    faults: dict[str, int] = field(default_factory=dict)

    @property
    def pg_restarted(self) -> bool:
        return "postgres restart" in self.faults

    @property
    def ok(self) -> bool:
        return self.report.ok and not self.open_questions

    def summary(self) -> str:
        r = self.report
        return (
            f"messages={r.messages} delivered={r.delivered} lost={r.lost} "
            f"duplicated={r.duplicated} reordered={r.reordered} "
            f"overlapping_turns={r.overlapping_turns} dangling_tool_calls={r.dangling_tool_calls} "
            f"recovered_turns={self.recovered_turns}"
        )

    @property
    def late_takeovers(self) -> list[Recovery]:
        """Recoveries whose kill -> takeover exceeded the bound (the router's part)."""
        return [r for r in self.recoveries if r.to_takeover > self.takeover_bound]

    def recovery_line(self) -> str:
        """Kill -> takeover (the router's part, bounded by lease + sweep period) and takeover
        -> running (waiting for a worker slot) separately, then the total."""
        done = self.recoveries
        if not done:
            return f"recovery: kills={self.kills} no turn was recovered from a kill"
        return " ".join(
            [
                f"recovery: kills={self.kills} recovered={len(done)}",
                _median_max("kill->takeover", [r.to_takeover for r in done]),
                f"(bound={self.takeover_bound:.2f}s late={len(self.late_takeovers)})",
                _median_max("takeover->running", [r.to_running for r in done]),
                _median_max("total", [r.total for r in done]),
            ]
        )


def run_chaos(
    profile: Profile,
    *,
    admin_url: str = "postgresql+psycopg://root@127.0.0.1:5432/test",
    pgbouncer_pool: int | None = None,
    log: Any = print,
) -> ChaosResult:
    """Run the chaos scenario on a private Redis and PostgreSQL database (the workers through a
    private PgBouncer with ``pgbouncer_pool`` server connections, if given); returns the
    checks."""
    rng = random.Random(profile.seed)
    with tempfile.TemporaryDirectory(prefix="agent-router-chaos-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        pg_server = stack.enter_context(private_server(workdir))
        if pg_server is None:
            log("no PostgreSQL server binaries: a private database, no server restart")
        else:
            admin_url = pg_server.url
        dbname = stack.enter_context(private_database(admin_url))
        redis_server = PrivateRedis(workdir)
        redis_server.start()
        base = admin_url.rsplit("/", 1)[0] + "/" + dbname
        common = _shared_settings(profile, redis_server.url)
        settings = Settings(database_url=base, **common)
        router = Router(settings, publisher=CeleryPublisher(create_app(settings)))
        beat: subprocess.Popen[bytes] | None = None
        workers: Workers | None = None
        bouncer: PrivatePgBouncer | None = None
        try:
            router.create_schema()
            env = _worker_env(common, base)
            if pgbouncer_pool is not None:
                bouncer = stack.enter_context(
                    private_pgbouncer(workdir, admin_url, pool_size=pgbouncer_pool)
                )
                log(f"workers through PgBouncer: transaction pooling, {pgbouncer_pool} server "
                    f"connections for {3 * profile.concurrency} worker slots")  # fmt: skip
                env = _worker_env(common, bouncer.url(base), prepare="off")
            workers = Workers(env, profile.concurrency, workdir)
            for i in range(3):
                workers.start(i)
            workers.supervise()
            beat = _start_beat(env, workdir)
            team_id, quotas = _start_team(router, profile)
            servers = (redis_server, pg_server)
            result = _chaos_loop(
                router, team_id, quotas, profile, workers, servers, rng, log, bouncer, dbname
            )
            if not _done(router, team_id, quotas):
                quotas = _wrap_up(router, team_id, quotas)
                log(f"time is up: each agent stops at what it has sent ({quotas})")
            _settle(router, team_id, quotas, profile, log)
            if bouncer is not None:
                with suppress(psycopg.Error):  # a diagnosis, never a fault of the run
                    log(bouncer.waits_line(dbname))
            workers.stop_all()
            workers = None
            _check(router, team_id, result)
            return result
        finally:
            _kill(workers, beat)
            router.close()
            redis_server.stop()


def _shared_settings(profile: Profile, redis_url: str) -> dict[str, Any]:
    """The settings this process and the workers share (the workers get them as variables)."""
    return {
        "broker_url": redis_url,
        "redis_url": redis_url,
        "queue": f"agent_router.ops.chaos.{uuid.uuid4().hex[:8]}",
        "lease_seconds": profile.lease_seconds,
        "heartbeat_seconds": profile.heartbeat_seconds,
        "sweep_seconds": profile.sweep_seconds,
        "ask_block_seconds": profile.ask_block_seconds,
        "wake_recheck_seconds": 0.5,
        "question_timeout_seconds": 600.0,
        "pool_size": 4,
    }


def _worker_env(
    common: dict[str, Any], database_url: str, *, prepare: str = "auto"
) -> dict[str, str]:
    """The workers' environment: only the chaos run's AGENT_ROUTER_* variables, and the
    scripted chaos agents as their runtime."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    env.update({f"AGENT_ROUTER_{k.upper()}": str(v) for k, v in common.items()})
    env["AGENT_ROUTER_DATABASE_URL"] = f"{database_url}?application_name={WORKER_APP_NAME}"
    env["AGENT_ROUTER_DATABASE_PREPARE"] = prepare
    env["AGENT_ROUTER_RUNTIME_FACTORY"] = "agent_router.ops.chaos_agent:chaos_runtime"
    return env


def _start_beat(env: dict[str, str], workdir: Path) -> subprocess.Popen[bytes]:
    celery = str(Path(sys.executable).parent / "celery")
    return subprocess.Popen(
        [celery, "-A", "agent_router.worker.celery_app", "beat", "--loglevel=WARNING",
         "-s", str(workdir / "beat-schedule")],
        env=env,
        stdout=(workdir / "beat.log").open("ab"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip


def _start_team(router: Router, profile: Profile) -> tuple[int, dict[str, int]]:
    """A team of scripted chaos agents, each given its task; returns the team and each agent's
    quota of sends."""
    # Hours of turns on purpose: no budget may stop the team the run watches. Its agents run
    # on the scripted model (the chaos workers' runtime runs every agent on it).
    team = router.create_team(budget=NO_LIMITS, model=SCRIPTED_MODEL)
    for _ in range(SUB_AGENTS):
        router.create_agent(team.id, role=ROLE)
    names = [a.display_name for a in router.agents(team.id)]
    task = f"{TASK_PREFIX}{profile.sends_per_agent} asks={profile.asks_per_agent}"
    for name in names:
        router.send(team.id, to=name, content=task, type=MessageType.TASK)
    return team.id, dict.fromkeys(names, profile.sends_per_agent)


def _kill(workers: Workers | None, beat: subprocess.Popen[bytes] | None) -> None:
    """Whatever is still running when the run ends early."""
    if workers is not None:
        workers.kill_all()
    if beat is not None:
        beat.terminate()
        beat.wait(30)


def _sent(router: Router, team_id: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in router.messages(team_id):
        if m.dedup_key and m.dedup_key.startswith("chaos:"):
            counts[m.source_name] = counts.get(m.source_name, 0) + 1
    return counts


def _done(router: Router, team_id: int, quotas: dict[str, int]) -> bool:
    sent = _sent(router, team_id)
    return all(sent.get(name, 0) >= quota for name, quota in quotas.items())


def _kick(router: Router, team_id: int, quotas: dict[str, int]) -> None:
    """Wake resting agents that still have messages to send (nobody else may wake them)."""
    sent = _sent(router, team_id)
    for agent in router.agents(team_id):
        name = agent.display_name
        if agent.state in RESTING_STATES and sent.get(name, 0) < quotas[name]:
            router.send(team_id, to=name, content="chaos kick")


def _wrap_up(router: Router, team_id: int, quotas: dict[str, int]) -> dict[str, int]:
    """The chaos time is up before the agents sent their share: a new task tells each to stop at
    what it has sent and to ask nothing more (it still answers what it is asked), so that the team
    can settle before the workers stop. Returns the new quotas."""
    sent = _sent(router, team_id)
    wrapped = {name: min(quota, sent.get(name, 0)) for name, quota in quotas.items()}
    for name, quota in wrapped.items():
        router.send(team_id, to=name, content=f"{TASK_PREFIX}{quota} asks=0", type=MessageType.TASK)
    return wrapped


def _chaos_loop(  # noqa: PLR0917 - one private call site
    router: Router,
    team_id: int,
    quotas: dict[str, int],
    profile: Profile,
    workers: Workers,
    servers: tuple[PrivateRedis, PrivatePostgres | None],
    rng: random.Random,
    log: Any,
    bouncer: PrivatePgBouncer | None,
    dbname: str,
) -> ChaosResult:
    result = ChaosResult(report=TeamReport(), takeover_bound=profile.takeover_bound)
    started = time.monotonic()
    next_kill = started + rng.uniform(*profile.kill_every)
    faults = _faults(router, servers)
    kills: list[datetime] = []
    next_kick = started + 2.0
    while time.monotonic() - started < profile.duration:
        now = time.monotonic()
        if now >= next_kill:
            victim = rng.randrange(3)
            kills.append(utc_now())
            workers.kill(victim)
            result.events.append(f"{now - started:6.1f}s SIGKILL worker {victim} (restarted)")
            next_kill = now + rng.uniform(*profile.kill_every)
        for when, i, code in workers.exits():
            result.events.append(f"{when - started:6.1f}s worker {i} exited ({code}): restarted")
        if bouncer is not None:
            bouncer.sample_waits(dbname)
        # Every message of the team is read for it: only while a fault waits for its share.
        waiting = any(f.reached is None for f in faults)
        progress = _progress(router, team_id, quotas) if waiting else 1.0
        for fault in [f for f in faults if f.due(router, team_id, now, progress)]:
            result.faults[fault.name] = 0
            with suppress(errors.AgentRouterError):
                result.faults[fault.name] = _open_questions(router, team_id)
            done = fault.strike()
            result.events.append(f"{now - started:6.1f}s {done} "
                                 f"({result.faults[fault.name]} asks blocked)")  # fmt: skip
            faults.remove(fault)
        if now >= next_kick:
            with suppress(errors.AgentRouterError):
                if _done(router, team_id, quotas) and not faults:
                    break
                _kick(router, team_id, quotas)
            next_kick = now + 2.0
        time.sleep(0.2)
    for line in result.events:
        log(line)
    result.kills = len(kills)
    result.recoveries = _recoveries(router, team_id, kills)
    for recovery in result.recoveries:
        log(recovery.line())
    return result


#: Seconds a server restart waits for an ask to be blocked before it goes ahead anyway (15 s
#: was too short once on a loaded 2-core machine: Redis restarted with no ask open).
ASK_WAIT = 30.0


def _progress(router: Router, team_id: int, quotas: dict[str, int]) -> float:
    """The share of the team's messages sent so far (0 while the database cannot be read)."""
    with suppress(errors.AgentRouterError):
        sent = _sent(router, team_id)
        return sum(min(sent.get(n, 0), q) for n, q in quotas.items()) / max(sum(quotas.values()), 1)
    return 0.0


@dataclass(kw_only=True)
class _Fault:
    """A fault the run strikes once, when the team has sent the share ``after`` of its messages
    (so it strikes while the team still works, however fast the machine), and with
    ``while_asking`` once an ask is blocked too (at most ASK_WAIT seconds later)."""

    name: str
    after: float
    while_asking: bool
    strike: Callable[[], str]  # does it; says what it did
    reached: float | None = None  # when the share was reached (monotonic)

    def due(self, router: Router, team_id: int, now: float, progress: float) -> bool:
        if self.reached is None:
            if progress < self.after:
                return False
            self.reached = now
        if not self.while_asking or now - self.reached >= ASK_WAIT:
            return True
        with suppress(errors.AgentRouterError):
            return _open_questions(router, team_id) > 0
        return False


def _faults(router: Router, servers: tuple[PrivateRedis, PrivatePostgres | None]) -> list[_Fault]:
    """Redis restarted while asks block, the workers' PostgreSQL connections cut, and the
    PostgreSQL server restarted (fast: every connection is cut) while asks block."""
    redis_server, pg_server = servers

    def restart_redis() -> str:
        redis_server.stop()
        time.sleep(1.0)
        redis_server.start()
        return "Redis restarted"

    def terminate_backends() -> str:
        engine = make_engine(router.settings)  # the harness's own, short-lived
        try:
            n = kill_connections(engine, WORKER_APP_NAME)
        finally:
            engine.dispose()
        return f"terminated {n} worker PostgreSQL backends"

    faults = [
        _Fault(name="redis restart", after=0.2, while_asking=True, strike=restart_redis),
        _Fault(name="postgres backends", after=0.35, while_asking=False,
               strike=terminate_backends),
    ]  # fmt: skip
    if pg_server is not None:

        def restart_postgres() -> str:
            pg_server.stop()
            time.sleep(1.0)
            pg_server.start()
            return "PostgreSQL server restarted"

        faults.append(_Fault(name="postgres restart", after=0.5, while_asking=True,
                             strike=restart_postgres))  # fmt: skip
    return faults


def _settle(
    router: Router, team_id: int, quotas: dict[str, int], profile: Profile, log: Any
) -> None:
    deadline = time.monotonic() + profile.settle_seconds
    while time.monotonic() < deadline:
        with suppress(errors.AgentRouterError):
            _kick(router, team_id, quotas)
            agents = router.agents(team_id)
            open_q = _open_questions(router, team_id)
            if all(a.state in RESTING_STATES for a in agents) and not open_q:
                return
        time.sleep(1.0)
    for line in _open_question_report(router, team_id):
        log(line)
    log("the team did not settle in time: " + ", ".join(
        f"{a.display_name}={a.state.value}" for a in router.agents(team_id)))  # fmt: skip


def _open_question_report(router: Router, team_id: int) -> list[str]:
    """Why a question is still open: who asked whom, and where its ask message went."""
    lines = []
    rows = router.reads.open_question_report(team_id)
    for row in rows:
        lines.append("open question " + " ".join(str(v) for v in row))
    return lines


def _questions(router: Router, team_id: int) -> list[QuestionStatus]:
    return router.reads.question_statuses(team_id)


def _open_questions(router: Router, team_id: int) -> int:
    return sum(1 for s in _questions(router, team_id) if s is QuestionStatus.OPEN)


def _recoveries(router: Router, team_id: int, kills: list[datetime]) -> list[Recovery]:
    """Each turn fenced after a kill and followed by a recovery turn, from the database: its
    lease, its TAKE_OVER ledger event and the recovery turn's start."""
    leases = router.reads.turn_leases(team_id)
    taken_over = {
        e.turn_id: e.created_at
        for e in router.ledger(team_id)
        if e.action is LedgerAction.TAKE_OVER and e.turn_id is not None
    }
    recoveries: list[Recovery] = []
    for agent in router.agents(team_id):
        turns = router.reads.turns(agent.id)
        for dead, nxt in itertools.pairwise(turns):
            if dead.status is not TurnStatus.FENCED or nxt.trigger is not TurnTrigger.RECOVERY:
                continue
            lease, takeover = leases.get(dead.id), taken_over.get(dead.id)
            if lease is None or takeover is None:
                continue
            # The kill that stopped its heartbeat: the first one after the lease's last renewal
            # (a renewal may commit a moment after the harness noted the kill). A turn whose
            # worker died otherwise (a broker or database outage) has no such kill.
            renewed = lease - timedelta(seconds=router.settings.lease_seconds + KILL_SLACK)
            killed = [k for k in kills if renewed <= k <= takeover]
            if killed:
                recoveries.append(
                    Recovery(
                        agent=agent.display_name,
                        killed_at=killed[0],
                        lease_expired_at=lease,
                        taken_over_at=takeover,
                        running_at=nxt.started_at,
                    )
                )
    return sorted(recoveries, key=lambda r: r.killed_at)


def _check(router: Router, team_id: int, result: ChaosResult) -> None:
    result.report = check_team(router, team_id, quiescent=True)
    statuses = _questions(router, team_id)
    result.questions = len(statuses)
    result.open_questions = sum(1 for s in statuses if s is QuestionStatus.OPEN)
    result.recovered_turns = sum(
        1
        for a in router.agents(team_id)
        for t in router.reads.turns(a.id)
        if t.trigger is TurnTrigger.RECOVERY
    )
