"""A row of an agent (a message, a question, a turn, an outbox row, a job, a ledger event, a
model call) refers to its agent's ``(id, team_id)``: the database refuses a row whose team is not
its agent's; the hot paths never lock their team's row, so writers of one team do not queue on
it; and a team's deletion, which locks the team and then its agents, never meets a row written
meanwhile."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from agent_router import LedgerAction, MessageType, Router, UnknownAgentError, UnknownTeamError
from agent_router.store.models import Base

from .helpers import assistant, lock_waiters, start_running, tool_call


def test_a_row_whose_team_is_not_its_agents_is_refused(router: Router) -> None:
    team_of: dict[int, int] = {}
    for _ in range(2):
        team = router.create_team()
        team_of[router.create_agent(team.id, role="Engineer").id] = team.id
    first, second = team_of
    statement = sa.text(
        "INSERT INTO ar_outbox (team_id, agent_id, kind, epoch, payload, created_at, attempts)"
        " VALUES (:team, :agent, 'enqueue_turn', 1, '{}', CURRENT_TIMESTAMP, 0)"
    )
    with router.store.engine.begin() as conn:  # the agent's own team: accepted
        conn.execute(statement, {"team": team_of[first], "agent": first})
    with pytest.raises(sa.exc.IntegrityError), router.store.engine.begin() as conn:
        conn.execute(statement, {"team": team_of[second], "agent": first})
    ledger = sa.text(
        "INSERT INTO ar_ledger (team_id, agent_id, action, detail, created_at)"
        " VALUES (:team, :agent, 'route', '{}', CURRENT_TIMESTAMP)"
    )
    with pytest.raises(sa.exc.IntegrityError), router.store.engine.begin() as conn:
        conn.execute(ledger, {"team": team_of[first], "agent": second})


@pytest.mark.postgres
def test_a_teams_writers_never_wait_for_its_row(pg_router: Router) -> None:
    """With the team's row locked ``FOR UPDATE`` elsewhere, a send to an idle agent, its claim
    and drain, a send to a running agent, appends and the turn's end all complete: none of them
    locks the team's row (a foreign key on it would, ``FOR KEY SHARE``). (An ask does: waits
    are created one at a time per team, so that a cycle of waits is seen.)"""
    router = pg_router
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    router.create_agent(team.id, role="Designer")
    start_running(router, team.id, "Designer_1")
    done: list[str] = []
    failed: list[BaseException] = []

    def writers() -> None:
        try:
            router.send(team.id, to="Engineer_1", content="build it", type=MessageType.TASK)
            turn = router.claim_turn(team.id, "Engineer_1")
            assert turn is not None
            turn.drain()
            router.send(team.id, to="Engineer_1", content="and test it", sender="Designer_1")
            turn.append_assistant(assistant(None, tool_call("call-1")))
            turn.append_tool_result("call-1", "built")
            turn.append_assistant(assistant("Built and tested."))
            turn.end()
            done.append("ok")
        except BaseException as exc:  # reported by the test's thread
            failed.append(exc)

    engine = router.store.engine
    with engine.connect() as holder, engine.connect() as watcher:
        holder.execute(sa.text("SELECT id FROM ar_teams WHERE id = :t FOR UPDATE"), {"t": team.id})
        thread = threading.Thread(target=writers)
        thread.start()
        waiting: list[str] = []
        while thread.is_alive() and not waiting:
            waiting = lock_waiters(watcher)
            time.sleep(0.005)
        holder.rollback()  # let a writer that waits go on, so the thread ends
        thread.join(timeout=60)
    assert waiting == [], waiting
    assert not failed, failed
    assert done == ["ok"]


@pytest.mark.postgres
def test_a_send_racing_its_teams_deletion_lands_before_it_or_finds_no_team(
    pg_router: Router,
) -> None:
    """A send to an idle agent and a deletion of its team, released together many times: the
    deletion always succeeds and leaves no row of the team; the send either routed before it
    (its rows deleted with the team) or is refused as unknown. The lead's sends lock the lead's
    row too (the message's sender), which the deletion locks before the target's: a deadlock
    the server breaks is run again, never reported as a commit of unknown outcome."""
    router = pg_router
    for i in range(30):
        sender = "Team Leader" if i % 2 else "user"
        team = router.create_team()
        router.create_agent(team.id, role="Engineer")
        start_running(router, team.id, "Team Leader")
        barrier = threading.Barrier(2)
        results: dict[str, Any] = {}

        def run(
            name: str,
            fn: Callable[[], Any],
            results: dict[str, Any] = results,
            barrier: threading.Barrier = barrier,
        ) -> None:
            barrier.wait()
            time.sleep(random.uniform(0, 0.004))
            try:
                results[name] = fn()
            except (UnknownTeamError, UnknownAgentError) as exc:
                results[name] = exc
            except BaseException as exc:  # any other error fails the test below
                results[name] = ("unexpected", exc)

        threads = [
            threading.Thread(
                target=run,
                args=(
                    "send",
                    lambda t=team.id, s=sender: router.send(
                        t, to="Engineer_1", content="go", sender=s
                    ),
                ),
            ),
            threading.Thread(
                # The team is at work (its lead runs a turn): owed rows, dropped when asked.
                target=run,
                args=("delete", lambda t=team.id: router.delete_team(t, include_undelivered=True)),
            ),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not isinstance(results["delete"], tuple | Exception), results
        assert not isinstance(results["send"], tuple), results
        with router.store.engine.connect() as conn:
            for table in Base.metadata.sorted_tables:
                if "team_id" in table.c:
                    where = table.c.team_id == team.id
                    if table.name == "ar_ledger":  # but the record of what it dropped
                        where = sa.and_(where, table.c.action != LedgerAction.OWED_DROPPED)
                    left = conn.execute(
                        sa.select(sa.func.count()).select_from(table).where(where)
                    ).scalar_one()
                    assert left == 0, (table.name, results)
