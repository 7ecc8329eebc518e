"""The boundary's limits come from the schema: a column's type decides what reaches it, and a
model's malformed values are made into something the transcript holds and the model can act on.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from agent_router import limits
from agent_router import validation as check
from agent_router.domain import BudgetName
from agent_router.errors import InvalidArgumentError, InvalidTranscriptEntryError
from agent_router.store.models import Base
from agent_router.store.rules import LIMIT_COLUMNS


def test_limits_are_read_back_from_column_types() -> None:
    metadata = sa.MetaData()
    table = sa.Table(
        "t",
        metadata,
        sa.Column("name", sa.String(50)),
        sa.Column("small", sa.Integer),
        sa.Column("big", sa.BigInteger().with_variant(sa.Integer(), "sqlite")),
        sa.Column("body", sa.Text),
        sa.Column("data", sa.JSON),
        sa.Column("ratio", sa.Float),
    )
    found = limits.from_metadata(metadata)
    assert found["t.name"].max_chars == 50 and found["t.name"].kind == "text"
    assert (found["t.small"].minimum, found["t.small"].maximum) == (-(2**31), 2**31 - 1)
    # A variant for SQLite leaves PostgreSQL's type: 64 bits.
    assert found["t.big"].maximum == 2**63 - 1
    assert found["t.body"].kind == "text" and found["t.body"].max_chars is None
    assert found["t.data"].kind == "json" and found["t.ratio"].kind == "float"
    table.append_column(sa.Column("label", sa.String(12)))
    assert limits.from_metadata(metadata)["t.label"].max_chars == 12


#: Each column a value from outside reaches, with the limit the boundary checks it against.
CHECKED = {
    "ar_agents.display_name": ("max_chars", check.MAX_NAME_CHARS),
    "ar_agents.role": ("max_chars", check.MAX_NAME_CHARS),
    "ar_agents.runner": ("max_chars", check.MAX_RUNNER_CHARS),
    "ar_messages.source_name": ("max_chars", check.MAX_NAME_CHARS),
    "ar_messages.dedup_key": ("max_chars", check.MAX_KEY_CHARS),
    "ar_questions.tool_call_id": ("max_chars", check.MAX_KEY_CHARS),
    "ar_transcript_entries.tool_call_id": ("max_chars", check.MAX_KEY_CHARS),
    "ar_background_jobs.name": ("max_chars", check.MAX_JOB_NAME_CHARS + len("job:")),
    "ar_background_jobs.task_id": ("max_chars", check.MAX_KEY_CHARS),
    "ar_model_calls.model": ("max_chars", check.MAX_MODEL_CHARS),
    "ar_teams.id": ("maximum", check.MAX_ID),
    "ar_agents.id": ("maximum", check.MAX_ID),
    "ar_messages.question_id": ("maximum", check.MAX_ID),
    "ar_agents.epoch": ("maximum", check.MAX_INT32),
    "ar_turns.epoch": ("maximum", check.MAX_INT32),
    "ar_messages.seq": ("maximum", check.MAX_INT32),
}


def test_the_schema_holds_what_the_boundary_checks() -> None:
    """Read back from the models' metadata, each column holds exactly the limit its check
    uses: the models build those columns from agent_router.limits, so they cannot drift."""
    schema = limits.from_metadata(Base.metadata)
    for column, (field, limit) in CHECKED.items():
        assert getattr(schema[column], field) == limit, column
    budgets = {name: schema[f"ar_budgets.{column}"] for name, column in LIMIT_COLUMNS.items()}
    for budget, held in budgets.items():
        assert held == limits.limit_of(limits.BUDGET_LIMITS[budget], held.name), budget
    assert budgets[BudgetName.SUB_AGENTS_ACTIVE].maximum == 2**31 - 1
    # A JSON column is JSON on both databases (JSONB on PostgreSQL).
    assert schema["ar_ledger.detail"].kind == "json"


@given(st.text(min_size=1))
def test_a_call_id_always_fits_its_column_and_maps_the_same_way(value: str) -> None:
    mapped = check.call_id(value)
    assert len(mapped) <= check.MAX_KEY_CHARS
    check.key(mapped, "id")  # a key the column and the checks take
    assert check.call_id(value) == mapped
    assert check.call_id(mapped) == mapped


def test_an_id_over_the_column_is_replaced_and_the_same_one_pairs() -> None:
    long_id = "x" * 300
    reply = check.model_reply(
        {
            "role": "assistant",
            "content": "a\x00b",
            "tool_calls": [
                {"id": long_id, "type": "function", "function": {"name": "t", "arguments": "{}"}}
            ],
        },
        max_argument_bytes=1000,
    )
    (call,) = reply["tool_calls"]
    assert call["id"].startswith("call_") and call["id"] == check.call_id(long_id)
    assert call["id"] != check.call_id("x" * 301)
    assert reply["content"] == "a\ufffdb"


def test_arguments_over_the_limit_are_not_kept() -> None:
    big = json.dumps({"text": "y" * 5000})
    reply = check.model_reply(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "t", "arguments": big}},
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "n" * 500, "arguments": "{}"},
                },
            ],
        },
        max_argument_bytes=1000,
    )
    kept, named = reply["tool_calls"]
    arguments = kept["function"]["arguments"]
    assert arguments.startswith(check.ARGUMENTS_NOT_KEPT) and len(arguments) < 400
    assert f"{len(big)} bytes" in arguments
    assert len(named["function"]["name"]) <= check.MAX_NAME_CHARS
    # A reply already kept is kept as it is.
    assert check.model_reply(reply, max_argument_bytes=1000) == reply


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("[" * 100_000 + "]" * 100_000, "nest too deep"),
        ("[" * 100 + "]" * 100, "deeper than 64"),
        ('{"a": ', "not valid JSON"),
    ],
)
def test_json_text_refuses_what_cannot_be_read(raw: str, problem: str) -> None:
    with pytest.raises(InvalidArgumentError, match=problem):
        check.json_text(raw, "the arguments")


def test_json_text_keeps_what_python_cannot_convert() -> None:
    value = check.json_text('{"id": ' + "9" * 5000 + ', "x": 1e400, "s": "a\\u0000"}', "args")
    assert value == {"id": "9" * 5000, "x": "1e400", "s": "a\ufffd"}


def test_a_transcript_entry_too_deep_or_not_finite_is_refused() -> None:
    deep: Any = "x"
    for _ in range(100):
        deep = [deep]
    with pytest.raises(InvalidTranscriptEntryError):
        check.storable({"role": "assistant", "content": deep})
    with pytest.raises(InvalidTranscriptEntryError):
        check.storable({"role": "assistant", "content": "x", "n": float("nan")})


@pytest.mark.parametrize(
    ("limits_", "problem"),
    [
        ({BudgetName.MODEL_CALLS: float("inf")}, "finite"),
        ({BudgetName.MODEL_CALLS: 10**30}, "at most"),
        ({BudgetName.COST: 10**10}, "at most"),  # past 64 bits of nano-dollars
        ({BudgetName.SUB_AGENTS_CREATED: 2**31}, "at most"),  # a 32-bit column
        ({BudgetName.TURNS: 1.5}, "whole"),
        ({BudgetName.TURNS: -1}, "negative"),
        ({BudgetName.WALL_SECONDS: 1e300}, "at most"),
        ({"no such budget": 1}, "unknown budget"),
        ({BudgetName.TURNS: True}, "number"),
    ],
)
def test_budget_limits_fit_their_columns(limits_: dict[Any, Any], problem: str) -> None:
    with pytest.raises(InvalidArgumentError, match=problem):
        check.budget_limits(limits_)


def test_budget_limits_within_their_columns_pass() -> None:
    assert check.budget_limits(
        {"model_calls": 2**63 - 1, BudgetName.COST: 9e9, BudgetName.WALL_SECONDS: None}
    ) == {BudgetName.MODEL_CALLS: 2**63 - 1, BudgetName.COST: 9e9, BudgetName.WALL_SECONDS: None}


def test_ids_of_thousands_of_digits_name_no_row() -> None:
    from agent_router.errors import UnknownTeamError

    with pytest.raises(UnknownTeamError, match="of 16610 bits"):
        check.row_id(10**5000, "team", UnknownTeamError)
    assert check.row_id(42, "team", UnknownTeamError) == 42


def test_what_the_store_writes_on_its_own_account_is_always_storable() -> None:
    deep: Any = []
    for _ in range(10_000):
        deep = [deep]
    detail = {"a": "x\x00", "b": float("inf"), "c": 10**5000, "d": "\ud800", "e": deep, 1: 2}
    stored = limits.storable_json(detail)
    text = json.dumps(stored, allow_nan=False)  # finite numbers only, and not too deep
    assert "\\u0000" not in text
    text.encode("utf-8")
    assert stored["a"] == "x\ufffd" and stored["1"] == 2
    plain = {"sender": "Team Leader", "seq": 3, "wake": True, "reason": None}
    assert limits.storable_json(plain) is plain  # the common event: not copied


def test_a_call_cost_past_the_column_saturates_at_its_range() -> None:
    from agent_router.store.rules import MAX_STORED, NANO, call_cost_nano

    assert MAX_STORED == 2**63 - 1
    assert call_cost_nano(1.5) == 1_500_000_000
    assert call_cost_nano(-1.0) == 0
    for absurd in (MAX_STORED / NANO * 2, float("inf"), float("nan")):
        assert call_cost_nano(absurd) == MAX_STORED
