"""Log lines carry their context: the ``extra=`` fields rendered into the text by Celery's own
formatter, or every field in one JSON object; the CLI prints one line per record."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from celery.utils.log import ColorFormatter

from agent_router import logfields
from agent_router.ops import logs


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, logging.StreamHandler[io.StringIO]]]:
    logger = logging.getLogger("agent_router.test_logs")
    handler = logging.StreamHandler(io.StringIO())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, handler
    logger.removeHandler(handler)


def route(logger: logging.Logger) -> None:
    logger.info(
        "route",
        extra={"action": "route", "team_id": 3, "agent_id": 7, "outcome": "queued",
               "message_id": 41, "epoch": None, "sender": "UI Operator_1"},
    )  # fmt: skip


def test_celery_formatter_shows_the_context(
    captured: tuple[logging.Logger, logging.StreamHandler[io.StringIO]],
) -> None:
    logger, handler = captured
    handler.setFormatter(ColorFormatter("[%(levelname)s/%(processName)s] %(message)s", False))
    logs.apply(handler, "text")
    logs.apply(handler, "text")  # applying twice renders the fields once
    route(logger)
    line = handler.stream.getvalue().strip()
    assert line == (
        "[INFO/MainProcess] route team_id=3 agent_id=7 action=route outcome=queued "
        'message_id=41 sender="UI Operator_1"'
    )


def test_json_format_has_every_field(
    captured: tuple[logging.Logger, logging.StreamHandler[io.StringIO]],
) -> None:
    logger, handler = captured
    logs.apply(handler, "json")
    route(logger)
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("hook failed", extra={"action": "hook"})
    first, second = map(json.loads, handler.stream.getvalue().splitlines())
    assert first["message"] == "route" and first["level"] == "INFO"
    assert first["team_id"] == 3 and first["outcome"] == "queued" and "epoch" not in first
    assert second["action"] == "hook" and "ValueError: boom" in second["traceback"]


def test_cli_prints_one_line_per_record(
    captured: tuple[logging.Logger, logging.StreamHandler[io.StringIO]],
) -> None:
    logger, handler = captured
    handler.addFilter(logs.ContextFilter())
    handler.setFormatter(logs.OneLineFormatter(traceback=False))
    try:
        raise ConnectionError("broker gone")
    except ConnectionError:
        logger.exception("outbox publish failed", extra={"action": "publish"})
    assert handler.stream.getvalue().splitlines() == [
        "agent-router: error: outbox publish failed action=publish (ConnectionError: broker gone)"
    ]


def test_a_router_logger_renders_its_fields_for_any_handler() -> None:
    logger = logfields.get_logger("agent_router.test_logs.router")
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logging.Formatter("%(message)s"))  # a host's handler, no filter
    logger.addHandler(handler)
    logger.propagate = False
    try:
        route(logger)
        route(logger)
    finally:
        logger.removeHandler(handler)
    line = (
        "route team_id=3 agent_id=7 action=route outcome=queued message_id=41 "
        'sender="UI Operator_1"'
    )
    assert handler.stream.getvalue().splitlines() == [line, line]
