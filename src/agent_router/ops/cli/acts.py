"""The operator's acts and tools: ``send``, ``answer``, ``stop``, ``terminate``, ``sweep``,
``check``, ``db``, ``bench``, ``chaos``."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from agent_router.domain import AgentState, Delivery, MessageType, RouteOutcome
from agent_router.ops.cli.common import (
    _OUTCOME_STYLES,
    AgentArgument,
    BrokerUrlOption,
    DatabaseUrlOption,
    JsonOption,
    ReasonOption,
    TeamArgument,
    _acting_router,
    _one_line_errors,
    _router,
    _settings,
    app,
    json_option,
    own_option,
    switch_option,
)
from agent_router.store.values import Deletion


@app.command()
@_one_line_errors
def send(  # noqa: PLR0917 - typer options
    team: TeamArgument,
    to: Annotated[str, typer.Argument(help="Display name of the receiver.")],
    content: Annotated[str, typer.Argument(help="The message.")],
    sender: Annotated[
        str,
        typer.Option(envvar="AGENT_ROUTER_SENDER", help="user, system, or an agent's name."),
    ] = "user",
    message_type: Annotated[
        MessageType, typer.Option("--type", envvar="AGENT_ROUTER_MESSAGE_TYPE")
    ] = MessageType.MESSAGE,
    wake: Annotated[
        bool,
        switch_option(
            "wake",
            "AGENT_ROUTER_WAKE",
            "--no-wake: a context-only notice, seen at the next turn (starts none).",
        ),
    ] = True,
    dedup_key: Annotated[
        str | None,
        typer.Option(
            envvar="AGENT_ROUTER_DEDUP_KEY",
            help="Sending again with the same key delivers nothing new.",
        ),
    ] = None,
    question_id: Annotated[
        int | None,
        typer.Option(
            envvar="AGENT_ROUTER_QUESTION_ID",
            help="With --type answer: the question answered (its asker is the receiver).",
        ),
    ] = None,
    database_url: DatabaseUrlOption = None,
    broker_url: BrokerUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Send a message into a team; it is routed by the receiver's state (and committed before
    this returns). Prints the outcome."""
    with _acting_router(database_url, broker_url) as router:
        delivery = router.send(
            team,
            to=to,
            content=content,
            sender=sender,
            type=message_type,
            wake=wake,
            dedup_key=dedup_key,
            question_id=question_id,
        )
        published = router.publisher is not None
    _print_delivery(delivery, published=published, as_json=as_json)


def _print_delivery(delivery: Delivery, *, published: bool, as_json: bool) -> None:
    if as_json:
        print(json.dumps({**dataclasses.asdict(delivery), "outcome": delivery.outcome.value}))
        return
    line = Text(f"message {delivery.message_id} to {delivery.target} (seq {delivery.seq}): ")
    line.append(delivery.outcome.value, style=_OUTCOME_STYLES.get(delivery.outcome.value, ""))
    if delivery.duplicate:
        line.append(" (already sent with this dedup key)")
    elif delivery.outcome is RouteOutcome.TRIGGERED_NEW_TURN and not published:
        line.append(" (no broker here: a worker's sweeper publishes the turn)")
    Console(highlight=False).print(line)


@app.command()
@_one_line_errors
def stop(
    team: TeamArgument,
    agent: AgentArgument,
    reason: ReasonOption = "stopped by an operator",
    database_url: DatabaseUrlOption = None,
    broker_url: BrokerUrlOption = None,
) -> None:
    """Stop a sub-agent cooperatively: a running turn stops at its next boundary (the rest of
    its tool calls get `cancelled` results), its questions are cancelled, its mailbox is kept."""
    with _acting_router(database_url, broker_url) as router:
        state = router.stop(team, agent, reason=reason)
    if state is AgentState.IDLE:
        print(f"{agent} stopped: idle")
    else:
        print(f"{agent} is {state.value}: it stops at its next boundary")


