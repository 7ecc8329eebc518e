"""Log lines that say who and what: the ``extra=`` fields the router logs with (team, agent,
outcome, message, turn and question ids) rendered into the text, or every field as one JSON
object per line.

Celery's formatter prints the message alone, so ``logger.info("route", extra={...})`` reads
``route``. :class:`ContextFilter`, put on a handler, appends the fields to the message itself,
so that any formatter (Celery's included) shows them: ``route team_id=3 agent_id=7
outcome=queued message_id=41``. :class:`JsonFormatter` writes ``{"message": "route",
"team_id": 3, ...}`` instead.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, Literal

from agent_router import logfields

LogFormat = Literal["text", "json"]


class ContextFilter(logging.Filter):
    """Appends a record's ``extra=`` fields to its message as ``key=value`` pairs (once, however
    many handlers the record passes): for records of loggers that did not render them already
    (the router's own loggers do, :func:`agent_router.logfields.get_logger`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        logfields.render(record)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, every ``extra=`` field, and
    the traceback (as text) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": getattr(record, "ar_message", None) or record.getMessage(),
            **logfields.context_fields(record),
        }
        task_id = getattr(record, "task_id", None)
        if task_id:
            entry["task_id"] = task_id
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TaskIdFilter(logging.Filter):
    """Adds the id of the Celery task the logging thread runs (``celery_task_id``) to a record
    that has none: the router's own lines of a turn then name the task Flower shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        from celery import current_task

        if getattr(record, "task_id", None) is None and "celery_task_id" not in record.__dict__:
            task_id = current_task.request.id if current_task else None
            if task_id:
                record.celery_task_id = task_id
        return True


def apply(handler: logging.Handler, log_format: LogFormat, *, task_ids: bool = False) -> None:
    """Make ``handler`` write context-rich text (its own formatter kept) or JSON; with
    ``task_ids``, records logged inside a Celery task carry its id."""
    if task_ids and not any(isinstance(f, TaskIdFilter) for f in handler.filters):
        handler.addFilter(TaskIdFilter())  # before the context is rendered into the text
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    elif not any(isinstance(f, ContextFilter) for f in handler.filters):
        handler.addFilter(ContextFilter())


def install_on_celery(log_format: LogFormat) -> None:
    """Apply ``log_format`` to the handlers Celery sets up in a worker or beat process, with
    the running task's id on every record."""
    from celery.signals import after_setup_logger, after_setup_task_logger

    def _setup(logger: logging.Logger, **_: Any) -> None:
        for handler in logger.handlers:
            apply(handler, log_format, task_ids=True)

    after_setup_logger.connect(_setup, weak=False)
    after_setup_task_logger.connect(_setup, weak=False)


class OneLineFormatter(logging.Formatter):
    """What the CLI prints for a log record: ``agent-router: warning: outbox publish failed
    action=publish``, without the traceback (``--traceback`` keeps it)."""

    def __init__(self, *, traceback: bool) -> None:
        super().__init__("agent-router: %(levelname)s: %(message)s")
        self.traceback = traceback

    def format(self, record: logging.LogRecord) -> str:
        record.levelname = record.levelname.lower()
        if self.traceback:
            return super().format(record)
        line = self.formatMessage(_with_message(record))
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            line += f" ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
        return line


def _with_message(record: logging.LogRecord) -> logging.LogRecord:
    record.message = record.getMessage()
    return record


def configure_cli(log_format: LogFormat, *, traceback: bool, level: int = logging.WARNING) -> None:
    """The CLI's own logging: warnings and errors on stderr, one line each (or JSON)."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.addFilter(ContextFilter())
        handler.setFormatter(OneLineFormatter(traceback=traceback))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
