"""Commands that run a team: ``demo`` (the scripted routing scenarios) and ``run`` (a task
for a team on an OpenAI-compatible model), each printing the live timeline.

The worker runtime, Celery and the team runners load inside the commands: the other commands
of the CLI (``status``, ``ledger``, ...) start without them."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from agent_router import errors
from agent_router.agents.roles import DEMO_ROLES, ROLES_FILE_ENV, RoleCatalogue
from agent_router.ops import preflight
from agent_router.ops.cli import failures
from agent_router.ops.cli.common import (
    EMBEDDED_CONCURRENCY,
    _one_line_errors,
    _redis_url,
    _render,
    app,
    embedded_worker,
    json_option,
    own_option,
    setting_option,
    switch_option,
)
from agent_router.settings import Settings

if TYPE_CHECKING:
    from agent_router.agents.builder import Built
    from agent_router.agents.toolbox import AgentTools
    from agent_router.ops import team_run
    from agent_router.ops.demo import DemoResult
    from agent_router.worker import runtime


def _print_result(console: Console, result: DemoResult, as_json: bool, final: str | None) -> None:
    """The demo's checks, its verdict and the lead's last answer to the user (``final``)."""
    if as_json:
        for check in result.checks:
            print(json.dumps({"event": "check", "name": check.name, "ok": check.ok,
                              "detail": check.detail}), flush=True)  # fmt: skip
        timed_out = {} if result.timed_out is None else {"timed_out": result.timed_out}
        print(json.dumps({"event": "result", "team_id": result.team_id, "ok": result.ok,
                          "final": final} | timed_out))  # fmt: skip
        return
    console.rule("checks")
    for check in result.checks:
        mark = Text("PASS ", style="bold green") if check.ok else Text("FAIL ", style="bold red")
        console.print(mark + Text(check.name, style="bold") + Text(f"\n      {check.detail}"))
    _print_answer(console, final)
    console.print(Text(result.verdict, style="bold green" if result.ok else "bold red"))


def _print_answer(console: Console, final: str | None) -> None:
    """The lead's last answer to the user, as the user would read it."""
    if final:
        console.print(Text("Team Leader: ", style="bold") + Text(final))


def _print_next_steps(console: Console, what: str, url: str, team_id: int) -> None:
    """The commands that look at the team afterwards, as this shell can run them."""
    console.rule("next")
    console.print(f"the {what}'s database is kept: {url}\nlook at team {team_id} with:")
    cli, where = cli_invocation(), shlex.quote(url)
    for command in (
        f"{cli} status {team_id} --database-url {where}",
        f"{cli} ledger {team_id} --database-url {where}",
        f"{cli} timeline {team_id} -o team.html --database-url {where}",
        f"{cli} web --database-url {where}",
    ):
        console.print(f"  {command}", soft_wrap=True, markup=False)


def cli_invocation() -> str:
    """How to run this CLI again from the same shell and directory: ``agent-router`` when that
    name finds this very program on PATH, else the path it was started by (``./dev demo`` runs
    ``.venv/bin/agent-router``, which is not on PATH), else ``python -m agent_router.ops.cli``."""
    started = Path(sys.argv[0])
    on_path = shutil.which("agent-router")
    if started.name == "agent-router":
        if on_path is not None and Path(on_path).resolve() == started.resolve():
            return "agent-router"
        return shlex.quote(str(started))
    return f"{shlex.quote(sys.executable)} -m agent_router.ops.cli"


# The options `demo` and `run` share.
TimelineJsonOption = Annotated[
    bool, json_option("One JSON object per line instead of the timeline.")
]
EmbeddedWorkersOption = Annotated[
    bool | None,
    switch_option(
        "embedded-workers",
        "AGENT_ROUTER_EMBEDDED_WORKERS",
        "Run worker threads in this process. Default: on for memory://, off otherwise.",
    ),
]


def _in_process(broker_url: str, embedded_workers: bool | None) -> bool:
    """Do the turns run on worker threads of this process? (Always, for ``memory://``.)"""
    memory = broker_url.startswith("memory://")
    in_process = memory if embedded_workers is None else embedded_workers
    if memory and not in_process:
        raise typer.BadParameter("memory:// is only reachable from this process's own workers")
    return in_process


