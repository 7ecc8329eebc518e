"""Is everything the router needs there? The database, its schema, the broker, Redis and the model
endpoint, each checked in a few seconds without changing anything.

``agent-router doctor`` prints every check; other commands call the one they need first, so that a
missing piece is one line with a hint instead of a traceback, a hang, or an empty file left
behind."""

from __future__ import annotations

import json
import re
import socket
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from agent_router import errors
from agent_router.settings import Settings

#: Seconds each network check waits before it reports the service unreachable.
CHECK_TIMEOUT = 3.0
#: A table every version of the schema has: its absence means the schema was never created.
SCHEMA_TABLE = "ar_agents"
UPGRADE_HINT = "create it with `agent-router db upgrade --database-url URL`"


class NotReadyError(errors.ConfigurationError):
    """Raised when something the command needs is missing or unreachable."""

    def __init__(self, message: str, *, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class Check:
    """One preflight check: what was checked, whether it passed, and what to do if not."""

    name: str
    ok: bool
    detail: str
    hint: str = ""

    def require(self) -> None:
        """Raise :class:`NotReadyError` unless the check passed."""
        if not self.ok:
            raise NotReadyError(self.detail, hint=self.hint)


def redact(url: str) -> str:
    """``url`` without its password, for messages."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        parts = urllib.parse.urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def sqlite_path(database_url: str) -> Path | None:
    """The file of a SQLite URL; ``None`` for PostgreSQL and in-memory SQLite."""
    url = sa.make_url(database_url)
    if not url.drivername.startswith("sqlite") or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def database(database_url: str) -> Check:
    """The database answers (a SQLite file must exist already: none is created here)."""
    where = redact(database_url)
    try:
        existing_database(database_url)
    except NotReadyError as exc:
        return Check("database", False, str(exc), exc.hint)
    engine = sa.create_engine(database_url, connect_args=_connect_args(database_url))
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.DBAPIError as exc:
        missing = missing_database(str(exc.orig))
        if missing is not None:
            return Check("database", False, *missing)
        reason = one_line(str(exc.orig), MAX_REASON)
        return Check(
            "database",
            False,
            f"cannot connect to the database {where}: {reason}",
            "check --database-url (or AGENT_ROUTER_DATABASE_URL) and that the server runs",
        )
    finally:
        engine.dispose()
    return Check("database", True, f"{where} answers")


#: What PostgreSQL says of a database name it does not have.
_MISSING_DATABASE = re.compile(r'database "([^"]+)" does not exist')


def missing_database(driver_text: str) -> tuple[str, str] | None:
    """What is missing and what creates it, when a driver's error says the server has no
    database of the name connected to (``agent-router db upgrade`` creates the schema in a
    database, not the database); ``None`` for any other error."""
    found = _MISSING_DATABASE.search(driver_text)
    if found is None:
        return None
    name = found.group(1)
    return f"the PostgreSQL server has no database {name!r}", (
        f"create it with `createdb {name}` (or CREATE DATABASE), then its schema with "
        "`agent-router db upgrade --database-url URL`"
    )


def existing_database(database_url: str) -> None:
    """Raise :class:`NotReadyError` if ``database_url`` names a SQLite file that does not exist
    (connecting would create an empty one)."""
    path = sqlite_path(database_url)
    if path is not None and not path.is_file():
        raise NotReadyError(
            f"no database at {path}",
            hint=f"pass --database-url (or AGENT_ROUTER_DATABASE_URL), or {UPGRADE_HINT}",
        )


def schema(database_url: str) -> Check:
    """The router's tables exist (call after :func:`database` passed)."""
    engine = sa.create_engine(database_url, connect_args=_connect_args(database_url))
    try:
        present = sa.inspect(engine).has_table(SCHEMA_TABLE)
    finally:
        engine.dispose()
    if not present:
        return Check(
            "schema",
            False,
            f"the database {redact(database_url)} has no agent-router schema",
            UPGRADE_HINT,
        )
    from agent_router.store import migrate

    # A schema created without migrations (``Router.create_schema``) records no revision.
    revision, wanted = migrate.current(database_url), migrate.head()
    postgresql = database_url.startswith("postgresql")
    # A revision this release does not know is a newer release's, and a newer release's
    # migrations leave a schema this release works on (migrate's rule): on PostgreSQL, where a
    # rolling deploy runs both, this release goes on while its functions are there.
    newer = postgresql and revision is not None and not migrate.is_known(revision)
    if revision is not None and revision != wanted and not newer:
        return Check(
            "schema",
            False,
            f"the database {redact(database_url)} has the agent-router schema at revision "
            f"{revision}; this release's is {wanted}",
            "upgrade it with `agent-router db upgrade --database-url URL` before the workers start",
        )
    return (
        _functions(database_url)
        if postgresql
        else Check("schema", True, "the router's tables exist")
    )


def _functions(database_url: str) -> Check:
    """On PostgreSQL, failed unless the database holds this release's functions (the store's
    transitions); passed, it names the other releases' sets a rolling deploy left, which
    ``agent-router db upgrade --finish`` drops once their workers stopped."""
    from agent_router.store import functions

    engine = sa.create_engine(database_url, connect_args=_connect_args(database_url))
    try:
        with engine.connect() as conn:
            installed = functions.installed(conn)
    finally:
        engine.dispose()
    if functions.version() in installed:
        others = [found for found in installed if found != functions.version()]
        if not others:
            return Check("schema", True, "the router's tables and functions exist")
        return Check(
            "schema",
            True,
            f"the router's tables and functions exist, and the functions of other releases "
            f"({', '.join(others)}): `agent-router db upgrade --finish` drops them once no "
            "worker of theirs runs",
        )
    found = (
        "none of agent-router's functions"
        if not installed
        else f"only other releases' agent-router functions ({', '.join(installed)})"
    )
    return Check(
        "schema",
        False,
        f"the database {redact(database_url)} has {found}, not this release's "
        f"({functions.version()})",
        "install them with `agent-router db upgrade --database-url URL` before the workers start",
    )


def database_ready(database_url: str) -> None:
    """Raise :class:`NotReadyError` unless the database answers and has the schema."""
    database(database_url).require()
    schema(database_url).require()


def broker(broker_url: str) -> Check:
    """The Celery broker accepts a connection (``memory://`` always does, in this process)."""
    from kombu import Connection

    if broker_url.startswith("memory://"):
        return Check("broker", True, "memory:// (in this process only)")
    where = redact(broker_url)
    try:
        with Connection(broker_url, connect_timeout=CHECK_TIMEOUT) as conn:
            conn.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0, timeout=int(CHECK_TIMEOUT)
            )
    except Exception as exc:  # kombu raises each transport's own errors
        return _unreachable(
            "broker",
            f"broker {where}",
            exc,
            "start it, or check --broker-url (or AGENT_ROUTER_BROKER_URL)",
        )
    return Check("broker", True, f"{where} answers")


