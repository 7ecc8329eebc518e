"""The ``agent-router`` command: ``demo``, ``worker``, ``beat``, ``flower``, the operator's reads
(``status``, ``ledger``, ``inspect``), acts (``send``, ``stop``, ``terminate``, ``sweep``) and
``db upgrade``."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import sys
import tempfile
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from celery import Celery
from rich.console import Console
from rich.table import Table
from rich.text import Text

from agent_router import errors
from agent_router.domain import AgentState, AgentStatus, MessageType, RouteOutcome
from agent_router.ops.demo import DemoResult, LedgerTail, event_record, run_scenarios, setup_team
from agent_router.router import Router
from agent_router.settings import Settings
from agent_router.store import Store, utcnow
from agent_router.worker import bootstep as worker_sweeper
from agent_router.worker import runtime
from agent_router.worker.celery_app import create_app
from agent_router.worker.embedded import SweeperThread
from agent_router.worker.publisher import CeleryPublisher

P = ParamSpec("P")
R = TypeVar("R")

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
        bool,
        typer.Option(
            "--json",
            envvar="AGENT_ROUTER_JSON",
            help="One JSON object per line instead of the timeline.",
        ),
    ] = False,
    database_url: Annotated[
        str | None,
        typer.Option(
            envvar="AGENT_ROUTER_DEMO_DATABASE_URL",
            help="Database to run on (its tables are created if missing). "
            "Default: a temporary SQLite file.",
        ),
    ] = None,
    broker_url: Annotated[
        str,
        typer.Option(
            envvar="AGENT_ROUTER_DEMO_BROKER_URL",
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
            envvar="AGENT_ROUTER_EMBEDDED_WORKERS",
            help="Run worker threads in this process. Default: on for memory://, off otherwise.",
        ),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(envvar="AGENT_ROUTER_DEMO_TIMEOUT", help="Seconds to wait for each step."),
    ] = 60.0,
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
        settings = Settings(
            database_url=url, broker_url=broker_url, redis_url=_redis_url(broker_url)
        )
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
        # The embedded mode's beat: the sweeper on an in-process timer.
        sweeper = SweeperThread(router) if in_process else contextlib.nullcontext()
        try:
            with workers or contextlib.nullcontext(), sweeper:
                result = run_scenarios(router, team, timeout=timeout)
        finally:
            tail.stop()
            runtime.reset()
        _print_result(console, result, as_json)
    raise typer.Exit(0 if result.ok else 1)


def _redis_url(broker_url: str) -> str | None:
    """Wake keys of blocked asks go through Redis whenever the broker is Redis, so that the
    answering and the waiting process need not be the same; else the configured one."""
    if broker_url.startswith(("redis://", "rediss://")):
        return broker_url
    return Settings().redis_url


@app.command()
def run(  # noqa: PLR0917 - typer options
    task: Annotated[str, typer.Argument(help="The task for the Team Leader.")],
    model: Annotated[
        str | None,
        typer.Option(envvar="AGENT_ROUTER_OPENAI_MODEL", help="Model name."),
    ] = None,
    base_url: Annotated[
        str | None,
        typer.Option(
            envvar="AGENT_ROUTER_OPENAI_BASE_URL",
            help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1 (default: the SDK's).",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            envvar="AGENT_ROUTER_JSON",
            help="One JSON object per line instead of the timeline.",
        ),
    ] = False,
    roles: Annotated[
        Path | None,
        typer.Option(
            envvar="AGENT_ROUTER_ROLES_FILE",
            help="Roles catalogue (TOML). Default: the shipped seed roles.",
        ),
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            envvar="AGENT_ROUTER_RUN_DATABASE_URL",
            help="Database (tables created if missing). Default: a temporary SQLite.",
        ),
    ] = None,
    broker_url: Annotated[
        str,
        typer.Option(
            envvar="AGENT_ROUTER_RUN_BROKER_URL",
            help="Celery broker: memory:// (default) runs turns on threads of this process; with "
            "redis://... start workers with AGENT_ROUTER_RUNTIME_FACTORY="
            "agent_router.ops.team_run:openai_runtime and the same AGENT_ROUTER_* settings.",
        ),
    ] = "memory://",
    embedded_workers: Annotated[
        bool | None,
        typer.Option(
            "--embedded-workers/--no-embedded-workers",
            envvar="AGENT_ROUTER_EMBEDDED_WORKERS",
            help="Run worker threads in this process. Default: on for memory://, off otherwise.",
        ),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            envvar="AGENT_ROUTER_RUN_TIMEOUT",
            help="Seconds until every agent must be idle or completed.",
        ),
    ] = 1800.0,
) -> None:
    """Give TASK to a new team's lead and run the team with an OpenAI-compatible model (API key
    from AGENT_ROUTER_OPENAI_API_KEY or OPENAI_API_KEY) until every agent is idle or completed,
    printing the live timeline. Exits non-zero if a turn failed or the team did not settle."""
    import os

    from agent_router.agents.roles import RoleCatalogue
    from agent_router.agents.tools import default_registry
    from agent_router.ops import team_run

    memory = broker_url.startswith("memory://")
    in_process = memory if embedded_workers is None else embedded_workers
    if memory and not in_process:
        raise typer.BadParameter("memory:// is only reachable from this process's own workers")
    console = Console(highlight=False, stderr=False)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        catalogue = RoleCatalogue.from_file_or_default(roles)
    except errors.ConfigurationError as exc:
        raise typer.BadParameter(str(exc), param_hint="--roles") from None
    if roles is not None:
        os.environ[team_run.ROLES_FILE_ENV] = str(roles)  # for this process's runtime factory

    with tempfile.TemporaryDirectory(prefix="agent-router-run-") as tmp:
        url = database_url or f"sqlite:///{Path(tmp) / 'run.db'}"
        overrides: dict[str, Any] = {"openai_model": model} if model else {}
        if base_url:
            overrides["openai_base_url"] = base_url
        settings = Settings(
            database_url=url, broker_url=broker_url, redis_url=_redis_url(broker_url), **overrides
        )
        models = team_run.openai_models(settings, catalogue)
        try:
            # Build one model now: a missing key or SDK fails before anything runs.
            from agent_router.agents.openai_model import OpenAIModel

            OpenAIModel(settings).close()
        except errors.ConfigurationError as exc:
            console.print(Text(f"error: {exc}", style="bold red"))
            raise typer.Exit(2) from None
        celery = create_app(settings)
        rt = runtime.configure(
            settings, app=celery, models=models, tools=default_registry(catalogue)
        )
        router = rt.router
        router.create_schema()
        if not as_json:
            console.rule("agent-router run")
            console.print(
                f"model    {settings.openai_model} at {settings.openai_base_url or 'default'}\n"
                f"database {url}\nbroker   {broker_url}"
            )

        def sink(record: dict[str, Any]) -> None:
            if as_json:
                print(json.dumps(record, default=str), flush=True)
            else:
                _render(console, record)

        team_id = team_run.start_team(router, task, catalogue)
        tail = LedgerTail(router, team_id, sink).start()
        workers = embedded_worker(celery, EMBEDDED_CONCURRENCY) if in_process else None
        sweeper = SweeperThread(router) if in_process else contextlib.nullcontext()
        try:
            with workers or contextlib.nullcontext(), sweeper:
                is_settled = team_run.wait_settled(router, team_id, timeout=timeout)
            result = team_run.result_of(router, team_id, is_settled=is_settled)
        finally:
            tail.stop()
            runtime.reset()
    if as_json:
        print(json.dumps({"event": "result", "team_id": team_id, "ok": result.ok,
                          "settled": result.settled, "states": result.states,
                          "failed_turns": result.failed_turns, "final": result.final}))  # fmt: skip
    else:
        console.rule("result")
        for name, state in result.states.items():
            console.print(f"{name:<24} {state}")
        for failure in result.failed_turns:
            console.print(Text(f"failed: {failure}", style="bold red"))
        if not result.settled:
            console.print(Text(f"the team did not settle within {timeout:.0f}s", style="bold red"))
        if result.final:
            console.print(Text("Team Leader: ", style="bold") + Text(result.final))
    raise typer.Exit(0 if result.ok else 1)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(
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
    loglevel: Annotated[
        str, typer.Option(envvar="AGENT_ROUTER_LOGLEVEL", help="Celery log level.")
    ] = "INFO",
) -> None:
    """Start a Celery worker for the router's tasks, configured by AGENT_ROUTER_* variables.

    With AGENT_ROUTER_METRICS_PORT set it serves Prometheus metrics on that port.
    Further arguments go to `celery worker` as they are (e.g. --hostname=w1@%h)."""
    settings = Settings()
    celery = create_app(settings)
    # The sweeper on a timer in this worker (Settings.worker_sweeper), not only through beat.
    worker_sweeper.install(celery)
    if settings.metrics_port is not None:
        from agent_router.worker import metrics

        # The store is looked up at scrape time: the runtime is built by the first task.
        metrics.serve(settings.metrics_port, store=lambda: runtime.current(celery).router.store)
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


# ---------------------------------------------------------------------- operating (issue 7)
#
# Every option is also read from an AGENT_ROUTER_* variable; errors are one line on stderr and
# exit 1 (the `_one_line_errors` boundary), never a traceback.

DatabaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="AGENT_ROUTER_DATABASE_URL",
        help="SQLAlchemy URL of the router's database.",
        show_default=False,
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", envvar="AGENT_ROUTER_JSON", help="JSON instead of a table.")
]
LoglevelOption = Annotated[
    str, typer.Option(envvar="AGENT_ROUTER_LOGLEVEL", help="Celery log level.")
]


def _error_line(exc: BaseException) -> str:
    """One line that says what went wrong, for any error the CLI boundary catches."""
    import pydantic
    import sqlalchemy.exc

    if isinstance(exc, pydantic.ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        text = f"invalid setting {where}: {first['msg']}"
    elif isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.orig is not None:
        text = f"database error: {exc.orig}"
    elif isinstance(exc, errors.AgentRouterError):
        text = str(exc)
    else:
        text = f"{type(exc).__name__}: {exc}"
    line = " ".join(text.split())
    return line[:500] or type(exc).__name__


def _one_line_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """The CLI boundary: our errors and driver errors become one line on stderr and exit 1."""
    import kombu.exceptions
    import pydantic
    import redis
    import sqlalchemy.exc

    caught = (
        errors.AgentRouterError,
        sqlalchemy.exc.SQLAlchemyError,
        pydantic.ValidationError,
        redis.RedisError,
        kombu.exceptions.OperationalError,
        ConnectionError,
    )

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except caught as exc:
            print(f"agent-router: error: {_error_line(exc)}", file=sys.stderr)
            raise typer.Exit(1) from None

    return wrapper


def _settings(database_url: str | None = None, broker_url: str | None = None) -> Settings:
    """Settings from AGENT_ROUTER_* variables, with the URLs given on the command line."""
    given: dict[str, Any] = {"database_url": database_url, "broker_url": broker_url}
    return Settings(**{k: v for k, v in given.items() if v})


@contextlib.contextmanager
def _store(database_url: str | None) -> Iterator[Store]:
    """A store for one read; the pool is closed afterwards."""
    store = Store(_settings(database_url))
    try:
        yield store
    finally:
        store.dispose()


def _lease_text(expires: datetime | None, now: datetime) -> str:
    if expires is None:
        return "-"
    left = (expires - now).total_seconds()
    return f"{left:.0f}s left" if left >= 0 else f"expired {-left:.0f}s ago"


def _state_text(status: AgentStatus) -> str:
    agent = status.agent
    if agent.state is AgentState.WAITING:
        return f"waiting ({'suspended' if agent.suspended else 'blocking'})"
    return agent.state.value


def _ids_text(ids: tuple[int, ...]) -> str:
    return ",".join(str(i) for i in ids) or "-"


@app.command()
@_one_line_errors
def status(
    team: Annotated[
        int | None,
        typer.Argument(envvar="AGENT_ROUTER_TEAM", help="Team id; all teams when omitted."),
    ] = None,
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Agents of a team (or of all teams): state, epoch, mailbox depth, open questions, lease."""
    with _store(database_url) as store:
        statuses = store.agent_statuses(team)
    now = utcnow()
    if as_json:
        for s in statuses:
            print(
                json.dumps(
                    {
                        "team_id": s.agent.team_id,
                        "agent_id": s.agent.id,
                        "agent": s.agent.display_name,
                        "role": s.agent.role,
                        "state": s.agent.state.value,
                        "suspended": s.agent.suspended,
                        "epoch": s.agent.epoch,
                        "mailbox_depth": s.agent.mailbox_depth,
                        "open_questions": list(s.open_questions),
                        "questions_to_answer": list(s.questions_to_answer),
                        "turn_id": s.turn_id,
                        "lease_expires_at": s.lease_expires_at.isoformat() + "Z"
                        if s.lease_expires_at
                        else None,
                    }
                )
            )
        return
    table = Table(title=f"team {team}" if team is not None else "all teams", title_justify="left")
    for column in ("team", "agent", "state", "epoch", "mailbox", "asked", "to answer", "turn"):
        table.add_column(
            column, justify="right" if column in ("team", "epoch", "mailbox") else "left"
        )
    table.add_column("lease")
    for s in statuses:
        table.add_row(
            str(s.agent.team_id),
            s.agent.display_name,
            Text(_state_text(s), style=_STATE_STYLES.get(s.agent.state, "")),
            str(s.agent.epoch),
            str(s.agent.mailbox_depth),
            _ids_text(s.open_questions),
            _ids_text(s.questions_to_answer),
            str(s.turn_id) if s.turn_id is not None else "-",
            _lease_text(s.lease_expires_at, now),
        )
    Console(highlight=False).print(table)