def _timeline_console() -> Console:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    console = Console(highlight=False, stderr=False)
    console.soft_wrap = not console.is_terminal  # in a pipe or a file, a line stays whole
    return console


def _timeline_sink(console: Console, as_json: bool) -> Callable[[dict[str, Any]], None]:
    """Where the ledger tail writes: one JSON line per record, or the rendered timeline."""

    def sink(record: dict[str, Any]) -> None:
        if as_json:
            print(json.dumps(record, default=str), flush=True)
        else:
            _render(console, record)

    return sink


@contextlib.contextmanager
def _team_running(
    rt: runtime.Runtime,
    team_id: int,
    sink: Callable[[dict[str, Any]], None],
    *,
    in_process: bool,
) -> Iterator[None]:
    """The team's ledger tailed into ``sink`` while the body runs, on embedded worker threads
    and the embedded mode's beat (the sweeper on an in-process timer) when ``in_process``."""
    from agent_router.ops.explain import LedgerTail
    from agent_router.worker import runtime
    from agent_router.worker.embedded import SweeperThread

    tail = LedgerTail(rt.router, team_id, sink).start()
    workers = embedded_worker(rt.app, EMBEDDED_CONCURRENCY) if in_process else None
    sweeper = SweeperThread(rt.router) if in_process else contextlib.nullcontext()
    try:
        with workers or contextlib.nullcontext(), sweeper:
            yield
    finally:
        tail.stop()
        runtime.reset()


@app.command()
@_one_line_errors
def demo(
    as_json: TimelineJsonOption = False,
    database_url: Annotated[
        str | None,
        own_option(
            "demo",
            "database_url",
            "Database to run on (its tables are created if missing). Default: "
            "AGENT_ROUTER_DATABASE_URL when set, else a new SQLite file in a temporary "
            "directory, kept for a look afterwards.",
        ),
    ] = None,
    broker_url: Annotated[
        str | None,
        own_option(
            "demo",
            "broker_url",
            "Celery broker. Default: AGENT_ROUTER_BROKER_URL, else memory://, which runs turns "
            "on worker threads of this process; with redis://... start workers separately "
            "(`agent-router worker`, or `celery -A agent_router.celery_app worker`) with the "
            "same AGENT_ROUTER_DATABASE_URL, AGENT_ROUTER_BROKER_URL and AGENT_ROUTER_QUEUE, and "
            "AGENT_ROUTER_ROLES_FILE=demo (the demo's roles).",
        ),
    ] = None,
    embedded_workers: EmbeddedWorkersOption = None,
    timeout: Annotated[
        float, own_option("demo", "timeout", "Seconds to wait for each step.")
    ] = 60.0,
) -> None:
    """Run the demo's team through the routing scenarios and print a live timeline.

    Exits non-zero if a scenario check or a guarantee (check_team) failed."""
    from agent_router.broker import create_app
    from agent_router.ops.demo import run_scenarios, setup_team
    from agent_router.ops.team_run import final_answer
    from agent_router.worker import runtime

    configured = Settings()  # AGENT_ROUTER_* variables, as every other command reads them
    broker_url = broker_url or configured.broker_url
    if database_url is None and "database_url" in configured.model_fields_set:
        database_url = configured.database_url
    in_process = _in_process(broker_url, embedded_workers)
    console = _timeline_console()
    if not broker_url.startswith("memory://"):
        # A broker or Redis that is down would make every publish retry (and the demo hang).
        preflight.broker(broker_url).require()
        preflight.redis_server(_redis_url(broker_url)).require()
    # The database is kept: `status`, `ledger` and `timeline` read it afterwards.
    url = database_url or _kept_sqlite_url("demo")
    settings = Settings(database_url=url, broker_url=broker_url, redis_url=_redis_url(broker_url))
    # The demo's team is a software team: its workers (this process's, and the embedded ones
    # it starts) staff it from the demo's roles unless a roles file is given.
    os.environ.setdefault(ROLES_FILE_ENV, DEMO_ROLES)
    rt = runtime.configure(settings, app=create_app(settings))
    rt.router.create_schema()
    if not as_json:
        where = "threads of this process" if in_process else "separate worker processes"
        console.rule("agent-router demo")
        console.print(f"database {url}\nbroker   {broker_url} (turns run on {where})")
    team = setup_team(rt.router)
    with _team_running(rt, team.team.id, _timeline_sink(console, as_json), in_process=in_process):
        result = run_scenarios(rt.router, team, timeout=timeout)
    _print_result(console, result, as_json, final_answer(rt.router, team.team.id))
    if not as_json:
        _print_next_steps(console, "demo", url, team.team.id)
    raise typer.Exit(0 if result.ok else 1)


