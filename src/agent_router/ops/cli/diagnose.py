"""Options every command takes (``--traceback``, ``--log-format``) and the commands that say what
is wrong with a deployment: ``doctor``, ``db current``, ``db history``."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.text import Text

from agent_router.ops import logs, preflight
from agent_router.ops.cli import failures
from agent_router.ops.cli.acts import db_app
from agent_router.ops.cli.common import (
    BrokerUrlOption,
    DatabaseUrlOption,
    JsonOption,
    _one_line_errors,
    _settings,
    app,
    setting_option,
    switch_option,
)

if TYPE_CHECKING:
    from agent_router.settings import Settings


@app.callback()
def main_options(
    traceback: Annotated[
        bool,
        typer.Option(
            "--traceback",
            envvar="AGENT_ROUTER_TRACEBACK",
            help="On failure print the whole traceback instead of one line.",
        ),
    ] = False,
    log_format: Annotated[
        str,
        typer.Option(
            "--log-format",
            envvar="AGENT_ROUTER_LOG_FORMAT",
            help="Log lines on stderr: text (one line each, with their ids) or json.",
        ),
    ] = "text",
) -> None:
    """Durable, receiver-state message routing between LLM agents running as Celery tasks."""
    failures.OPTIONS.traceback = failures.OPTIONS.traceback or traceback
    if log_format not in ("text", "json"):
        raise typer.BadParameter("text or json", param_hint="--log-format")
    # What the command starts reads it too: a worker (and its supervised child), beat.
    os.environ["AGENT_ROUTER_LOG_FORMAT"] = log_format
    logs.configure_cli("json" if log_format == "json" else "text", traceback=traceback)


@app.command()
def doctor(  # noqa: PLR0917 - typer options
    database_url: DatabaseUrlOption = None,
    broker_url: BrokerUrlOption = None,
    check_model: Annotated[
        bool,
        switch_option(
            "check-model",
            "AGENT_ROUTER_DOCTOR_MODEL",
            "Check the model endpoint (AGENT_ROUTER_OPENAI_BASE_URL) even when no model is "
            "configured: it lists its models.",
        ),
    ] = False,
    as_json: JsonOption = False,
    base_url: Annotated[
        str | None,
        setting_option(
            "openai_base_url",
            "The model endpoint to check (implies the model check), e.g. http://127.0.0.1:8000/v1.",
        ),
    ] = None,
    model: Annotated[
        str | None,
        setting_option(
            "openai_model",
            "The model to check (implies the model check): the endpoint must list it.",
        ),
    ] = None,
) -> None:
    """Check the database, its schema, the broker, Redis, the model endpoint and the MCP
    servers, as this configuration sees them: the endpoint when a model is configured
    (AGENT_ROUTER_OPENAI_MODEL, a role's model, --model) or asked for, its model list holding
    each such model; the MCP servers of the roles file and AGENT_ROUTER_MCP_SERVERS list their
    tools. Exits 1 if any check failed."""
    try:
        settings = _settings(database_url, broker_url)
        overrides = {"openai_base_url": base_url, "openai_model": model}
        settings = settings.model_copy(update={k: v for k, v in overrides.items() if v})
        names = _model_names(settings)
        check_model = check_model or bool(base_url or names)
    except Exception as exc:
        failures.report(exc)
        raise typer.Exit(failures.EXIT_FAILURE) from None
    checks = preflight.all_checks(settings, model=check_model, models=names)
    console = Console(highlight=False)
    for check in checks:
        if as_json:
            print(json.dumps({"check": check.name, "ok": check.ok, "detail": check.detail,
                              "hint": check.hint or None}))  # fmt: skip
            continue
        style = "bold green" if check.ok else "bold red"
        line = Text("ok   " if check.ok else "FAIL ", style=style)
        line.append(f"{check.name:<9}", style="bold")
        line.append(check.detail)
        if not check.ok and check.hint:
            line.append(f" (hint: {check.hint})", style="yellow")
        console.print(line, soft_wrap=True)
    raise typer.Exit(0 if all(c.ok for c in checks) else failures.EXIT_FAILURE)


def _model_names(settings: Settings) -> list[str]:
    """The models this configuration's workers call (the setting's, each role's)."""
    from agent_router.agents.builder import AgentModels
    from agent_router.agents.roles import roles_from_env

    return [e.model for e in AgentModels(settings, roles_from_env()).endpoints()]


@db_app.command("current")
@_one_line_errors
def db_current(database_url: DatabaseUrlOption = None) -> None:
    """Print the database's schema revision, and whether it is this release's head."""
    from agent_router.store import migrate

    settings = _settings(database_url)
    preflight.existing_database(settings.database_url)
    revision, head = migrate.current(settings.database_url), migrate.head()
    if revision is None:
        print("none: the database has no agent-router schema "
              "(`agent-router db upgrade` creates it)")  # fmt: skip
    elif revision == head:
        print(f"{revision} (head)")
    else:
        print(f"{revision} (this release's head is {head}: `agent-router db upgrade`)")


@db_app.command("history")
@_one_line_errors
def db_history(
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", "-v", envvar="AGENT_ROUTER_VERBOSE", help="Each revision in full."
        ),
    ] = False,
) -> None:
    """List the schema revisions this version of agent-router ships, newest first."""
    from alembic import command

    from agent_router.store import migrate

    # The history is the package's scripts: no database is read.
    command.history(migrate.alembic_config("sqlite://"), verbose=verbose)
    sys.stdout.flush()
