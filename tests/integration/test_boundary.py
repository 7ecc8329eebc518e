"""The one boundary, as a property: random strings (NUL, lone surrogates, thousands of digits),
numbers (beyond 64 bits, infinite, NaN) and JSON (deep, wide, odd keys) given to each
argument of every public entry point (the Router's, a Turn's, the budgets') on SQLite and
PostgreSQL in lockstep. Each call succeeds or raises one typed error (a subclass of
AgentRouterError), the same on both; a refused call leaves every row of the team as it was but
its refusal's ledger event; and after every call both databases hold the same rows."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agent_router import AgentRouterError, MessageType, Router, Settings, Turn, budgeting
from agent_router.domain import BudgetName
from agent_router.outbox import RecordingPublisher

from .helpers import start_running
from .test_conformance import Snapshot, _difference, _outcome

#: Values from outside: what a caller, a command line or a model may hand any argument.
TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40)
INTEGERS = st.integers() | st.integers(min_value=-(2**80), max_value=2**80)
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
ODD = st.sampled_from(
    [
        "Engineer_1",
        "Team Leader",
        "nul\x00byte",
        "\ud800",
        "x" * 201,
        "9" * 5000,
        " ",
        "job:" + "j" * 197,
        "user",
        2**63,
        10**23,
        -1,
        0,
        1,
        float("inf"),
        "[" * 100 + "]" * 100,
    ]
)
JSON = st.recursive(
    st.none() | st.booleans() | INTEGERS | FLOATS | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
VALUES = ODD | TEXT | INTEGERS | FLOATS | JSON | st.binary(max_size=8)


def _deep(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": [value]}
    return value


def _few(count: Any) -> Any:
    """A count to seed a mailbox with: one over 100 is given negated (refused like any negative
    count), so that no example writes millions of rows."""
    return -count if isinstance(count, int) and count > 100 else count


#: Each entry point, with the argument that gets the random value and valid others. An
#: operation gets the router, the team's id, the running turn of Engineer_1 and the value.
Op = Callable[[Router, int, Turn, Any], Any]


def _send(**fixed: Any) -> Callable[[str], Op]:
    def build(field: str) -> Op:
        def op(router: Router, team: int, turn: Turn, value: Any) -> Any:
            kwargs: dict[str, Any] = {"to": "Designer_1", "content": "hi", **fixed}
            kwargs[field] = value
            return router.send(team, **kwargs)

        return op

    return build


send = _send()
answer_send = _send(type=MessageType.ANSWER, question_id=1)

OPERATIONS: dict[str, Op] = {
    "send.team": lambda r, t, turn, v: r.send(v, to="Designer_1", content="hi"),
    "send.to": send("to"),
    "send.content": send("content"),
    "send.sender": send("sender"),
    "send.type": send("type"),
    "send.subtype": send("subtype"),
    "send.question_id": answer_send("question_id"),
    "send.wake": send("wake"),
    "send.dedup_key": send("dedup_key"),
    "send_many.messages": lambda r, t, turn, v: r.send_many(t, v),
    "send_many.one": lambda r, t, turn, v: r.send_many(t, [v]),
    "create_team.budget": lambda r, t, turn, v: r.create_team(budget=v),
    "create_team.lead_system_prompt": lambda r, t, turn, v: r.create_team(lead_system_prompt=v),
    "create_team.lead_runner": lambda r, t, turn, v: r.create_team(lead_runner=v),
    "create_agent.role": lambda r, t, turn, v: r.create_agent(t, role=v),
    "create_agent.display_name": lambda r, t, turn, v: r.create_agent(
        t, role="Tester", display_name=v
    ),
    "create_agent.system_prompt": lambda r, t, turn, v: r.create_agent(
        t, role="Tester", system_prompt=v
    ),
    "create_agent.runner": lambda r, t, turn, v: r.create_agent(t, role="Tester", runner=v),
    "create_agent_with_task.task": lambda r, t, turn, v: r.create_agent_with_task(
        t, role="Tester", task=v
    ),
    "agent.name": lambda r, t, turn, v: r.agent(t, v),
    "transcript.name": lambda r, t, turn, v: r.transcript(t, v),
    "question.id": lambda r, t, turn, v: r.question(v),
    "answer.id": lambda r, t, turn, v: r.answer(v, "yes"),
    "stop.reason": lambda r, t, turn, v: r.stop(t, "Designer_1", reason=v),
    "stop.name": lambda r, t, turn, v: r.stop(t, v, reason="enough"),
    "take_over.reason": lambda r, t, turn, v: r.take_over(t, "Designer_1", reason=v),
    "claim.agent": lambda r, t, turn, v: r.claim(v),
    "claim.epoch": lambda r, t, turn, v: r.claim(turn.agent_id, v),
    "delete_team.team": lambda r, t, turn, v: r.delete_team(v, dry_run=True),
    "delete_team.dry_run": lambda r, t, turn, v: r.delete_team(t, dry_run=v),
    "prune.older_than": lambda r, t, turn, v: r.prune(older_than_seconds=v, dry_run=True),
    "prune.include_undelivered": lambda r, t, turn, v: r.prune(
        older_than_seconds=3600, dry_run=True, include_undelivered=v
    ),
    "prune.ledger_older_than": lambda r, t, turn, v: r.prune(
        older_than_seconds=3600, dry_run=True, ledger_older_than_seconds=v
    ),
    "finish_background.job": lambda r, t, turn, v: r.finish_background(v, ok=True, result="x"),
    "budget.team": lambda r, t, turn, v: r.budget(v),
    "charge_sub_agent.team": lambda r, t, turn, v: r.charge_sub_agent(v, "Tester"),
    "charge_sub_agent.role": lambda r, t, turn, v: r.charge_sub_agent(t, v),
    "seed_mailbox.agent": lambda r, t, turn, v: r.seed_mailbox(v, 1, content="queued"),
    "seed_mailbox.count": lambda r, t, turn, v: r.seed_mailbox(
        turn.agent_id, _few(v), content="queued"
    ),
    "seed_mailbox.content": lambda r, t, turn, v: r.seed_mailbox(turn.agent_id, 1, content=v),
    "seed_mailbox.sender": lambda r, t, turn, v: r.seed_mailbox(
        turn.agent_id, 1, content="queued", sender=v
    ),
    "set_limits.limits": lambda r, t, turn, v: budgeting.set_limits(r, t, v, by="operator"),
    "set_limits.model_calls": lambda r, t, turn, v: budgeting.set_limits(
        r, t, {BudgetName.MODEL_CALLS: v}, by="operator"
    ),
    "set_limits.by": lambda r, t, turn, v: budgeting.set_limits(r, t, {}, by=v),
    "turn.append_assistant": lambda r, t, turn, v: turn.append_assistant(
        {"role": "assistant", "content": v}
    ),
    "turn.append_assistant.message": lambda r, t, turn, v: turn.append_assistant(v),
    "turn.append_tool_result.id": lambda r, t, turn, v: turn.append_tool_result(v, "result"),
    "turn.append_tool_result.content": lambda r, t, turn, v: turn.append_tool_result("c1", v),
    "turn.ask.target": lambda r, t, turn, v: turn.ask(v, "which?", tool_call_id="c1"),
    "turn.ask.question": lambda r, t, turn, v: turn.ask("Team Leader", v, tool_call_id="c1"),
    "turn.ask.tool_call_id": lambda r, t, turn, v: turn.ask(
        "Team Leader", "which?", tool_call_id=v
    ),
    "turn.ask.timeout": lambda r, t, turn, v: turn.ask(
        "Team Leader", "which?", tool_call_id="c1", timeout_seconds=v
    ),
    "turn.record_usage.model": lambda r, t, turn, v: turn.record_usage(
        model=v, prompt_tokens=1, completion_tokens=1
    ),
    "turn.record_usage.tokens": lambda r, t, turn, v: turn.record_usage(
        model="m", prompt_tokens=v, completion_tokens=1
    ),
}


class Side:
    """One database: a router, a team with Engineer_1 running a turn, Designer_1 idle."""

    def __init__(self, url: str) -> None:
        self.router = Router(
            Settings(database_url=url, max_content_bytes=4096, work_seconds=0),
            publisher=RecordingPublisher(),
        )
        self.router.create_schema()
        self.team = self.router.create_team().id
        self.router.create_agent(self.team, role="Engineer")
        self.router.create_agent(self.team, role="Designer")
        self.turn = start_running(self.router, self.team, "Engineer_1")

    def attempt(self, op: Op, value: Any) -> Any:
        """What the call returned, or the typed error it raised (anything else fails the
        test); a refused call left the team's rows as they were but for refusal events."""
        before = _unrefused(Snapshot(self.router.store.engine, self.team))
        try:
            return op(self.router, self.team, self.turn, value)
        except AgentRouterError as exc:
            after = _unrefused(Snapshot(self.router.store.engine, self.team))
            for table in before:
                assert before[table] == after[table], _difference(
                    table, before[table], after[table]
                )
            return exc


