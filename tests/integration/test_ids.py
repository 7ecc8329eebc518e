"""An id is never given twice, on either database: after teams are deleted or pruned (the rows
with the largest ids among them), every new row's id is above every id its table ever gave. A
deleted team's ledger events never name a new team, and a new message to the user never
carries the id of one a host already saw."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_router import Router, Settings
from agent_router.domain import LedgerAction
from agent_router.outbox import RecordingPublisher

#: Every table whose id the database gives.
TABLES = (
    "ar_teams",
    "ar_agents",
    "ar_messages",
    "ar_user_messages",
    "ar_questions",
    "ar_turns",
    "ar_transcript_entries",
    "ar_outbox",
    "ar_background_jobs",
    "ar_ledger",
    "ar_model_calls",
)
LEAD = "Team Leader"
#: The tables a busy team (:func:`_busy_team`) writes to.
BUSY = (
    "ar_teams",
    "ar_agents",
    "ar_messages",
    "ar_user_messages",
    "ar_turns",
    "ar_transcript_entries",
    "ar_outbox",
    "ar_ledger",
)


@pytest.fixture(params=("sqlite", "postgresql"))
def own_router(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Router]:
    """A router on a database of the test's own: a prune deletes every finished team in it."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ids.db'}"
    else:
        url = str(request.getfixturevalue("own_pg_schema_url"))
    router = Router(Settings(database_url=url), publisher=RecordingPublisher())
    router.create_schema()
    yield router
    router.close()


def _ids(router: Router) -> dict[str, set[int]]:
    with router.store.engine.connect() as conn:
        return {
            table: set(conn.execute(sa.text(f"SELECT id FROM {table}")).scalars())
            for table in TABLES
        }


def _busy_team(router: Router) -> int:
    """A team with rows in the tables of :data:`BUSY`."""
    team = router.create_team(lead_system_prompt="You lead.")
    router.create_agent(team.id, role="Engineer")
    router.send(team.id, to=LEAD, content="plan it")
    turn = router.claim_turn(team.id, LEAD)
    assert turn is not None
    turn.drain()
    router.tell_user(turn, "on it")
    router.send(team.id, to="Engineer_1", content="build it", sender=LEAD)
    return team.id


def test_a_new_team_never_gets_the_ids_of_a_deleted_one(own_router: Router) -> None:
    """The newest team deleted (it owed mail, a running turn): the next team's rows all get
    new ids, its ledger holds none of the deleted team's events, and its message to the user
    has an id no host saw before."""
    router = own_router
    first = _busy_team(router)
    before = _ids(router)
    old_message = router.user_messages(first)[-1].id
    router.delete_team(first, include_undelivered=True)
    second = _busy_team(router)
    after = _ids(router)
    for table in BUSY:
        new = after[table] - before[table]
        assert new and min(new) > max(before[table]), table
    assert second > first
    assert [m.id for m in router.user_messages(second)] == [
        max(after["ar_user_messages"] - before["ar_user_messages"])
    ]
    assert router.user_messages(second)[0].id > old_message
    actions = [event.action for event in router.ledger(second)]
    assert LedgerAction.OWED_DROPPED not in actions
    assert actions[0] is LedgerAction.TEAM_CREATED
    # The deleted team's event stays its own: the second team's deletion keeps it.
    router.delete_team(second, include_undelivered=True)
    with router.store.engine.connect() as conn:
        kept = conn.execute(
            sa.text("SELECT team_id FROM ar_ledger WHERE action = 'owed_dropped'")
        ).scalars()
        assert sorted(kept) == [first, second]


OPS = ("team", "agent", "send", "user", "delete_newest", "delete_oldest", "prune")


def test_ids_only_grow_over_any_creates_and_deletes(own_router: Router) -> None:
    """Random runs of creating teams, agents, messages and messages to the user, deleting the
    newest or the oldest team and pruning: after every step, each id that appeared is above
    every id its table gave before (the database persists from one run to the next)."""
    router = own_router
    given_max = {table: max(ids, default=0) for table, ids in _ids(router).items()}
    teams: list[int] = []

    def step(op: str) -> None:
        if op == "team" or not teams:
            teams.append(router.create_team().id)
        elif op == "agent":
            router.create_agent(teams[-1], role="Engineer")
        elif op == "send":
            router.send(teams[0], to=LEAD, content="note")
        elif op == "user":
            router.send(teams[-1], to=LEAD, content="say something")
            turn = router.claim_turn(teams[-1], LEAD)
            if turn is not None:
                turn.drain()
                router.tell_user(turn, "progress")
                turn.end()
        elif op in ("delete_newest", "delete_oldest"):
            team = teams.pop(-1 if op == "delete_newest" else 0)
            router.delete_team(team, include_undelivered=True)
        else:
            pruned = router.prune(older_than_seconds=0, include_undelivered=True)
            teams[:] = [t for t in teams if t not in pruned.teams]

    @settings(
        max_examples=int(os.environ.get("AGENT_ROUTER_HYPOTHESIS_EXAMPLES", "10")),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(st.lists(st.sampled_from(OPS), min_size=1, max_size=12))
    def run(ops: list[str]) -> None:
        present = _ids(router)
        for op in ops:
            step(op)
            now = _ids(router)
            given_again = {
                table: sorted(i for i in now[table] - present[table] if i <= given_max[table])
                for table in TABLES
            }
            for table in TABLES:
                given_max[table] = max(given_max[table], max(now[table], default=0))
            present = now
            assert not any(given_again.values()), (op, given_again)

    run()
