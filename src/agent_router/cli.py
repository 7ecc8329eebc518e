"""The ``agent-router`` command: ``demo`` and ``worker``."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from celery import Celery
from rich.console import Console
from rich.text import Text

from agent_router import runtime
from agent_router.celery_app import create_app
from agent_router.demo import DemoResult, LedgerTail, run_scenarios, setup_team
from agent_router.settings import Settings

app = typer.Typer(
    help="Durable, receiver-state message routing between LLM agents running as Celery tasks.",
    no_args_is_help=True,
    add_completion=False,
)

#: Worker threads of the embedded mode: one per agent that may run at once, with room to spare.
EMBEDDED_CONCURRENCY = 8

_OUTCOME_STYLES = {
    "injected_inline": "bold magenta",
    "triggered_new_turn": "bold green",
    "coalesced": "cyan",
    "queued": "dim",
    "resolved": "bold blue",
    "rejected": "bold red",
}
_ACTION_STYLES = {
    "turn_claimed": "green",
    "turn_ended": "yellow",
    "follow_up": "bold yellow",
    "claim_refused": "red",
    "drain": "blue",
}


@contextlib.contextmanager
def embedded_worker(celery: Celery, concurrency: int) -> Iterator[None]:
    """Celery worker threads inside this process, for the ``memory://`` broker.

    ``celery.contrib.testing.worker.start_worker`` is Celery's own way to run a full worker
    (consumer, thread pool, acks, events) in a thread: it returns only once the consumer is
    ready and shuts the worker down cleanly on exit, which a hand-rolled ``app.Worker`` thread
    would have to re-implement. The ping check needs a result backend, so it is off."""
    from celery.contrib.testing.worker import start_worker

    with start_worker(
        celery,
        pool="threads",
        concurrency=concurrency,
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=60.0,
    ):
        yield


def _render(console: Console, record: dict[str, Any]) -> None:
    line = Text()
    line.append(f"{record['t']:8.3f}s  ", style="dim")
    line.append(f"{record['agent'] or '-':<22} ", style="bold")
    style = _OUTCOME_STYLES.get(record["outcome"] or "", _ACTION_STYLES.get(record["action"], ""))
    line.append(record["text"], style=style)
    console.print(line, soft_wrap=True)


def _print_result(console: Console, result: DemoResult, as_json: bool) -> None:
    if as_json:
        for check in result.checks:
            print(json.dumps({"event": "check", "name": check.name, "ok": check.ok,
                              "detail": check.detail}), flush=True)  # fmt: skip
        print(json.dumps({"event": "result", "team_id": result.team_id, "ok": result.ok}))
        return
    console.rule("checks")
    for check in result.checks:
        mark = Text("PASS ", style="bold green") if check.ok else Text("FAIL ", style="bold red")
        console.print(mark + Text(check.name, style="bold") + Text(f"\n      {check.detail}"))
    verdict = "all guarantees held" if result.ok else "a guarantee was broken"
    console.print(Text(verdict, style="bold green" if result.ok else "bold red"))


@app.command()
def demo(
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per line instead of the timeline.")
    ] = False,
    database_url: Annotated[
        str | None,
        typer.Option(
            help="Database to run on (its tables are created if missing). "
            "Default: a temporary SQLite file.",
        ),
    ] = None,
    broker_url: Annotated[
        str,
        typer.Option(
            help="Celery broker. memory:// (default) runs turns on worker threads of this "
            "process; with redis://... start workers separately (`agent-router worker`, or "
            "`celery -A agent_router.celery_app worker`) with the same AGENT_ROUTER_DATABASE_URL,"
            " AGENT_ROUTER_BROKER_URL and AGENT_ROUTER_QUEUE.",
        ),
    ] = "memory://",
    embedded_workers: Annotated[
        bool | None,
        typer.Option(
            "--embedded-workers/--no-embedded-workers",
            help="Run worker threads in this process. Default: on for memory://, off otherwise.",
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each step.")] = 60.0,
) -> None:
    """Run the seed's team through the routing scenarios and print a live timeline.

    Exits non-zero if a scenario check or a guarantee (check_team) failed."""
    memory = broker_url.startswith("memory://")
    in_process = memory if embedded_workers is None else embedded_workers
    if memory and not in_process:
        raise typer.BadParameter("memory:// is only reachable from this process's own workers")
    console = Console(highlight=False, stderr=False)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="agent-router-demo-") as tmp:
        url = database_url or f"sqlite:///{Path(tmp) / 'demo.db'}"
        settings = Settings(database_url=url, broker_url=broker_url)
        celery = create_app(settings)
        rt = runtime.configure(settings, app=celery)
        router = rt.router
        router.create_schema()
        if not as_json:
            where = "threads of this process" if in_process else "separate worker processes"
            console.rule("agent-router demo")
            console.print(f"database {url}\nbroker   {broker_url} (turns run on {where})")

        def sink(record: dict[str, Any]) -> None:
            if as_json:
                print(json.dumps(record, default=str), flush=True)
            else:
                _render(console, record)

        team = setup_team(router)
        tail = LedgerTail(router, team.team.id, sink).start()
        workers = embedded_worker(celery, EMBEDDED_CONCURRENCY) if in_process else None
        try:
            with workers or contextlib.nullcontext():
                result = run_scenarios(router, team, timeout=timeout)
        finally:
            tail.stop()
            runtime.reset()
        _print_result(console, result, as_json)
    raise typer.Exit(0 if result.ok else 1)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(
    ctx: typer.Context,
    concurrency: Annotated[int, typer.Option(help="Turns run at once by this worker.")] = 8,
    pool: Annotated[
        str, typer.Option(help="Celery pool: threads (default; turns wait on I/O) or prefork.")
    ] = "threads",
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
) -> None:
    """Start a Celery worker for the router's tasks, configured by AGENT_ROUTER_* variables.

    Further arguments go to `celery worker` as they are (e.g. --hostname=w1@%h)."""
    settings = Settings()
    celery = create_app(settings)
    celery.worker_main(
        [
            "worker",
            f"--pool={pool}",
            f"--concurrency={concurrency}",
            f"--loglevel={loglevel}",
            f"--queues={settings.queue}",
            *ctx.args,
        ]
    )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