def _unrefused(snapshot: Snapshot) -> dict[str, list[dict[str, Any]]]:
    """The team's rows, without the ledger events of refusals (a refusal writes only one)."""
    tables = dict(snapshot.tables)
    tables["ar_ledger"] = [
        row
        for row in tables["ar_ledger"]
        if not str(row["action"]).endswith(("refused", "rejected"))
    ]
    return tables


@pytest.fixture
def sides(tmp_path: Path, own_pg_schema_url: str) -> Iterator[tuple[Side, Side]]:
    pair = (Side(f"sqlite:///{tmp_path / 'boundary.db'}"), Side(own_pg_schema_url))
    yield pair
    for side in pair:
        side.router.close()


@hsettings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_entry_point_succeeds_or_raises_one_typed_error_alike(
    sides: tuple[Side, Side], data: st.DataObject
) -> None:
    name = data.draw(st.sampled_from(sorted(OPERATIONS)), label="entry point")
    value = data.draw(VALUES | st.just(_deep(100)), label="value")
    # Keep the team to test on: a team id that is the team's own is not given to delete.
    assume(not (name == "delete_team.team" and value == sides[0].team))
    op = OPERATIONS[name]
    outcomes = [side.attempt(op, value) for side in sides]
    # A refusal's fields name rows by id: compared by their rank in each database's rows.
    snapshots = [Snapshot(side.router.store.engine, side.team) for side in sides]
    sqlite, postgresql = (_outcome(o, s) for o, s in zip(outcomes, snapshots, strict=True))
    assert _typed(sqlite) == _typed(postgresql), (name, value, sqlite, postgresql)
    failed = isinstance(outcomes[0], AgentRouterError)
    event(f"{name}: {type(outcomes[0]).__name__ if failed else 'ok'}")
    rows = [snapshot.tables for snapshot in snapshots]
    for table in rows[0]:
        assert rows[0][table] == rows[1][table], _difference(table, rows[0][table], rows[1][table])


def _typed(outcome: Any) -> Any:
    """An outcome as both databases must agree on it: an error by its type, a result whole
    (a float by its value, NaN included)."""
    if isinstance(outcome, tuple) and len(outcome) == 2 and isinstance(outcome[1], str):
        return outcome[0]
    if isinstance(outcome, float) and math.isnan(outcome):
        return "nan"
    return outcome