def _kept_sqlite_url(what: str) -> str:
    """A new SQLite file in a new temporary directory, left in place for a look afterwards."""
    return f"sqlite:///{Path(tempfile.mkdtemp(prefix=f'agent-router-{what}-')) / f'{what}.db'}"


def _sqlite_dir(url: str) -> Path:
    """The temporary directory of a :func:`_kept_sqlite_url`."""
    return Path(url.removeprefix("sqlite:///")).parent


def _run_settings(
    database_url: str, broker_url: str, model: str | None, base_url: str | None
) -> Settings:
    overrides: dict[str, Any] = {"openai_model": model} if model else {}
    if base_url:
        overrides["openai_base_url"] = base_url
    return Settings(
        database_url=database_url,
        broker_url=broker_url,
        redis_url=_redis_url(broker_url),
        **overrides,
    )


def _check_model(settings: Settings) -> None:
    """Build one model now: a missing key or SDK, or a server that does not answer, fails
    before anything runs."""
    from agent_router.agents.llm import SCRIPTED_MODEL
    from agent_router.agents.openai_model import OpenAIModel

    if not settings.openai_model:
        raise errors.ModelNotConfiguredError(
            "no model to run the team with: pass --model NAME or set AGENT_ROUTER_OPENAI_MODEL"
        )
    if settings.openai_model == SCRIPTED_MODEL:
        return
    OpenAIModel(settings).close()
    preflight.model_endpoint(settings).require()


def _print_run_result(
    console: Console,
    team_id: int,
    result: team_run.RunResult,
    *,
    as_json: bool,
    timeout: float,
    kept: str | None,
) -> None:
    """The run's outcome; ``kept``: the database's URL when it outlives the run."""
    if as_json:
        print(json.dumps({"event": "result", "team_id": team_id, "database": kept,
                          "ok": result.ok,
                          "settled": result.settled, "states": result.states,
                          "failed_turns": result.failed_turns,
                          "expired_questions": result.expired_questions,
                          "waiting_on": result.waiting_on, "reason": result.reason,
                          "final": result.final, "budget_exhausted": result.budget_exhausted,
                          "usage": dataclasses.asdict(result.usage)}))  # fmt: skip
        return
    console.rule("result")
    for name, state in result.states.items():
        console.print(f"{name:<24} {state}")
    for failure in result.failed_turns:
        console.print(Text(f"failed: {failure}", style="bold red"))
    for expired in result.expired_questions:
        console.print(Text(f"expired: {expired}", style="bold red"))
    for wait in result.waiting_on:
        console.print(Text(f"blocked: {wait}", style="yellow"))
    if result.reason:
        console.print(Text(f"stopped: {result.reason}", style="bold red"))
    if not result.settled:
        console.print(Text(f"the team did not settle within {timeout:.0f}s", style="bold red"))
    _print_answer(console, result.final)
    u = result.usage
    console.print(f"usage: {u.model_calls} model calls, {u.total_tokens} tokens, "
                  f"${u.cost_usd:.6f}")  # fmt: skip
    if result.budget_exhausted:
        console.print(Text(f"stopped: the team's {result.budget_exhausted} budget is spent "
                           f"(raise it: agent-router budget {team_id} --help)",
                           style="bold red"))  # fmt: skip
    if kept is not None:
        _print_next_steps(console, "run", kept, team_id)