_STATE_STYLES = {
    AgentState.RUNNING: "bold green",
    AgentState.WAITING: "bold blue",
    AgentState.SCHEDULED: "cyan",
    AgentState.COMPLETED: "yellow",
    AgentState.TERMINATED: "red",
}


@app.command()
@_one_line_errors
def ledger(
    team: Annotated[int, typer.Argument(envvar="AGENT_ROUTER_TEAM", help="Team id.")],
    database_url: DatabaseUrlOption = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", envvar="AGENT_ROUTER_JSON", help="One JSON object per line."),
    ] = False,
    after: Annotated[
        int, typer.Option(envvar="AGENT_ROUTER_AFTER", help="Only events after this ledger id.")
    ] = 0,
) -> None:
    """The team's timeline: routing decisions (with outcomes) and turns, from the ledger."""
    with _store(database_url) as store:
        store.team(team)  # an unknown team is an error, not an empty timeline
        events = store.ledger(team, after_id=after)
        messages = {m.id: m for m in store.messages(team)}
    console = Console(highlight=False)
    t0 = events[0].created_at.timestamp() if events else 0.0
    for event in events:
        record = event_record(event, messages, t0)
        if as_json:
            print(json.dumps(record, default=str))
        else:
            _render(console, record)


inspect_app = typer.Typer(help="Look at one message or one agent's transcript, with provenance.")
app.add_typer(inspect_app, name="inspect")


