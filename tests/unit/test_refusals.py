"""The table of refusals: every code a store function or a SQLite transition refuses with is in
it, and each renders one line from its fields."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent_router import errors
from agent_router.store import refusals

STORE = Path(refusals.__file__).parent
SQL = "\n".join(p.read_text() for p in sorted((STORE / "postgresql").glob("*.sql")))
PYTHON = "\n".join(p.read_text() for p in sorted(STORE.glob("*.py")))

#: Fields as a refusal may carry them, the texts with what a one-line message must escape.
FIELDS = {
    "team_id": 3,
    "agent_id": 4,
    "message_id": 5,
    "question_id": 6,
    "turn_id": 7,
    "job_id": 8,
    "epoch": 2,
    "name": "Eng\nineer",
    "close": "Engineer_1",
    "done": "terminated",
    "sender": "Bob\r",
    "dedup_key": "key\n2",
    "target": "Designer_1",
    "status": "answered",
    "cycle": ["Team Leader", "Engineer_1", "Team Leader"],
    "verb": "ask",
    "state": "idle",
    "call": "call\u2028 1",
    "calls": ["call\n1", "call 2"],
    "runner": "host.task",
    "operation": "drain",
    "budget": "sub_agents_active",
    "limit": 2,
    "used": 2,
    "task_id": "task\n1",
    "owed": {"current_transcripts": 1, "undelivered_messages": 2},
}


@pytest.mark.parametrize("code", sorted(refusals.CODES))
def test_every_code_renders_one_line_and_is_its_error(code: str) -> None:
    error = refusals.error(code, **FIELDS)
    assert isinstance(error, refusals.CODES[code].error)
    assert error.code == code and error.fields == FIELDS
    assert len(str(error).splitlines()) == 1
    assert str(error) == refusals.sentence({"refused": code, "fields": FIELDS})


@pytest.mark.parametrize("code", sorted(refusals.CODES))
def test_every_code_is_refused_on_both_databases(code: str) -> None:
    assert f"'{code}'" in SQL
    assert f'"{code}"' in PYTHON.replace(f'"{code}": Refusal(', "")


def test_every_code_the_store_refuses_with_is_in_the_table() -> None:
    in_sql = set(re.findall(r"ar__refused\([^,]+,\s*'(\w+)'", SQL))
    in_python = set(re.findall(r'refusals\.error\(\s*"(\w+)"', PYTHON))
    assert in_sql and in_python
    assert (in_sql | in_python) <= set(refusals.CODES)


def test_an_unknown_code_is_the_databases_error_and_an_old_event_keeps_its_message() -> None:
    assert type(refusals.error("no_such_code", team_id=1)) is errors.StoreError
    assert refusals.sentence({"message": "no agent 'X' in team 1"}) == "no agent 'X' in team 1"
    assert refusals.sentence({"reason": "unknown_target"}) is None


def test_the_errors_that_take_fields_get_them() -> None:
    asked = refusals.error("cycle", target="Engineer_1", cycle=["A", "B", "A"], verb="ask")
    assert isinstance(asked, errors.AskRefusedError) and asked.cycle == ["A", "B", "A"]
    assert str(asked) == "this ask would deadlock: A -> B -> A"
    spent = refusals.error("sub_agents_spent", budget="sub_agents_created", limit=3, used=3)
    assert isinstance(spent, errors.BudgetExhaustedError) and spent.budget == "sub_agents_created"
    assert str(spent) == "the team's budget of 3 sub-agents created is spent (3): no new sub-agent"
    host = refusals.error("host_owned", runner="host.task")
    assert isinstance(host, errors.HostOwnedTurnError) and host.runner == "host.task"


def test_a_team_that_owes_rows_lists_them_in_one_order_on_both_databases() -> None:
    """PostgreSQL returns the kinds as a JSON object (its keys in an order of its own): the
    message lists them in the lifecycle's order whatever order they came in."""
    from agent_router.store import lifecycle

    assert refusals.OWED_KINDS == lifecycle.OWED
    owed = refusals.error(
        "owed_rows", team_id=3, owed={"open_questions": 1, "undelivered_messages": 2}
    )
    assert isinstance(owed, errors.OwedRowsError) and owed.owed == {
        "open_questions": 1,
        "undelivered_messages": 2,
    }
    assert str(owed).startswith("team 3 still owes 2 undelivered messages, 1 open questions;")