def redis_server(redis_url: str | None) -> Check:
    """Redis (wake keys of blocked asks) answers a PING; unset means in-process wake signals."""
    if redis_url is None:
        return Check("redis", True, "not configured: wake signals stay in-process")
    import redis

    where = redact(redis_url)
    client = redis.Redis.from_url(
        redis_url, socket_connect_timeout=CHECK_TIMEOUT, socket_timeout=CHECK_TIMEOUT
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        return _unreachable(
            "redis", f"Redis {where}", exc, "start it, or check AGENT_ROUTER_REDIS_URL"
        )
    finally:
        client.close()
    return Check("redis", True, f"{where} answers")


#: Where the base URL of an OpenAI-compatible server is given.
BASE_URL_HINT = "--base-url (or AGENT_ROUTER_OPENAI_BASE_URL)"


def model_endpoint(settings: Settings, *, probe: bool = False, names: Sequence[str] = ()) -> Check:
    """The OpenAI-compatible server accepts a TCP connection; with ``probe``, it also answers
    ``GET {base}/models`` (with the API key, when one is set) as such a server does, and its
    list holds each model of ``names`` (when it lists any)."""
    base = settings.openai_base_url or "https://api.openai.com/v1"
    parts = urllib.parse.urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return Check(
            "model",
            False,
            f"model endpoint {base!r} is not an http(s):// URL",
            f"give the server's base URL, e.g. http://127.0.0.1:8000/v1, with {BASE_URL_HINT}",
        )
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=CHECK_TIMEOUT):
            pass
    except OSError as exc:
        return _unreachable(
            "model", f"model endpoint {base}", exc, f"start the server, or check {BASE_URL_HINT}"
        )
    if not probe:
        return Check("model", True, f"{base} accepts connections")
    return _models_listing(base, settings.openai_api_key, names)


