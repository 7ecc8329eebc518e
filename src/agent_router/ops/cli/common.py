"""What every ``agent-router`` command shares: the Typer app, settings from options and
environment, one-line errors, the embedded worker."""

from __future__ import annotations

import contextlib
import difflib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from agent_router import errors
from agent_router import validation as check
from agent_router.ops import preflight
from agent_router.ops.cli import failures
from agent_router.router import Router
from agent_router.settings import Settings
from agent_router.store import Store, open_store

if TYPE_CHECKING:
    from celery import Celery

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    help="Durable, receiver-state message routing between LLM agents running as Celery tasks.",
    no_args_is_help=True,
    add_completion=False,
    # Docstrings are Markdown: paragraphs reflow, `code` shows as code, not as raw marks.
    rich_markup_mode="markdown",
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
    """Celery worker threads inside this process, for the ``memory://`` broker
    (:func:`~agent_router.worker.threaded.thread_worker`)."""
    from celery.signals import setup_logging

    from agent_router.worker.threaded import thread_worker

    # A receiver of setup_logging tells Celery to leave logging alone: the CLI's one-line
    # handler (or JSON) stays, instead of Celery's, which prints each failed turn's traceback.
    setup_logging.connect(_keep_cli_logging, weak=False)
    with thread_worker(celery, concurrency=concurrency):
        yield


def _keep_cli_logging(**_: Any) -> None:
    """Receiver of Celery's setup_logging in the CLI's own process: configure nothing."""


def _redis_url(broker_url: str) -> str | None:
    """Wake keys of blocked asks go through Redis whenever the broker is Redis, so that the
    answering and the waiting process need not be the same; else the configured one."""
    if broker_url.startswith(("redis://", "rediss://")):
        return broker_url
    return Settings().redis_url


def _error_line(exc: BaseException) -> str:
    """One line that says what went wrong and what to do, for any error the CLI boundary
    catches."""
    return failures.error_line(exc)


def _one_line_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """The CLI boundary: any error becomes one line on stderr (with a hint) and exit 1;
    ``--traceback`` lets it through whole. Click's own exits and usage errors pass."""
    import click
    import typer.exceptions

    passing = (
        typer.exceptions.Exit,
        typer.exceptions.Abort,
        typer.exceptions.TyperException,
        click.exceptions.Exit,
        click.ClickException,
        click.Abort,
        BrokenPipeError,
    )

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except passing:
            raise
        except Exception as exc:
            if failures.OPTIONS.traceback:
                raise
            failures.report(exc, hint=_refusal_hint(exc, kwargs))
            raise typer.Exit(failures.EXIT_FAILURE) from None

    return wrapper


def _refusal_hint(exc: Exception, arguments: dict[str, Any]) -> str | None:
    """What to do about a refusal of the library, with the team of the command when it names
    one; ``None`` for any other error (:func:`failures.explain` gives its hint)."""
    team = arguments.get("team")
    status = f"`agent-router status {team}`" if isinstance(team, int) else "`agent-router status`"
    if isinstance(exc, errors.UnknownTeamError | errors.UnknownAgentError):
        return _unknown_name_hint(exc, arguments)
    if isinstance(exc, errors.AgentTerminatedError):
        return f"a terminated agent is gone for good; {status} shows which agents are live"
    if isinstance(exc, errors.InvalidMessageError) and "Team Leader cannot be" in str(exc):
        # The lead lives as long as its team.
        where = team if isinstance(team, int) else "TEAM"
        return (
            f"only sub-agents can be; `agent-router team delete {where}` ends the whole team "
            "and `agent-router budget` caps what it may still spend"
        )
    if isinstance(exc, errors.QuestionClosedError | errors.UnknownQuestionError):
        return (
            "only an open question takes an answer: `agent-router status` lists each agent's "
            "open questions (asked) and those it is to answer (answers)"
        )
    if isinstance(exc, errors.WrongQuestionError):
        return "`agent-router status` lists which agent each open question was asked of"
    return None


