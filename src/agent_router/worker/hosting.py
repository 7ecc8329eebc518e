"""The router inside a host's processes: its settings read from ``AGENT_ROUTER_*`` variables
never stop the host.

:func:`agent_router.worker.install` runs while a host creates its Celery app, in every one of the
host's processes (its web process, its workers, each ``flask`` or ``manage.py`` command). A
setting that is invalid there, or a database URL that is not set (the embedded default would
create ``agent_router.db`` in the host's working directory), turns the router off in that process
with one log line naming the variable and what it accepts; the host's app, its routes and its
other tasks are untouched. The router's tasks, run in such a process, raise
:class:`~agent_router.errors.RouterDisabledError` with that same line.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from agent_router.errors import RouterDisabledError
from agent_router.settings import Settings

#: The key of a host app's configuration (``app.conf``) that holds why the router is off in this
#: process; absent or empty while it is on.
DISABLED_KEY = "agent_router_disabled"

_OFF = "agent-router is off in this process"
_DATABASE_URL = "AGENT_ROUTER_DATABASE_URL"


def variable(field: str) -> str:
    """The environment variable of a settings field."""
    return f"AGENT_ROUTER_{field.upper()}"


def invalid_setting(exc: ValidationError) -> str:
    """One line for settings that failed to validate: the first variable at fault, why, and what
    it accepts (its description), never its value (a URL may hold a password)."""
    problems = exc.errors()
    first = problems[0]
    field = str(first["loc"][0]) if first["loc"] else ""
    why = str(first["msg"]).removeprefix("Value error, ")
    info = Settings.model_fields.get(field)
    accepted = f"; accepted: {info.description}" if info and info.description else ""
    more = f" ({len(problems) - 1} more invalid)" if len(problems) > 1 else ""
    return f"{variable(field) if field else 'a setting'} is invalid: {why}{more}{accepted}"


def host_settings() -> Settings:
    """The router's settings in a host's process, from ``AGENT_ROUTER_*`` variables.

    Raises :class:`RouterDisabledError` (one line: the variable, what it accepts) when one is
    invalid, or when ``AGENT_ROUTER_DATABASE_URL`` is not set: inside a host the router has no
    database of its own to fall back on (the standalone ``agent-router`` commands keep their
    embedded SQLite default)."""
    try:
        settings = Settings()
    except ValidationError as exc:
        raise RouterDisabledError(f"{_OFF}: {invalid_setting(exc)}") from None
    if "database_url" not in settings.model_fields_set:
        accepted = Settings.model_fields["database_url"].description
        raise RouterDisabledError(f"{_OFF}: {_DATABASE_URL} is not set; accepted: {accepted}")
    return settings


def disabled_reason(app: Any) -> str | None:
    """Why the router is off in this process for ``app`` (a Celery app), or ``None``."""
    if app is None:
        return None
    reason = app.conf.get(DISABLED_KEY)
    return str(reason) if reason else None


def require_enabled(app: Any) -> None:
    """Raise :class:`RouterDisabledError` when :func:`agent_router.worker.install` left the
    router off for ``app`` in this process."""
    reason = disabled_reason(app)
    if reason is not None:
        raise RouterDisabledError(reason)