@app.command()
@_one_line_errors
def terminate(
    team: TeamArgument,
    agent: AgentArgument,
    reason: ReasonOption = "terminated by an operator",
    database_url: DatabaseUrlOption = None,
    broker_url: BrokerUrlOption = None,
) -> None:
    """Terminate a sub-agent for good: its pending messages are dropped with the reason and
    later sends to it are refused."""
    with _acting_router(database_url, broker_url) as router:
        router.terminate(team, agent, reason=reason)
    print(f"{agent} terminated")


@app.command()
@_one_line_errors
def sweep(
    database_url: DatabaseUrlOption = None,
    broker_url: BrokerUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run one sweeper pass now (what every worker runs on a timer) and print what it did, and
    each repair that failed for an agent (the pass went on for the others)."""
    with _acting_router(database_url, broker_url) as router:
        report = router.sweep()
    if as_json:
        print(json.dumps(dataclasses.asdict(report)))
        return
    print(" ".join(f"{k}={v}" for k, v in report.counts().items()))
    for failure in report.failures:
        print(f"failed: agent {failure.agent_id} {failure.step.value}: {failure.error[:200]}")


@app.command()
@_one_line_errors
def answer(
    question: Annotated[
        int, typer.Argument(envvar="AGENT_ROUTER_QUESTION_ID", help="The question's id.")
    ],
    content: Annotated[str, typer.Argument(help="The answer.")],
    sender: Annotated[
        str | None,
        typer.Option(
            envvar="AGENT_ROUTER_SENDER",
            help="Who answers. Default: the agent the question was asked of, on whose behalf "
            "the operator answers (only that agent's answer releases the asker's wait).",
        ),
    ] = None,
    database_url: DatabaseUrlOption = None,
    broker_url: BrokerUrlOption = None,
) -> None:
    """Answer a question by its id, on behalf of the agent it was asked of: the answer goes to
    whoever asked it and resolves their wait (a closed question is a one-line error and changes
    nothing)."""
    with _acting_router(database_url, broker_url) as router:
        delivery = router.answer(question, content, sender=sender)
    print(f"answer to {delivery.target} (message {delivery.message_id}): {delivery.outcome.value}")


@app.command()
@_one_line_errors
def check(
    team: TeamArgument,
    quiescent: Annotated[
        bool,
        typer.Option(
            "--quiescent",
            envvar="AGENT_ROUTER_QUIESCENT",
            help="The team is at rest: a pending message or an open tool call also counts.",
        ),
    ] = False,
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Check the team's guarantees from the database (nothing lost, duplicated or reordered,
    one turn at a time, every tool call answered, no turn left past its lease) and what it
    is owed (a question no one will answer, a wake message no turn will take, an agent the
    sweeper keeps failing for). Exit status 1 on a violation or a failure."""
    from agent_router.ops.checks import check_team

    with _router(database_url) as router:
        router.team(team)  # an unknown team is an error, not a clean report
        report = check_team(router, team, quiescent=quiescent)
    if as_json:
        print(json.dumps({**dataclasses.asdict(report), "ok": report.ok}))
    else:
        print(report.summary())
        for violation in report.violations:
            print(f"violation: {violation}")
        for failure in report.failures:
            print(f"failure: {failure}")
    if not report.ok:
        raise typer.Exit(1)


db_app = typer.Typer(help="The router's database schema (Alembic migrations).")
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
@_one_line_errors
def db_upgrade(
    database_url: DatabaseUrlOption = None,
    revision: Annotated[
        str, typer.Option(envvar="AGENT_ROUTER_REVISION", help="Target revision.")
    ] = "head",
    finish: Annotated[
        bool,
        typer.Option(
            "--finish",
            envvar="AGENT_ROUTER_UPGRADE_FINISH",
            help="Once no worker of an older release runs: upgrade to head, then drop every "
            "store function of other releases (PostgreSQL).",
        ),
    ] = False,
) -> None:
    """Apply the migrations up to ``revision`` (safe to run again: done ones are skipped). On
    PostgreSQL this release's store functions are added beside the previous release's, whose
    workers may still run; ``--finish`` removes the other releases' afterwards."""
    from agent_router.store import migrate

    settings = _settings(database_url)
    if not finish:
        migrate.upgrade(settings.database_url, revision)
        print(f"database at {revision}", file=sys.stderr)
        return
    if revision != "head":
        raise typer.BadParameter("--finish upgrades to head: leave --revision out")
    dropped = migrate.finish_upgrade(settings.database_url)
    print(
        f"database at head; {len(dropped)} store functions of other releases dropped",
        file=sys.stderr,
    )


# The options of `bench` that change what it measures.
ScaleOption = Annotated[
    str | None,
    own_option(
        "bench",
        "scale",
        "Measure the scale curve instead: grow the --postgres-url database (use one of its own) "
        "through these sizes, messages:teams comma-separated, e.g. "
        "10000:1000,100000:3000,1000000:10000, and measure route, claim and one sweeper pass at "
        "each.",
    ),
]
SvgOption = Annotated[
    Path | None,
    own_option("bench", "svg", "With --scale: also write the curve as an SVG chart here."),
]


@app.command()
@_one_line_errors
def bench(  # noqa: PLR0917 - typer options
    postgres_url: Annotated[
        str | None,
        own_option(
            "bench",
            "postgres_url",
            "PostgreSQL for the production figures (its tables are created). "
            "Without it (or --redis-url) only the embedded default is measured.",
        ),
    ] = None,
    redis_url: Annotated[
        str | None, own_option("bench", "redis_url", "Redis: broker and wake keys.")
    ] = None,
    samples: Annotated[int, own_option("bench", "samples", "Samples per latency figure.")] = 200,
    queued: Annotated[
        int, own_option("bench", "queued", "Messages queued for the drain figures.")
    ] = 100_000,
    as_json: Annotated[bool, json_option("A JSON list, one object per row.")] = False,
    scale: ScaleOption = None,
    svg: SvgOption = None,
    soak: Annotated[
        float | None,
        own_option(
            "bench",
            "soak",
            "Run the soak instead for this many minutes: worker processes, a scripted "
            "OpenAI-compatible model server, teams sent tasks at a steady rate; a row of figures "
            "per period, their slopes, and the guarantee checks (needs --postgres-url).",
        ),
    ] = None,
    workers: Annotated[int, own_option("bench", "workers", "--soak: worker processes.")] = 2,
    concurrency: Annotated[
        int, own_option("bench", "concurrency", "--soak: slots per worker.")
    ] = 8,
    teams: Annotated[int, own_option("bench", "teams", "--soak: teams of a lead and 3.")] = 20,
    rate: Annotated[float, own_option("bench", "rate", "--soak: sends per second.")] = 2.0,
    asks: Annotated[
        float, own_option("bench", "asks", "--soak: percent of tasks that ask the lead first.")
    ] = 0.0,
    period: Annotated[
        float, own_option("bench", "period", "--soak: seconds per row of figures.")
    ] = 60.0,
    warmup: Annotated[
        float,
        own_option(
            "bench",
            "warmup",
            "--soak: minutes the slopes leave out, while transcripts fill up to the context "
            "target (with at least three rows left).",
        ),
    ] = 0.0,
    unbudgeted: Annotated[
        bool,
        own_option(
            "bench",
            "unbudgeted",
            "--soak: teams without budgets, so that a few teams sent many tasks run until their "
            "requests reach the context target (the default token budget stops them first).",
        ),
    ] = False,
    tracemalloc_frames: Annotated[
        int,
        own_option(
            "bench",
            "tracemalloc",
            "--soak: the workers take tracemalloc snapshots keeping this many frames, and the "
            "end prints what grew most (0: none).",
            "--tracemalloc",
        ),
    ] = 0,
) -> None:
    """Measure routing, wake, turn start, throughput, burst and drain figures, each beside the
    floor of this machine measured in the same run (see docs/benchmarks.md); or, with --soak,
    run production-shaped load for minutes and print what grows (docs/deployment.md)."""

    from agent_router.ops import bench as bench_mod
    from agent_router.ops.bench_report import render, to_json

    if soak is not None:
        _soak(
            postgres_url,
            redis_url,
            soak=soak,
            workers=workers,
            concurrency=concurrency,
            teams=teams,
            rate=rate,
            asks=asks,
            period=period,
            warmup=warmup,
            unbudgeted=unbudgeted,
            tracemalloc_frames=tracemalloc_frames,
        )
        return
    if scale is not None:
        _scale_curve(postgres_url, scale, samples, svg, as_json)
        return
    logging.getLogger("celery").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        rows = bench_mod.run(
            postgres_url=postgres_url,
            redis_url=redis_url,
            sqlite_path=f"{tmp}/bench.db",
            samples=samples,
            queued=queued,
        )
    print(to_json(rows) if as_json else render(rows))


def _soak(postgres_url: str | None, redis_url: str | None, *, soak: float, **given: Any) -> None:
    from agent_router.ops import soak as soak_mod

    if not postgres_url or not postgres_url.startswith("postgresql"):
        raise typer.BadParameter(
            "the soak creates a database of its own on a PostgreSQL server: give one",
            param_hint="--postgres-url",
        )
    if soak <= 0 or given["rate"] <= 0 or given["period"] <= 0 or given["workers"] < 1:
        raise typer.BadParameter("--soak, --rate, --period and --workers must be positive")
    logging.getLogger("celery").setLevel(logging.WARNING)
    result = soak_mod.run(
        soak_mod.SoakOptions(minutes=soak, database_url=postgres_url, redis_url=redis_url, **given),
        out=lambda line: print(line, flush=True),
    )
    if not result.ok:
        raise typer.Exit(1)


def _scale_curve(
    postgres_url: str | None, sizes: str, samples: int, svg: Path | None, as_json: bool
) -> None:
    from agent_router.ops import scale as scale_mod
    from agent_router.ops.bench_report import render, to_json

    if not postgres_url or not postgres_url.startswith("postgresql"):
        raise typer.BadParameter(
            "the curve fills a PostgreSQL database: give one", param_hint="--postgres-url"
        )
    try:
        parsed = scale_mod.parse_sizes(sizes)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--scale") from None
    rows, points = scale_mod.curve(postgres_url, parsed, samples=samples)
    if svg is not None:
        svg.write_text(scale_mod.svg(points), encoding="utf-8")
    print(to_json(rows) if as_json else render(rows))


@app.command()
def chaos(
    duration: Annotated[
        float,
        own_option("chaos", "duration", "Most seconds of chaos (kills) before the team settles."),
    ] = 600.0,
    sends: Annotated[
        int | None,
        own_option(
            "chaos",
            "sends",
            "Messages each of the 6 agents sends (default: enough for ten minutes).",
        ),
    ] = None,
    asks: Annotated[
        int | None, own_option("chaos", "asks", "Asks each of the 6 agents makes.")
    ] = None,
    admin_url: Annotated[
        str,
        own_option(
            "chaos",
            "admin_url",
            "PostgreSQL URL allowed to create (and drop) the run's private database, used only "
            "where PostgreSQL's server binaries (initdb, pg_ctl) are missing.",
        ),
    ] = "postgresql+psycopg://root@127.0.0.1:5432/test",
    pgbouncer_pool: Annotated[
        int | None,
        own_option(
            "chaos",
            "pgbouncer_pool",
            "Put a private PgBouncer (Debian's pgbouncer) between the workers and PostgreSQL: "
            "transaction pooling with this many server connections (the 3 workers have 12 "
            "slots), the workers' preparing off.",
        ),
    ] = None,
) -> None:
    """Kill workers, restart Redis, cut database connections and restart a private PostgreSQL
    server while 6 scripted agents talk; then check from the database that nothing was lost,
    duplicated or reordered, and that no turn failed.

    Prints one summary line and exits non-zero if any bad count is not zero."""
    from dataclasses import replace

    from agent_router.ops.chaos import LONG_PROFILE, run_chaos

    profile = replace(
        LONG_PROFILE,
        duration=duration,
        sends_per_agent=LONG_PROFILE.sends_per_agent if sends is None else sends,
        asks_per_agent=LONG_PROFILE.asks_per_agent if asks is None else asks,
    )
    if pgbouncer_pool is not None and pgbouncer_pool < 1:
        raise typer.BadParameter("at least 1 server connection", param_hint="--pgbouncer-pool")
    result = run_chaos(
        profile,
        admin_url=admin_url,
        pgbouncer_pool=pgbouncer_pool,
        log=lambda line: print(line, flush=True),
    )
    print(result.recovery_line())
    print(f"questions={result.questions} open_questions={result.open_questions}")
    for violation in result.report.violations[:20]:
        print(f"violation: {violation}")
    print(result.summary())
    raise typer.Exit(0 if result.ok else 1)


team_app = typer.Typer(help="Teams: delete one with everything it owns.")
app.add_typer(team_app, name="team")

DryRunOption = Annotated[
    bool,
    typer.Option(
        "--dry-run", envvar="AGENT_ROUTER_DRY_RUN", help="Count what would go; delete nothing."
    ),
]


IncludeUndeliveredOption = Annotated[
    bool,
    typer.Option(
        "--include-undelivered",
        envvar="AGENT_ROUTER_INCLUDE_UNDELIVERED",
        help="Also drop what a team still owes (undelivered mail, open questions, a spent "
        "budget it waits to have raised, unpublished outbox rows, a turn at work); the "
        "ledger records what was dropped.",
    ),
]


def _print_deletion(deletion: Deletion, as_json: bool) -> None:
    if as_json:
        print(json.dumps({**dataclasses.asdict(deletion), "total": deletion.total}))
        return
    verb = "would delete" if deletion.dry_run else "deleted"
    teams = ",".join(str(t) for t in deletion.teams) or "-"
    rows = " ".join(f"{name.removeprefix('ar_')}={n}" for name, n in deletion.rows.items() if n)
    print(f"{verb} teams {teams}: {deletion.total} rows ({rows or 'none'})")
    if deletion.owed:
        owed = " ".join(f"{kind}={n}" for kind, n in deletion.owed.items())
        print(f"{'would drop' if deletion.dry_run else 'dropped'} what was owed: {owed}")
    if deletion.kept:
        kept = ",".join(str(t) for t in deletion.kept)
        print(f"kept teams {kept}: they still owe something (--include-undelivered drops it)")


@team_app.command("delete")
@_one_line_errors
def team_delete(
    team: TeamArgument,
    dry_run: DryRunOption = False,
    include_undelivered: IncludeUndeliveredOption = False,
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete a team and every row it owns (agents, messages, transcripts, turns, questions,
    jobs, outbox, ledger) and its wake keys; its queued turn tasks then claim nothing. A team
    that still owes something is refused unless --include-undelivered."""
    with _acting_router(database_url, None) as router:
        deletion = router.delete_team(
            team, dry_run=dry_run, include_undelivered=include_undelivered
        )
        _print_deletion(deletion, as_json)


@app.command()
@_one_line_errors
def prune(  # noqa: PLR0917 - typer options
    older_than_days: Annotated[
        float,
        typer.Option(
            envvar="AGENT_ROUTER_OLDER_THAN_DAYS",
            help="Finished teams with no ledger event for this long, and outbox rows "
            "published this long ago.",
        ),
    ] = 30.0,
    ledger_older_than_days: Annotated[
        float | None,
        typer.Option(
            envvar="AGENT_ROUTER_LEDGER_RETENTION_DAYS",
            help="Also the routine ledger events (routes, drains, claims, turn ends, model "
            "calls, ...) older than this, of live teams too; what check reads is kept.",
        ),
    ] = None,
    dry_run: DryRunOption = False,
    include_undelivered: IncludeUndeliveredOption = False,
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Retention: delete finished teams (no agent scheduled, running or waiting) idle for
    --older-than-days that owe nothing (undelivered mail, open questions, a spent budget,
    unpublished outbox rows: those are kept, and listed, unless --include-undelivered), and
    outbox rows published that long ago; with --ledger-older-than-days, the routine ledger
    events that old of the teams left."""
    with _acting_router(database_url, None) as router:
        seconds = older_than_days * 86400 if older_than_days >= 0 else -1.0
        ledger = None
        if ledger_older_than_days is not None:
            ledger = ledger_older_than_days * 86400 if ledger_older_than_days >= 0 else -1.0
        deletion = router.prune(
            older_than_seconds=seconds,
            dry_run=dry_run,
            include_undelivered=include_undelivered,
            ledger_older_than_seconds=ledger,
        )
        _print_deletion(deletion, as_json)