def _roles(roles: Path | None) -> RoleCatalogue:
    """The roles catalogue of ``--roles`` (or the shipped one); this process's runtime factory
    reads the same file."""
    try:
        catalogue = RoleCatalogue.from_file_or_default(roles)
    except errors.ConfigurationError as exc:
        raise typer.BadParameter(str(exc), param_hint="--roles") from None
    if roles is not None:
        os.environ[ROLES_FILE_ENV] = str(roles)
    return catalogue


# The options of `run`.
ModelOption = Annotated[str | None, setting_option("openai_model", "Model name.")]
BaseUrlOption = Annotated[
    str | None,
    setting_option(
        "openai_base_url",
        "OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1 (default: the SDK's).",
    ),
]
RolesOption = Annotated[
    Path | None,
    typer.Option(
        envvar=ROLES_FILE_ENV,
        help="Roles catalogue (TOML), or `demo` for the demo's software team. Default: the "
        "general-purpose roles shipped with the package.",
    ),
]
RunDatabaseUrlOption = Annotated[
    str | None,
    own_option(
        "run",
        "database_url",
        "Database (tables created if missing). Default: a new SQLite file in a temporary "
        "directory, kept for a look afterwards (unless --no-keep-database).",
    ),
]
KeepDatabaseOption = Annotated[
    bool,
    switch_option(
        "keep-database",
        "AGENT_ROUTER_RUN_KEEP_DATABASE",
        "Keep the default temporary SQLite database after the run, and say where it is "
        "(a --database-url given is never deleted).",
    ),
]
RunBrokerUrlOption = Annotated[
    str,
    own_option(
        "run",
        "broker_url",
        "Celery broker: memory:// (default) runs turns on threads of this process; with "
        "redis://... start workers (`agent-router worker`) with the same AGENT_ROUTER_* "
        "settings, AGENT_ROUTER_OPENAI_MODEL included: they build the same models and tools.",
    ),
]
McpServerOption = Annotated[
    list[str] | None,
    own_option(
        "run",
        "mcp_server",
        "NAME=COMMAND_OR_URL: an MCP server (a command line over stdio, or a streamable "
        "HTTP URL) for every sub-agent role that lists none of its own; repeatable; adds to "
        "AGENT_ROUTER_MCP_SERVERS (its variable holds entries without spaces, separated by "
        "spaces).",
        "--mcp-server",
    ),
]
HostToolsOption = Annotated[
    str | None,
    setting_option(
        "host_tools", "Module(s), comma-separated, whose @host_tool functions become tools."
    ),
]
ListToolsOption = Annotated[
    bool,
    own_option("run", "list_tools", "Print the tools each role gets, and exit.", "--list-tools"),
]
AllowMissingToolsOption = Annotated[
    bool,
    own_option(
        "run",
        "allow_missing_tools",
        "Start even when a declared MCP server cannot be listed (its tools are missing until "
        "it can) or a tool filter names no tool. Default: refuse to start.",
        "--allow-missing-tools",
    ),
]
RunTimeoutOption = Annotated[
    float,
    own_option(
        "run",
        "timeout",
        "Seconds until every agent must be idle or completed. Questions get a deadline "
        "of at most half of it.",
    ),
]