#: The parameters of the commands that name an agent of a team.
_AGENT_PARAMETERS = ("to", "agent", "name")


def _unknown_name_hint(exc: Exception, arguments: dict[str, Any]) -> str | None:
    """For a team or an agent the database does not have: where to see the names, and the
    agent's name as the team spells it when the one given is close (``team leader``)."""
    if isinstance(exc, errors.UnknownTeamError):
        return "`agent-router status` lists every team and its agents"
    if not isinstance(exc, errors.UnknownAgentError):
        return None
    team = arguments.get("team")
    given = next((v for k in _AGENT_PARAMETERS if isinstance(v := arguments.get(k), str)), None)
    if not isinstance(team, int) or given is None:
        return None
    try:
        with _router(arguments.get("database_url")) as router:
            names = [a.display_name for a in router.agents(team)]
    except Exception:  # the hint is a courtesy: the error line stands without it
        return None
    folded = {name.casefold(): name for name in names}
    close = difflib.get_close_matches(given.casefold(), list(folded), n=1, cutoff=0.6)
    listed = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    # The library's refusal names the agent it was probably meant for, when it found one.
    guessed = close and "did you mean" not in str(exc)
    guess = f"did you mean {folded[close[0]]!r}? " if guessed else ""
    return f"{guess}team {team} has {listed}"


def _settings(database_url: str | None = None, broker_url: str | None = None) -> Settings:
    """Settings from AGENT_ROUTER_* variables, with the URLs given on the command line."""
    given: dict[str, Any] = {"database_url": database_url, "broker_url": broker_url}
    return Settings(**{k: v for k, v in given.items() if v})


@contextlib.contextmanager
def _store(database_url: str | None) -> Iterator[Store]:
    """A store for one read; the pool is closed afterwards."""
    settings = _settings(database_url)
    preflight.existing_database(settings.database_url)
    store = open_store(settings)
    try:
        yield store
    finally:
        store.dispose()


@contextlib.contextmanager
def _router(
    database_url: str | None, ready: Callable[[str], None] | None = None
) -> Iterator[Router]:
    """A Router on the database that publishes nothing, closed afterwards; ``ready``, a
    preflight check, is given the database's URL first. A SQLite file that does not exist is
    an error, not a new empty file."""
    settings = _settings(database_url)
    preflight.existing_database(settings.database_url)
    if ready is not None:
        ready(settings.database_url)
    router = Router(settings)
    try:
        yield router
    finally:
        router.close()


@contextlib.contextmanager
def _acting_router(database_url: str | None, broker_url: str | None) -> Iterator[Router]:
    """A Router that publishes to the configured broker (none for memory://); closed after."""
    # Celery loads here, not at the top: the read-only commands never need it.
    from agent_router.broker import CeleryPublisher, create_app

    settings = _settings(database_url, broker_url)
    preflight.existing_database(settings.database_url)
    celery = None if settings.broker_url.startswith("memory://") else create_app(settings)
    if celery is not None and not (broker := preflight.broker(settings.broker_url)).ok:
        # What the act commits stays in the outbox; every worker's sweeper publishes it.
        failures.warn(
            f"{broker.detail}: nothing is published from here; a worker's sweeper publishes "
            "the turn once the broker is back"
        )
        celery.close()
        celery = None
    router = Router(settings, publisher=CeleryPublisher(celery) if celery else None)
    try:
        yield router
    finally:
        router.close()
        if celery is not None:
            celery.close()


def _render(console: Console, record: dict[str, Any]) -> None:
    """One timeline line; on a terminal the text wraps at word boundaries under itself, in a
    pipe it stays one line (for grep)."""
    style = _OUTCOME_STYLES.get(record["outcome"] or "", _ACTION_STYLES.get(record["action"], ""))
    if console.is_terminal:
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=9, justify="right", style="dim", no_wrap=True)
        grid.add_column(width=21, style="bold", overflow="fold")
        grid.add_column(ratio=1)
        grid.add_row(f"{record['t']:8.3f}s", record["agent"] or "-", Text(record["text"], style))
        console.print(grid)
        return
    line = Text()
    line.append(f"{record['t']:8.3f}s  ", style="dim")
    line.append(f"{record['agent'] or '-':<22} ", style="bold")
    line.append(record["text"], style=style)
    console.print(line, soft_wrap=True)


