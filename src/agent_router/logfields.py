"""The router's log records say who and what in their message: team, agent, turn, outcome.

The router logs with ``extra={...}`` (``team_id``, ``agent``, ``agent_id``, ``turn_id``,
``outcome``...). A host's formatter prints the message alone (Celery's does), so a record
logged as ``route`` would read ``route`` in a host's worker. Every logger of the package is made
by :func:`get_logger`, which puts :class:`FieldsInMessage` on the logger itself: the fields are
appended to the message as ``key=value`` pairs before any handler sees the record, whatever
handlers and formatters the host configured (``route team_id=3 agent_id=7 outcome=queued
message_id=41``). The message as logged stays on the record as ``ar_message`` for formatters
that show the fields apart (``agent_router.ops.logs.JsonFormatter``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from typing import Any

#: Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    {*logging.LogRecord("", 0, "", 0, "", None, None).__dict__}
    | {"message", "asctime", "taskName", "ar_message"}
)
#: Celery adds these to task log records; they are in its own format already.
_CELERY = frozenset({"data", "task_name", "task_id"})
#: Fields shown first, in this order; the rest follow alphabetically.
_ORDER = (
    "team_id",
    "agent",
    "agent_id",
    "celery_task_id",
    "action",
    "outcome",
    "message_id",
    "turn_id",
    "question_id",
    "epoch",
)


def context_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra=`` fields of a record that are set (not ``None``), the known ones first."""
    fields = {
        k: v
        for k, v in record.__dict__.items()
        if k not in _STANDARD and k not in _CELERY and not k.startswith("_") and v is not None
    }
    ordered = {k: fields.pop(k) for k in _ORDER if k in fields}
    return ordered | dict(sorted(fields.items()))


def _text(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if not text or any(c.isspace() for c in text) else text


def render(record: logging.LogRecord) -> None:
    """Append the record's fields to its message (once: a rendered record is left alone), and
    keep the message as logged in ``record.ar_message``."""
    if "ar_message" in record.__dict__:
        return
    _add_task_id(record)
    message = record.getMessage()
    record.ar_message = message
    fields = context_fields(record)
    if fields:
        record.msg = f"{message} {' '.join(f'{k}={_text(v)}' for k, v in fields.items())}"
        record.args = None


def _add_task_id(record: logging.LogRecord) -> None:
    """The id of the Celery task the logging thread runs, as ``celery_task_id``, on a record
    that has none (the one Flower shows). Only where Celery is loaded already: a record never
    imports it."""
    if "celery" not in sys.modules or "celery_task_id" in record.__dict__:
        return
    if getattr(record, "task_id", None) is not None:
        return
    from celery import current_task

    task_id = current_task.request.id if current_task else None
    if task_id:
        record.celery_task_id = task_id


class FieldsInMessage(logging.Filter):
    """Renders a record's ``extra=`` fields into its message (:func:`render`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        # A message its arguments do not fit is left as it is, for the handler to report as
        # logging reports any such record: a log call never raises.
        with contextlib.suppress(Exception):
            render(record)
        return True


_FILTER = FieldsInMessage()


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with :class:`FieldsInMessage` on it: what the router's
    modules log with."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