def _models_listing(base: str, api_key: str | None, names: Sequence[str] = ()) -> Check:
    """``GET {base}/models``: what an OpenAI-compatible server answers with its model list."""
    import urllib.error
    import urllib.request

    url = f"{base.rstrip('/')}/models"
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=CHECK_TIMEOUT) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return Check(
                "model",
                False,
                f"{url} refused the API key ({exc.code})",
                "set AGENT_ROUTER_OPENAI_API_KEY (or OPENAI_API_KEY) to a key this server takes",
            )
        return Check(
            "model",
            False,
            f"{url} answered {exc.code}: not the base URL of an OpenAI-compatible server",
            f"give the URL before /chat/completions (often ending in /v1) with {BASE_URL_HINT}",
        )
    except OSError as exc:  # a timeout, a reset, a TLS failure
        return _unreachable("model", f"model endpoint {base}", exc, f"check {BASE_URL_HINT}")
    try:
        models = [m.get("id") for m in json.loads(body)["data"]]
    except (ValueError, KeyError, TypeError, AttributeError):
        return Check(
            "model",
            False,
            f"{url} did not answer with a model list",
            f"point {BASE_URL_HINT} at an OpenAI-compatible server",
        )
    missing = [name for name in names if models and name not in models]
    if missing:
        return Check(
            "model",
            False,
            f"{base} does not list {', '.join(map(repr, missing))}; it lists "
            f"{one_line(', '.join(map(str, models)), MAX_REASON)}",
            "check the model name: --model (or AGENT_ROUTER_OPENAI_MODEL), a role's `model` in "
            "the roles file",
        )
    among = f", {', '.join(names)} among them" if names else ""
    return Check("model", True, f"{base} answers: {len(models)} model(s){among}")


def mcp_servers(settings: Settings) -> Check | None:
    """The MCP servers the roles file (``AGENT_ROUTER_ROLES_FILE``) and
    ``AGENT_ROUTER_MCP_SERVERS`` declare list their tools; ``None`` when none is declared."""
    from agent_router.agents.builder import build

    try:
        tools = build(settings).tools
    except errors.AgentRouterError as exc:
        return Check(
            "mcp", False, _reason(exc), "check the roles file and AGENT_ROUTER_MCP_SERVERS"
        )
    if not tools.servers:
        return None
    problems = tools.unlisted()
    if problems:
        what, why = next(iter(problems.items()))
        return Check(
            "mcp",
            False,
            f"MCP server {what} cannot give its tools: {one_line(why, MAX_REASON)}",
            "check the server's command or URL; `agent-router run --list-tools` shows what each "
            "role gets",
        )
    return Check("mcp", True, f"{len(tools.servers)} MCP server(s) list their tools")


def all_checks(settings: Settings, *, model: bool, models: Sequence[str] = ()) -> list[Check]:
    """Every check, in the order a deployment needs them; the schema only when the database
    answered, the model endpoint (its model list, holding ``models``) only when asked for, the
    MCP servers when some are declared."""
    checks = [database(settings.database_url)]
    if checks[0].ok:
        checks.append(schema(settings.database_url))
    checks.append(broker(settings.broker_url))
    # A Redis broker carries the wake keys too when no other Redis is configured.
    redis_url = settings.redis_url
    if redis_url is None and settings.broker_url.startswith(("redis://", "rediss://")):
        redis_url = settings.broker_url
    checks.append(redis_server(redis_url))
    if model:
        checks.append(model_endpoint(settings, probe=True, names=models))
    mcp = mcp_servers(settings)
    if mcp is not None:
        checks.append(mcp)
    return checks


def _connect_args(database_url: str) -> dict[str, object]:
    if database_url.startswith("sqlite"):
        return {}
    return {"connect_timeout": int(CHECK_TIMEOUT)}


def _unreachable(name: str, service: str, exc: BaseException, hint: str) -> Check:
    """The failed check of a service that did not answer, with the reason the error gave."""
    return Check(name, False, f"{service} unreachable: {_reason(exc)}", hint)


def _reason(exc: BaseException) -> str:
    return one_line(str(exc), MAX_REASON) or type(exc).__name__


#: The longest reason a check quotes from an error.
MAX_REASON = 200


def one_line(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters, cut between words (an ellipsis
    marks the cut)."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    return f"{line[: limit - 1].rsplit(' ', 1)[0]}…"