@inspect_app.command("message")
@_one_line_errors
def inspect_message(
    message_id: Annotated[int, typer.Argument(help="Message id.")],
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """A message: who sent it to whom, how it was routed, and where it entered a transcript."""
    with _store(database_url) as store:
        msg = store.message(message_id)
        events = store.message_events(message_id)
        entry = next(
            (e for e in store.transcript_entries(msg.target_agent_id) if e["message_id"] == msg.id),
            None,
        )
    record: dict[str, Any] = {
        "id": msg.id,
        "team_id": msg.team_id,
        "from": msg.source_name,
        "to": msg.target_name,
        "type": msg.type.value,
        "subtype": msg.subtype.value if msg.subtype else None,
        "question_id": msg.question_id,
        "wake": msg.wake,
        "seq": msg.seq,
        "dedup_key": msg.dedup_key,
        "created_at": msg.created_at.isoformat() + "Z",
        "outcome": msg.outcome.value,
        "status": msg.status.value,
        "consumed_by_turn": msg.consumed_turn_id,
        "drop_reason": msg.drop_reason,
        "transcript_position": entry["position"] if entry else None,
        "transcript_role": entry["payload"]["role"] if entry else None,
        "content": msg.content,
        "ledger": [
            {"id": e.id, "action": e.action.value, "agent": e.agent_name, "detail": e.detail}
            for e in events
        ],
    }
    if as_json:
        print(json.dumps(record, default=str))
        return
    console = Console(highlight=False)
    for key, value in record.items():
        if key not in ("content", "ledger") and value is not None:
            console.print(Text(f"{key:>20}  ", style="dim") + Text(str(value)))
    for e in events:
        console.print(Text(f"{'ledger':>20}  ", style="dim") + Text(f"#{e.id} {e.action.value}"))
    console.rule("content")
    console.print(Text(msg.content))


@inspect_app.command("agent")
@_one_line_errors
def inspect_agent(
    team: Annotated[int, typer.Argument(help="Team id.")],
    name: Annotated[str, typer.Argument(help="Display name, e.g. 'UI Operator_1'.")],
    database_url: DatabaseUrlOption = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", envvar="AGENT_ROUTER_JSON", help="One JSON entry per line."),
    ] = False,
    full: Annotated[
        bool,
        typer.Option("--full", envvar="AGENT_ROUTER_FULL", help="Whole contents, not previews."),
    ] = False,
) -> None:
    """An agent's transcript, entry by entry, with each entry's turn and provenance."""
    with _store(database_url) as store:
        agent = store.agent(team, name)
        entries = store.transcript_entries(agent.id)
    if as_json:
        for e in entries:
            print(json.dumps(e, default=str))
        return
    console = Console(highlight=False)
    console.print(
        Text(f"{agent.display_name} ", style="bold")
        + Text(
            f"(team {agent.team_id}, {agent.state.value}, epoch {agent.epoch}, "
            f"{agent.mailbox_depth} pending)"
        )
    )
    for e in entries:
        payload = e["payload"]
        head = Text(f"[{e['position']}] ", style="dim")
        head.append(payload.get("role", "?"), style="bold")
        head.append(f"  turn {e['turn_id'] if e['turn_id'] is not None else '-'}", style="dim")
        meta = e["meta"] or {}
        if e["message_id"] is not None:
            head.append(
                f"  <- {meta.get('type')}"
                + (f"/{meta['subtype']}" if meta.get("subtype") else "")
                + f" from {meta.get('from')} (message {e['message_id']}"
                + (f", question {meta['question_id']}" if meta.get("question_id") else "")
                + ")",
                style="cyan",
            )
        if meta.get("synthetic"):
            head.append(f"  synthetic {meta['synthetic']}", style="yellow")
        if payload.get("tool_call_id"):
            head.append(f"  result of {payload['tool_call_id']}", style="magenta")
        console.print(head)
        for call in payload.get("tool_calls") or []:
            fn = call.get("function", {})
            console.print(
                Text(f"    call {call.get('id')}: {fn.get('name')}({fn.get('arguments')})")
            )
        content = payload.get("content")
        if content:
            text = str(content)
            if not full and len(text) > 300:
                text = text[:300] + f"… ({len(text)} chars; --full for all)"
            console.print(Text("    " + text.replace("\n", "\n    ")))