@app.command()
@_one_line_errors
def run(  # noqa: PLR0917 - typer options
    task: Annotated[str | None, typer.Argument(help="The task for the Team Leader.")] = None,
    model: ModelOption = None,
    base_url: BaseUrlOption = None,
    as_json: TimelineJsonOption = False,
    roles: RolesOption = None,
    database_url: RunDatabaseUrlOption = None,
    broker_url: RunBrokerUrlOption = "memory://",
    embedded_workers: EmbeddedWorkersOption = None,
    timeout: RunTimeoutOption = 1800.0,
    mcp_server: McpServerOption = None,
    host_tools: HostToolsOption = None,
    list_tools: ListToolsOption = False,
    allow_missing_tools: AllowMissingToolsOption = False,
    keep_database: KeepDatabaseOption = True,
) -> None:
    """Give TASK to a new team's lead and run the team with an OpenAI-compatible model (API key
    from AGENT_ROUTER_OPENAI_API_KEY or OPENAI_API_KEY) until every agent is idle or completed,
    printing the live timeline. Every agent gets the multi-agent tools; sub-agents also get the
    MCP servers and host functions their role declares (--mcp-server, --host-tools, --roles).
    Stops early, saying what the team waits on, when nothing can make progress. Refuses to start
    (exit 1) when a declared MCP server cannot be listed, unless --allow-missing-tools. Exits 1
    if a turn failed, a question expired unanswered, or the team did not settle, 3 if a team budget
    (AGENT_ROUTER_BUDGET_*) stopped it."""
    from agent_router.broker import create_app
    from agent_router.ops import team_run
    from agent_router.worker import runtime

    in_process = _in_process(broker_url, embedded_workers)
    console = _timeline_console()
    catalogue = _roles(roles)
    built = _built(_model_settings(model, base_url, host_tools), catalogue, mcp_server or [])
    tools = built.tools
    if list_tools:
        raise typer.Exit(0 if team_run.print_tool_listing(tools, catalogue, as_json=as_json) else 1)
    if task is None:
        raise typer.BadParameter("a task is required (or --list-tools)", param_hint="TASK")
    _require_tools(tools, allow_missing=allow_missing_tools)
    with contextlib.ExitStack() as stack:
        url = database_url
        if url is None:
            url = _kept_sqlite_url("run")
            if not keep_database:
                stack.callback(shutil.rmtree, _sqlite_dir(url), ignore_errors=True)
        settings = _run_settings(url, broker_url, model, base_url)
        settings = settings.model_copy(
            update={"question_timeout_seconds": team_run.question_timeout_for(settings, timeout)}
        )
        _check_model(settings)
        rt = runtime.configure(settings, app=create_app(settings), models=built.models, tools=tools)
        rt.router.create_schema()
        team_id = team_run.start_team(rt.router, task, catalogue)
        if not as_json:
            console.rule("agent-router run")
            console.print(
                f"model    {settings.openai_model} at {settings.openai_base_url or 'default'}\n"
                f"database {url}\nbroker   {broker_url}\nteam     {team_id}"
            )
        with _team_running(rt, team_id, _timeline_sink(console, as_json), in_process=in_process):
            progress = team_run.wait_settled(rt.router, team_id, timeout=timeout)
            result = team_run.result_of(rt.router, team_id, progress=progress)
        kept = url if database_url is not None or keep_database else None
        _print_run_result(console, team_id, result, as_json=as_json, timeout=timeout, kept=kept)
    # Exit 3: the team was stopped by a budget (it may go on once the budget is raised).
    raise typer.Exit(3 if result.budget_exhausted else 0 if result.ok else 1)


def _require_tools(tools: AgentTools, *, allow_missing: bool) -> None:
    """Before a team starts: refuse (one line, exit 1) when a declared MCP server cannot give
    its tools; with ``--allow-missing-tools``, a warning per problem and on."""
    from agent_router.ops import team_run

    if not allow_missing:
        team_run.require_tools(tools)
        return
    for what, why in tools.unlisted().items():
        failures.warn(f"MCP server {what} cannot give its tools, going on: {why}")


def _model_settings(model: str | None, base_url: str | None, host_tools: str | None) -> Settings:
    """The settings the run's models and tools are built from: ``--model``, ``--base-url`` and
    ``--host-tools`` over the ``AGENT_ROUTER_*`` variables."""
    overrides = {"openai_model": model, "openai_base_url": base_url, "host_tools": host_tools}
    return Settings().model_copy(update={k: v for k, v in overrides.items() if v})


def _built(settings: Settings, catalogue: RoleCatalogue, servers: list[str]) -> Built:
    from agent_router.agents.builder import build
    from agent_router.agents.tool_config import server_from_option

    for option in servers:  # each --mcp-server alone first: its error names that option only
        try:
            server_from_option(option)
        except errors.ConfigurationError as exc:
            raise typer.BadParameter(str(exc), param_hint="--mcp-server") from None
    try:
        # The team's agents get the multi-agent tools and what their role declares.
        return build(settings, catalogue, server_options=servers)
    except errors.ConfigurationError as exc:
        raise typer.BadParameter(str(exc), param_hint="--mcp-server/--host-tools/--roles") from None
