"""Commands that start a long-running process: ``worker``, ``beat``, ``flower``.

Celery loads inside the commands: the other commands of the CLI start without it."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agent_router.ops import logs, preflight
from agent_router.ops.cli.common import (
    DatabaseUrlOption,
    LoglevelOption,
    _one_line_errors,
    _settings,
    app,
    broker_url_option,
    http_port_option,
    own_option,
    switch_option,
)
from agent_router.settings import Settings

if TYPE_CHECKING:
    from celery import Celery


WorkerBrokerUrlOption = Annotated[
    str | None,
    broker_url_option(
        "Broker the turn tasks come from: redis://... or amqp://..., the one the senders use."
    ),
]


def _worker_settings(database_url: str | None, broker_url: str | None) -> Settings:
    """The worker's settings, refused when no sender could reach it (memory://) or the
    database lacks the router's schema; exported so that the runtime a task builds (from
    ``Settings()``) sees the same database and broker."""
    settings = _settings(database_url, broker_url)
    if settings.broker_url.startswith("memory://"):
        raise preflight.NotReadyError(
            "a standalone worker on memory:// never receives work: that broker reaches only "
            "the threads of the process that sends",
            hint="set --broker-url (AGENT_ROUTER_BROKER_URL) to the redis:// or amqp:// broker "
            "the senders use; `agent-router demo` and `run` need no worker",
        )
    preflight.database_ready(settings.database_url)
    os.environ["AGENT_ROUTER_DATABASE_URL"] = settings.database_url
    os.environ["AGENT_ROUTER_BROKER_URL"] = settings.broker_url
    return settings


def _serve_metrics(port: int, settings: Settings, celery: Celery) -> None:
    from agent_router.worker import metrics, runtime

    # The reads are looked up at scrape time: the runtime is built by the first task.
    metrics.serve(
        port,
        reads=(lambda: runtime.current(celery).router.reads)
        if settings.metrics_cluster_gauges
        else None,
        addr=settings.metrics_address,
    )


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@_one_line_errors
def worker(  # noqa: PLR0917 - typer options
    ctx: typer.Context,
    concurrency: Annotated[
        int,
        typer.Option(envvar="AGENT_ROUTER_CONCURRENCY", help="Turns run at once by this worker."),
    ] = 8,
    pool: Annotated[
        str,
        typer.Option(
            envvar="AGENT_ROUTER_POOL",
            help="Celery pool: threads (default; turns wait on I/O) or prefork.",
        ),
    ] = "threads",
    loglevel: LoglevelOption = "INFO",
    database_url: DatabaseUrlOption = None,
    broker_url: WorkerBrokerUrlOption = None,
    supervise: Annotated[
        bool,
        switch_option(
            "supervise",
            "AGENT_ROUTER_SUPERVISE",
            "Run the worker as a child process and start it again if it dies.",
        ),
    ] = True,
    wait_for_broker: Annotated[
        bool,
        switch_option(
            "wait-for-broker",
            "AGENT_ROUTER_WAIT_FOR_BROKER",
            "Start while the broker is unreachable and wait for it (its sweeper takes over "
            "dead turns meanwhile), as a deployment that may start workers first wants. "
            "Default: refuse to start, in one line.",
        ),
    ] = False,
) -> None:
    """Start a Celery worker for the router's tasks, configured by AGENT_ROUTER_* variables.

    It refuses a memory:// broker (no other process can reach it), a broker that does not
    answer (unless --wait-for-broker) and a database without the router's schema. With
    AGENT_ROUTER_METRICS_PORT set it serves its Prometheus counters on that port
    (AGENT_ROUTER_METRICS_ADDRESS, default 127.0.0.1). Further arguments go to `celery worker`
    as they are (e.g. --hostname=w1@%h)."""
    settings = _worker_settings(database_url, broker_url)
    if not wait_for_broker and not (reached := preflight.broker(settings.broker_url)).ok:
        raise preflight.NotReadyError(
            reached.detail, hint=f"{reached.hint}; --wait-for-broker starts the worker anyway"
        )
    if supervise:  # the child reads the options from the environment _worker_settings set
        from agent_router.ops.supervisor import supervise as run_supervised

        # A child started again after a broker restart ended it waits for the broker.
        child = [sys.executable, "-m", "agent_router.ops.cli", "worker", "--no-supervise",
                 "--wait-for-broker"]  # fmt: skip
        options = [f"--concurrency={concurrency}", f"--pool={pool}", f"--loglevel={loglevel}"]
        raise typer.Exit(run_supervised([*child, *options, *ctx.args]))
    from agent_router.broker import create_app
    from agent_router.worker import bootstep as worker_sweeper

    logs.install_on_celery(settings.log_format)
    celery = create_app(settings)
    # The sweeper on a timer in this worker (Settings.worker_sweeper), not only through beat.
    worker_sweeper.install(celery)
    if settings.metrics_port is not None:
        _serve_metrics(settings.metrics_port, settings, celery)
    argv = [
        "worker",
        f"--pool={pool}",
        f"--concurrency={concurrency}",
        f"--loglevel={loglevel}",
        f"--queues={settings.queue}",
        *ctx.args,
    ]
    _run_and_exit(celery, argv)


def _run_and_exit(celery: Any, argv: list[str]) -> None:
    """Run the Celery worker, then exit at once even if a thread the broken connection left
    behind would keep the process alive (the supervisor can then start a fresh worker)."""
    from celery.signals import worker_shutdown

    # worker_main drops the worker's exit status: an unrecoverable error (status 1) would look
    # like a clean exit, and the supervisor would not start the worker again. The worker that
    # shuts down carries it.
    statuses: list[int] = []

    def keep_status(sender: Any, **_: Any) -> None:
        code = getattr(sender, "exitcode", 0)  # an int, or what a SystemExit carried
        statuses.append(code if isinstance(code, int) else (1 if code else 0))

    worker_shutdown.connect(keep_status, weak=False)
    try:
        celery.worker_main(argv)
        status = statuses[-1] if statuses else 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@_one_line_errors
def beat(
    ctx: typer.Context,
    loglevel: LoglevelOption = "INFO",
    schedule_file: Annotated[
        str | None,
        own_option(
            "beat",
            "schedule_file",
            "Where beat keeps its last-run times (default: celerybeat-schedule here).",
        ),
    ] = None,
) -> None:
    """Start `celery beat` with the router's schedule (the sweeper every sweep_seconds).

    Run exactly one per deployment. Further arguments go to `celery beat` as they are."""
    from agent_router.broker import create_app

    settings = Settings()
    logs.install_on_celery(settings.log_format)
    celery = create_app(settings)
    argv = ["beat", f"--loglevel={loglevel}"]
    if schedule_file:
        argv.append(f"--schedule={schedule_file}")
    celery.start([*argv, *ctx.args])


#: Flower's task list columns: the turn's label (agent, team, epoch, trigger) is its args, the
#: uuid the only link to a task's page, and the received time the one Flower's list sorts by
#: (newest first; without it the list is sorted by uuid, and a new turn may be on any page).
#: They fit a window 1400 px wide, measured in a browser; the task's name (the same for every
#: turn), its result (how it ended), its start time and its worker are on its page (the
#: worker's host name alone takes a fifth of the width).
FLOWER_TASK_COLUMNS = "uuid,args,state,received,runtime"


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@_one_line_errors
def flower(
    ctx: typer.Context,
    port: Annotated[int, http_port_option("AGENT_ROUTER_FLOWER_PORT")] = 5555,
    address: Annotated[
        str,
        typer.Option(
            envvar="AGENT_ROUTER_FLOWER_ADDRESS",
            help="Address to listen on. A dashboard: keep it on 127.0.0.1 or put it behind "
            "auth (docs/deployment.md).",
        ),
    ] = "127.0.0.1",
    tasks_columns: Annotated[
        str,
        typer.Option(
            envvar="AGENT_ROUTER_FLOWER_TASKS_COLUMNS",
            help="Columns of Flower's task list; the args column reads "
            "`UI Operator_1 (team 3) epoch 2 [new]`.",
        ),
    ] = FLOWER_TASK_COLUMNS,
) -> None:
    """Start Flower (`celery flower`, needs the `flower` package) on the router's broker.

    Further arguments go to `celery flower` as they are (e.g. --basic-auth=user:pass)."""
    from agent_router.broker import create_app

    celery = create_app(Settings())
    celery.start(
        [
            "flower",
            f"--port={port}",
            f"--address={address}",
            f"--tasks_columns={tasks_columns}",
            *ctx.args,
        ]
    )