# ---------------------------------------------------------------------- acting on a team
#
# The same transitions the tools and the host's code use, from a shell: each goes through the
# Router (one transaction, a ledger event), and a turn it schedules is published to the broker.

BrokerUrlOption = Annotated[
    str | None,
    typer.Option(
        "--broker-url",
        envvar="AGENT_ROUTER_BROKER_URL",
        help="Broker the turn tasks go to. memory:// (the default) publishes nothing from here: "
        "the sweeper of any worker on the database publishes the turn within a sweep period.",
        show_default=False,
    ),
]
ReasonOption = Annotated[
    str,
    typer.Option(envvar="AGENT_ROUTER_REASON", help="Recorded in the ledger (and in results)."),
]


@contextlib.contextmanager
def _acting_router(database_url: str | None, broker_url: str | None) -> Iterator[Router]:
    """A Router that publishes to the configured broker (none for memory://); closed after."""
    settings = _settings(database_url, broker_url)
    celery = None if settings.broker_url.startswith("memory://") else create_app(settings)
    router = Router(settings, publisher=CeleryPublisher(celery) if celery else None)
    try:
        yield router
    finally:
        router.close()
        if celery is not None:
            celery.close()


@app.command()
@_one_line_errors
def send(  # noqa: PLR0917 - typer options
    team: Annotated[int, typer.Argument(envvar="AGENT_ROUTER_TEAM", help="Team id.")],
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
        typer.Option(
            "--wake/--no-wake",
            envvar="AGENT_ROUTER_WAKE",
            help="--no-wake: a context-only notice, seen at the next turn (starts none).",
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
    team: Annotated[int, typer.Argument(envvar="AGENT_ROUTER_TEAM", help="Team id.")],
    agent: Annotated[str, typer.Argument(help="Display name of a sub-agent.")],
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
    team: Annotated[int, typer.Argument(envvar="AGENT_ROUTER_TEAM", help="Team id.")],
    agent: Annotated[str, typer.Argument(help="Display name of a sub-agent.")],
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
    """Run one sweeper pass now (what every worker runs on a timer) and print what it did."""
    with _acting_router(database_url, broker_url) as router:
        report = router.sweep()
    if as_json:
        print(json.dumps(dataclasses.asdict(report)))
    else:
        print(" ".join(f"{k}={v}" for k, v in dataclasses.asdict(report).items()))


db_app = typer.Typer(help="The router's database schema (Alembic migrations).")
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
@_one_line_errors
def db_upgrade(
    database_url: DatabaseUrlOption = None,
    revision: Annotated[
        str, typer.Option(envvar="AGENT_ROUTER_REVISION", help="Target revision.")
    ] = "head",
) -> None:
    """Apply the migrations up to ``revision`` (safe to run again: done ones are skipped)."""
    from agent_router.store import migrate

    settings = _settings(database_url)
    migrate.upgrade(settings.database_url, revision)
    print(f"database at {revision}", file=sys.stderr)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@_one_line_errors
def beat(
    ctx: typer.Context,
    loglevel: LoglevelOption = "INFO",
    schedule_file: Annotated[
        str | None,
        typer.Option(
            envvar="AGENT_ROUTER_BEAT_SCHEDULE_FILE",
            help="Where beat keeps its last-run times (default: celerybeat-schedule here).",
        ),
    ] = None,
) -> None:
    """Start `celery beat` with the router's schedule (the sweeper every sweep_seconds).

    Run exactly one per deployment. Further arguments go to `celery beat` as they are."""
    celery = create_app(Settings())
    argv = ["beat", f"--loglevel={loglevel}"]
    if schedule_file:
        argv.append(f"--schedule={schedule_file}")
    celery.start([*argv, *ctx.args])


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@_one_line_errors
def flower(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(envvar="AGENT_ROUTER_FLOWER_PORT", help="HTTP port.")] = 5555,
    address: Annotated[
        str, typer.Option(envvar="AGENT_ROUTER_FLOWER_ADDRESS", help="Address to listen on.")
    ] = "0.0.0.0",  # a dashboard: put it behind auth (docs/deployment.md)
) -> None:
    """Start Flower (`celery flower`, needs the `flower` package) on the router's broker.

    Further arguments go to `celery flower` as they are (e.g. --basic-auth=user:pass)."""
    celery = create_app(Settings())
    celery.start(["flower", f"--port={port}", f"--address={address}", *ctx.args])


@app.command()
@_one_line_errors
def bench(
    postgres_url: Annotated[
        str | None,
        typer.Option(
            envvar="AGENT_ROUTER_BENCH_POSTGRES_URL",
            help="PostgreSQL for the production figures (its tables are created). "
            "Without it (or --redis-url) only the embedded default is measured.",
        ),
    ] = None,
    redis_url: Annotated[
        str | None,
        typer.Option(envvar="AGENT_ROUTER_BENCH_REDIS_URL", help="Redis: broker and wake keys."),
    ] = None,
    samples: Annotated[
        int, typer.Option(envvar="AGENT_ROUTER_BENCH_SAMPLES", help="Samples per latency figure.")
    ] = 200,
    queued: Annotated[
        int,
        typer.Option(
            envvar="AGENT_ROUTER_BENCH_QUEUED", help="Messages queued for the drain figures."
        ),
    ] = 100_000,
    as_json: Annotated[
        bool,
        typer.Option("--json", envvar="AGENT_ROUTER_JSON", help="A JSON list, one object per row."),
    ] = False,
) -> None:
    """Measure routing, wake, turn start, throughput, burst and drain figures, each beside the
    floor of this machine measured in the same run (see docs/benchmarks.md)."""
    import logging
    import tempfile

    from agent_router.ops import bench as bench_mod

    logging.getLogger("celery").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        rows = bench_mod.run(
            postgres_url=postgres_url,
            redis_url=redis_url,
            sqlite_path=f"{tmp}/bench.db",
            samples=samples,
            queued=queued,
        )
    print(bench_mod.to_json(rows) if as_json else bench_mod.render(rows))


@app.command()
def chaos(
    duration: Annotated[
        float,
        typer.Option(
            envvar="AGENT_ROUTER_CHAOS_DURATION",
            help="Most seconds of chaos (kills) before the team settles.",
        ),
    ] = 600.0,
    sends: Annotated[
        int | None,
        typer.Option(
            envvar="AGENT_ROUTER_CHAOS_SENDS",
            help="Messages each of the 6 agents sends (default: enough for ten minutes).",
        ),
    ] = None,
    asks: Annotated[
        int | None,
        typer.Option(envvar="AGENT_ROUTER_CHAOS_ASKS", help="Asks each of the 6 agents makes."),
    ] = None,
    admin_url: Annotated[
        str,
        typer.Option(
            envvar="AGENT_ROUTER_CHAOS_ADMIN_URL",
            help="PostgreSQL URL allowed to create (and drop) the run's private database.",
        ),
    ] = "postgresql+psycopg://root@127.0.0.1:5432/test",
) -> None:
    """Kill workers, restart Redis and cut database connections while 6 scripted agents talk;
    then check from the database that nothing was lost, duplicated or reordered.

    Prints one summary line and exits non-zero if any bad count is not zero."""
    from dataclasses import replace

    from agent_router.ops.chaos import LONG_PROFILE, run_chaos

    profile = replace(
        LONG_PROFILE,
        duration=duration,
        sends_per_agent=LONG_PROFILE.sends_per_agent if sends is None else sends,
        asks_per_agent=LONG_PROFILE.asks_per_agent if asks is None else asks,
    )
    result = run_chaos(profile, admin_url=admin_url, log=lambda line: print(line, flush=True))
    print(result.recovery_line())
    print(f"questions={result.questions} open_questions={result.open_questions}")
    for violation in result.report.violations[:20]:
        print(f"violation: {violation}")
    print(result.summary())
    raise typer.Exit(0 if result.ok else 1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