# Every option of the operating commands is also read from an AGENT_ROUTER_* variable; errors
# are one line on stderr and exit 1 (the `_one_line_errors` boundary), never a traceback.


def json_option(help: str) -> Any:
    """``--json`` (or AGENT_ROUTER_JSON): machine-readable output, as ``help`` says which."""
    return typer.Option("--json", envvar="AGENT_ROUTER_JSON", help=help)


def broker_url_option(help: str) -> Any:
    """``--broker-url`` (or AGENT_ROUTER_BROKER_URL): the broker, in the role ``help`` says."""
    return typer.Option(
        "--broker-url", envvar="AGENT_ROUTER_BROKER_URL", help=help, show_default=False
    )


def switch_option(name: str, envvar: str, help: str) -> Any:
    """A yes/no option given as ``--name`` or ``--no-name``."""
    return typer.Option(f"--{name}/--no-{name}", envvar=envvar, help=help)


def own_option(command: str, name: str, help: str, *flags: str) -> Any:
    """An option of one command only, also read from AGENT_ROUTER_<COMMAND>_<NAME>."""
    return typer.Option(*flags, envvar=f"AGENT_ROUTER_{command}_{name}".upper(), help=help)


def setting_option(field: str, help: str) -> Any:
    """An option that gives one of the :class:`Settings` on the command line: it reads the
    variable that setting is read from."""
    if field not in Settings.model_fields:
        raise ValueError(f"no setting {field!r}")
    return typer.Option(envvar=f"{Settings.model_config['env_prefix']}{field.upper()}", help=help)


def http_port_option(envvar: str) -> Any:
    """The port of a command that serves HTTP."""
    return typer.Option(envvar=envvar, help="HTTP port.")


def team_number(text: str) -> int:
    """A team id as typed: digits, else one line with a hint and exit status 2 (a usage error,
    as Click's are), not Click's usage box."""
    if not text.strip().isdigit():
        failures.report(
            errors.InvalidArgumentError(f"a team id is a number, not {text!r}"),
            hint="`agent-router status` lists every team by its id",
        )
        raise typer.Exit(failures.EXIT_USAGE)
    return int(text)


def _team_id(value: int) -> int:
    """A team id from the command line, checked as the library checks one before anything
    reads the database: an id no team can have (``10**23``) is the same one-line error on
    every database."""
    try:
        return check.row_id(value, "team", errors.UnknownTeamError)
    except errors.AgentRouterError as exc:
        failures.report(exc, hint=_unknown_name_hint(exc, {}))
        raise typer.Exit(failures.EXIT_FAILURE) from None


TeamArgument = Annotated[
    int,
    typer.Argument(
        envvar="AGENT_ROUTER_TEAM",
        help="Team id.",
        parser=team_number,
        callback=_team_id,
        metavar="TEAM",
    ),
]
AgentArgument = Annotated[str, typer.Argument(help="Display name of a sub-agent.")]
DatabaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="AGENT_ROUTER_DATABASE_URL",
        help="SQLAlchemy URL of the router's database.",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, json_option("JSON instead of a table.")]
JsonLinesOption = Annotated[bool, json_option("One JSON object per line.")]
LoglevelOption = Annotated[
    str, typer.Option(envvar="AGENT_ROUTER_LOGLEVEL", help="Celery log level.")
]
BrokerUrlOption = Annotated[
    str | None,
    broker_url_option(
        "Broker the turn tasks go to. memory:// (the default) publishes nothing from here: "
        "the sweeper of any worker on the database publishes the turn within a sweep period."
    ),
]
ReasonOption = Annotated[
    str,
    typer.Option(envvar="AGENT_ROUTER_REASON", help="Recorded in the ledger (and in results)."),
]
