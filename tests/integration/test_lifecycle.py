"""Storage lifecycle on both backends: deleting a team removes every row it owns and its wake
keys, fences its queued and running turns, and leaves other teams untouched; ``prune`` removes
finished teams and old published outbox rows, and a dry run counts exactly what a real run
deletes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from agent_router import (
    AgentState,
    LedgerAction,
    MessageType,
    OwedRowsError,
    Router,
    Settings,
    StaleTurnError,
    UnknownAgentError,
    UnknownTeamError,
)
from agent_router.constants import wake_key
from agent_router.domain import BudgetName
from agent_router.outbox import RecordingPublisher
from agent_router.store.models import Base
from agent_router.waker import RedisWaker

from .helpers import assistant, start_running, start_waiting, tool_call


@pytest.fixture(params=["sqlite", "postgresql"])
def own_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of the test's own: a prune sees every team in it."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lifecycle.db'}"
    return str(request.getfixturevalue("fresh_pg_url"))


@pytest.fixture
def router(own_database: str, redis_url: str) -> Iterator[Router]:
    r = Router(
        Settings(database_url=own_database, work_seconds=0),
        publisher=RecordingPublisher(),
        waker=RedisWaker(redis_url),
    )
    r.create_schema()
    yield r
    r.close()


def _rows(router: Router) -> dict[str, int]:
    with router.store.engine.connect() as conn:
        return {
            t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in Base.metadata.sorted_tables
        }


def _busy_team(router: Router) -> tuple[int, int, Any]:
    """A team with a blocked ask (open question, wake key), a running turn, pending mail and a
    scheduled agent: returns the team, the scheduled agent's id and the running turn."""
    team = router.create_team()
    for role in ("Engineer", "Designer", "Writer"):
        router.create_agent(team.id, role=role)
    start_waiting(router, team.id, "Engineer_1", "Team Leader")
    (question,) = [m.question_id for m in router.messages(team.id) if m.question_id]
    assert question is not None
    router.waker.notify(question, "left")  # a wake key left in Redis
    running = start_running(router, team.id, "Designer_1")
    router.send(team.id, to="Writer_1", content="draft it", type=MessageType.TASK)
    return team.id, router.agent(team.id, "Writer_1").id, running


def test_deleting_a_team_removes_everything_it_owns_and_nothing_else(
    router: Router, redis_url: str
) -> None:
    other = router.create_team()
    router.create_agent(other.id, role="Engineer")
    router.send(other.id, to="Engineer_1", content="keep me")
    kept = (router.messages(other.id), router.agents(other.id), router.ledger(other.id))
    before = _rows(router)
    team_id, scheduled_id, running = _busy_team(router)
    (question,) = {m.question_id for m in router.messages(team_id) if m.question_id}
    assert question is not None

    # The team still owes: pending mail, an open question, turns at work. Refused as it is.
    with pytest.raises(OwedRowsError) as refused:
        router.delete_team(team_id)
    assert refused.value.owed == {
        "undelivered_messages": 2,  # the ask to the lead, the task to Writer_1
        "open_questions": 1,
        "current_transcripts": 4,  # the lead asked, the asker, the runner, the scheduled
    }
    assert router.team(team_id).id == team_id  # nothing deleted

    dry = router.delete_team(team_id, dry_run=True, include_undelivered=True)
    assert dry.dry_run and dry.teams == (team_id,) and dry.total > 10
    assert dry.owed == refused.value.owed
    assert router.team(team_id).id == team_id  # nothing deleted

    deletion = router.delete_team(team_id, include_undelivered=True)
    assert deletion.rows == dry.rows and deletion.questions == (question,)
    # Every row of the team is gone, the other team's stay; what it owed is ledgered.
    (dropped,) = router.ledger(team_id)
    assert dropped.action is LedgerAction.OWED_DROPPED and dropped.agent_id is None
    assert dropped.detail["owed"] == refused.value.owed
    listed = [(m["to"], m["content"]) for m in dropped.detail["messages"]]
    assert len(listed) == 2 and ("Writer_1", "draft it") in listed
    assert dropped.detail["questions"] == [question]
    assert _rows(router) == {**before, "ar_ledger": before["ar_ledger"] + 1}
    assert (router.messages(other.id), router.agents(other.id), router.ledger(other.id)) == kept
    client = redis.Redis.from_url(redis_url)
    assert not client.exists(wake_key(question))
    client.close()
    with pytest.raises(UnknownTeamError):
        router.team(team_id)
    with pytest.raises(UnknownAgentError):  # a queued turn task claims nothing
        router.claim(scheduled_id)
    with pytest.raises(StaleTurnError):  # a running turn writes nothing more
        running.append_assistant(assistant("still here?"))
    with pytest.raises(UnknownTeamError):
        router.delete_team(team_id)


def test_prune_removes_finished_teams_and_published_outbox_rows(router: Router) -> None:
    finished = router.create_team()
    router.create_agent(finished.id, role="Engineer")
    turn = start_running(router, finished.id, "Engineer_1")
    turn.append_assistant(assistant(None, tool_call("c1")))
    turn.append_tool_result("c1", "done")
    turn.append_assistant(assistant("all done"))
    turn.end()
    assert router.agent(finished.id, "Engineer_1").state is AgentState.COMPLETED
    busy_id, _, _ = _busy_team(router)
    router.publish_outbox(RecordingPublisher())
    outbox_before = len(router.outbox(busy_id))

    dry = router.prune(older_than_seconds=0, dry_run=True)
    assert dry.teams == (finished.id,)
    assert router.team(finished.id).id == finished.id  # a dry run deletes nothing
    pruned = router.prune(older_than_seconds=0)
    assert pruned.teams == dry.teams and pruned.rows == dry.rows
    with pytest.raises(UnknownTeamError):
        router.team(finished.id)
    assert router.agent(busy_id, "Designer_1").state is AgentState.RUNNING  # kept
    assert len(router.outbox(busy_id)) < outbox_before  # its published rows went
    assert router.prune(older_than_seconds=3600).total == 0  # nothing that old left


def test_repeated_refusals_share_one_ledger_row(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    ledger = len(router.ledger(team.id))
    for _ in range(5):
        with pytest.raises(UnknownAgentError):
            router.send(team.id, to="Nobody_1", content="hello?")
    with pytest.raises(UnknownAgentError):  # another receiver: a row of its own
        router.send(team.id, to="Nobody_2", content="hello?")
    rows = router.ledger(team.id)[ledger:]
    assert [(e.detail["to"], e.detail.get("repeats", 1)) for e in rows] == [
        ("Nobody_1", 5),
        ("Nobody_2", 1),
    ]


# ---------------------------------------------------------------------------- what is owed


def _resting_team(router: Router) -> int:
    """A team whose every agent rests: its lead, and Engineer_1 that ended a turn."""
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    turn = start_running(router, team.id, "Engineer_1")
    turn.append_assistant(assistant("done"))
    turn.end()
    return team.id


def _owed_kept_then_dropped(router: Router, team_id: int, owed: dict[str, int]) -> None:
    """A prune keeps the team and says so; a prune that includes the undelivered drops it and
    ledgers what it owed, in an event that outlives the team."""
    finished = _resting_team(router)  # owes nothing: pruned either way
    pruned = router.prune(older_than_seconds=0)
    assert pruned.teams == (finished,) and pruned.kept == (team_id,) and pruned.owed == {}
    assert router.team(team_id).id == team_id
    with pytest.raises(OwedRowsError) as refused:
        router.delete_team(team_id)
    assert refused.value.owed == owed
    dry = router.prune(older_than_seconds=0, include_undelivered=True, dry_run=True)
    assert (dry.teams, dry.owed) == ((team_id,), owed)
    assert router.team(team_id).id == team_id
    dropped = router.prune(older_than_seconds=0, include_undelivered=True)
    assert (dropped.teams, dropped.owed, dropped.kept) == ((team_id,), owed, ())
    with pytest.raises(UnknownTeamError):
        router.team(team_id)
    (event,) = router.ledger(team_id)
    assert event.action is LedgerAction.OWED_DROPPED
    assert (event.detail["by"], event.detail["owed"]) == ("prune", owed)


def test_prune_keeps_the_unread_task_of_a_stopped_agent(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    router.send(team.id, to="Engineer_1", content="the task", type=MessageType.TASK)
    router.stop(team.id, "Engineer_1", reason="not now")  # idle, its mailbox kept
    assert router.agent(team.id, "Engineer_1").state is AgentState.IDLE
    _owed_kept_then_dropped(router, team.id, {"undelivered_messages": 1})
    (event,) = router.ledger(team.id)
    assert [m["content"] for m in event.detail["messages"]] == ["the task"]


def test_prune_keeps_a_note_a_resting_agent_has_not_read(router: Router) -> None:
    team_id = _resting_team(router)
    router.send(team_id, to="Engineer_1", content="for later", wake=False)
    assert router.agent(team_id, "Engineer_1").state is AgentState.COMPLETED
    _owed_kept_then_dropped(router, team_id, {"undelivered_messages": 1})


def test_prune_keeps_a_team_waiting_for_its_budget_to_be_raised(router: Router) -> None:
    team = router.create_team(budget={BudgetName.TURNS: 0})
    router.send(team.id, to="Team Leader", content="go", type=MessageType.TASK)
    assert router.claim_turn(team.id, "Team Leader") is None  # the budget stops it at once
    assert router.store.budget(team.id).exhausted is BudgetName.TURNS
    _owed_kept_then_dropped(router, team.id, {"undelivered_messages": 1, "spent_budget": 1})


def test_prune_keeps_an_outbox_row_never_published(router: Router) -> None:
    team_id = _resting_team(router)
    publisher, router.publisher = router.publisher, None
    router.send(team_id, to="Engineer_1", content="again")  # its turn task never published
    router.publisher = publisher
    router.terminate(team_id, "Engineer_1", reason="gone")  # the mail is dropped, the row stays
    _owed_kept_then_dropped(router, team_id, {"unpublished_outbox": 1})


def test_prune_never_takes_a_team_at_work_nor_its_open_question(router: Router) -> None:
    """An open question has its asker waiting, and a turn at work writes its transcript: such
    a team is not finished, so no prune takes it, not even one that drops what is owed."""
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    start_waiting(router, team.id, "Engineer_1", "Team Leader")
    for include in (False, True):
        pruned = router.prune(older_than_seconds=0, include_undelivered=include)
        assert team.id not in pruned.teams
    assert router.agent(team.id, "Engineer_1").state is AgentState.WAITING
    with pytest.raises(OwedRowsError) as refused:
        router.delete_team(team.id)
    assert refused.value.owed["open_questions"] == 1
    assert refused.value.owed["current_transcripts"] >= 1


def _age_ledger(router: Router, days: float) -> None:
    """Move every ledger event ``days`` into the past."""
    from datetime import timedelta

    from agent_router.store.models import LedgerRow

    with router.store.engine.begin() as conn:
        for event_id, created_at in conn.execute(sa.select(LedgerRow.id, LedgerRow.created_at)):
            conn.execute(
                sa.update(LedgerRow)
                .where(LedgerRow.id == event_id)
                .values(created_at=created_at - timedelta(days))
            )


def test_ledger_retention_deletes_routine_events_of_a_live_team_and_keeps_what_check_reads(
    router: Router,
) -> None:
    from agent_router.ops.checks import check_team
    from agent_router.ops.timeline import team_timeline
    from agent_router.store.lifecycle import ROUTINE_LEDGER
    from agent_router.sweeper import sweep

    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    for n in range(3):  # routine work: routes, claims, drains, appends, ends
        turn = start_running(router, team.id, "Engineer_1", content=f"task {n}")
        turn.append_assistant(assistant(f"done {n}"))
        turn.end()
    failed = start_running(router, team.id, "Engineer_1", content="the failing one")
    failed.append_assistant(assistant("trying"))
    failed.end(failed=True, error="the model went away")
    with pytest.raises(UnknownAgentError):
        router.send(team.id, to="Nobody_1", content="lost", sender="Engineer_1")
    report = check_team(router, team.id, quiescent=True)
    assert report.failures and not report.violations
    _age_ledger(router, 10)
    router.send(team.id, to="Engineer_1", content="fresh", sender="user")  # a recent event
    before = router.ledger(team.id)

    dry = router.prune(
        older_than_seconds=30 * 86400, ledger_older_than_seconds=5 * 86400, dry_run=True
    )
    assert router.ledger(team.id) == before  # a dry run deletes nothing
    pruned = router.prune(older_than_seconds=30 * 86400, ledger_older_than_seconds=5 * 86400)
    assert dry.teams == pruned.teams == ()  # the team is live
    after = router.ledger(team.id)
    assert pruned.rows["ar_ledger"] == dry.rows["ar_ledger"] == len(before) - len(after) > 0
    # Left: the rare events, the failed turn's end, and the recent send's route.
    assert before[-1] in after
    for event in after[:-1]:
        assert event.action not in ROUTINE_LEDGER or (
            event.action is LedgerAction.TURN_ENDED and event.detail.get("failed")
        ), event
    kept = {e.action for e in after}
    assert {LedgerAction.TEAM_CREATED, LedgerAction.SEND_REJECTED} <= kept
    again = check_team(router, team.id)
    assert (again.failures, again.violations) == (report.failures, report.violations)
    assert team_timeline(router, team.id)  # still reads

    # The sweeper deletes a batch per pass once ledger_retention_days is set.
    _age_ledger(router, 10)
    keeping = Router(
        router.settings.model_copy(update={"ledger_retention_days": 5.0}),
        publisher=RecordingPublisher(),
        waker=router.waker,
    )
    try:
        assert sweep(keeping).ledger_pruned == 1  # the recent send's route, now old
        assert sweep(keeping).ledger_pruned == 0
    finally:
        keeping.store.dispose()
    assert len(router.ledger(team.id)) == len(after) - 1


def _age_team(router: Router, team_id: int, days: float) -> None:
    """Move the team's rows ``days`` into the past: when each was created, started, ended,
    consumed, closed or published (not its deadlines and leases, which stay ahead)."""
    from datetime import timedelta

    past = {"created_at", "started_at", "ended_at", "consumed_at", "closed_at", "published_at"}
    tables = Base.metadata.tables
    agents = sa.select(tables["ar_agents"].c.id).where(tables["ar_agents"].c.team_id == team_id)
    with router.store.engine.begin() as conn:
        for table in Base.metadata.sorted_tables:
            clocks = [c for c in table.c if c.name in past]
            if not clocks or table.name == "ar_budgets":
                continue
            if table.name == "ar_teams":
                where = table.c.id == team_id
            elif "team_id" in table.c:
                where = table.c.team_id == team_id
            elif "agent_id" in table.c:
                where = table.c.agent_id.in_(agents)
            else:
                continue
            keys = list(table.primary_key.columns)
            for row in conn.execute(sa.select(*keys, *clocks).where(where)).mappings().all():
                moved = {
                    c.name: row[c.name] - timedelta(days) for c in clocks if row[c.name] is not None
                }
                if moved:
                    match = sa.and_(*(k == row[k.name] for k in keys))
                    conn.execute(sa.update(table).where(match).values(moved))


def test_prune_keeps_a_team_active_within_its_window_after_ledger_retention(
    router: Router,
) -> None:
    """Ledger retention deletes a live team's routine events; prune still sees the team's
    recent turn and message, and keeps it. A team idle for as long is pruned."""
    idle = _resting_team(router)
    _age_team(router, idle, 8)
    active = _resting_team(router)
    _age_team(router, active, 8)  # created 8 days ago...
    turn = start_running(router, active, "Engineer_1", content="one more thing")  # ...active now
    turn.append_assistant(assistant("done"))
    turn.end()
    _age_ledger(router, 3)  # every event 3 days old: retention of 2 days deletes the routine ones
    assert router.store.prune_ledger(older_than_seconds=2 * 86400) > 0
    assert all(e.created_at < turn.record.started_at for e in router.ledger(active))
    pruned = router.prune(older_than_seconds=6 * 86400)
    assert pruned.teams == (idle,)
    assert router.team(active).id == active
    assert [m.content for m in router.messages(active)][-1] == "one more thing"


@pytest.mark.slow
def test_prune_beside_live_sends_keeps_every_team_a_send_reached(router: Router) -> None:
    """A prune running while senders reach old, finished teams never fails for a team that
    became owed meanwhile, and never deletes a team holding a message it accepted: a send is
    either refused (its team was deleted first) or its message is there after the prune."""
    import threading

    from agent_router import AgentRouterError

    teams = [_resting_team(router) for _ in range(40)]
    for team_id in teams:
        _age_team(router, team_id, 2)
    accepted: list[tuple[int, int]] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def send() -> None:
        for team_id in teams:
            try:
                d = router.send(team_id, to="Engineer_1", content="late", wake=False)
            except AgentRouterError:
                continue  # the team was pruned before the send: refused, nothing half-written
            accepted.append((team_id, d.message_id))
        done.set()

    def prune() -> None:
        try:
            while not done.is_set():
                router.prune(older_than_seconds=86400)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=send), threading.Thread(target=prune)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    router.prune(older_than_seconds=86400)
    for team_id, message_id in accepted:
        assert message_id in {m.id for m in router.messages(team_id)}


def test_prune_keeps_a_team_a_send_reached_between_its_choice_and_its_lock(
    router: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race made certain: a send commits right after the prune chose the team and before
    it locks it. The prune keeps the team (in ``kept``) and the message, and fails nothing.
    (On SQLite a prune's transaction holds the write lock from its start, so no send can
    commit in between; the send then comes after the prune.)"""
    team_id = _resting_team(router)
    _age_team(router, team_id, 2)
    if router.store.engine.dialect.name == "postgresql":
        pruned, sent = _prune_held_at_the_team_lock(router, team_id)
        assert pruned.teams == () and pruned.kept == (team_id,)
        assert sent in {m.id for m in router.messages(team_id)}
        return

    import threading

    from agent_router.store import lifecycle

    choose = lifecycle.finished_teams
    threads: list[threading.Thread] = []

    def chosen_then_sent(*args: Any, **kwargs: Any) -> tuple[list[int], list[int]]:
        result = choose(*args, **kwargs)
        if team_id in result[0] and not threads:

            def send() -> None:
                with pytest.raises(UnknownTeamError):  # the prune deleted the team first
                    router.send(team_id, to="Engineer_1", content="just in time", wake=False)

            threads.append(threading.Thread(target=send))
            threads[0].start()  # waits for the prune's write lock
        return result

    monkeypatch.setattr(lifecycle, "finished_teams", chosen_then_sent)
    pruned = router.prune(older_than_seconds=86400)
    for thread in threads:
        thread.join()
    assert threads and pruned.teams == (team_id,)  # pruned first; the send then found no team
    with pytest.raises(UnknownTeamError):
        router.team(team_id)


def _prune_held_at_the_team_lock(router: Router, team_id: int) -> tuple[Any, int]:
    """On PostgreSQL a prune's batch chooses its teams and locks them in one call: another
    connection holds the team's row (a lock a send's foreign keys do not wait for), so the
    prune chooses the team and waits at its lock; a send commits meanwhile, then the row is
    let go. The prune's result and the message sent."""
    import threading
    import time

    result: list[Any] = []
    with router.store.engine.connect() as holder:
        holder.execute(
            sa.text("SELECT 1 FROM ar_teams WHERE id = :t FOR NO KEY UPDATE"), {"t": team_id}
        )
        prune = threading.Thread(
            target=lambda: result.append(router.prune(older_than_seconds=86400))
        )
        prune.start()
        with router.store.engine.connect() as watch:
            for _ in range(500):  # until the prune waits for the team's row
                waiting = watch.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    )
                ).scalar_one()
                if waiting:
                    break
                time.sleep(0.01)
            assert waiting, "the prune never waited for the team's row"
        sent = router.send(team_id, to="Engineer_1", content="just in time", wake=False)
        holder.rollback()
    prune.join()
    return result[0], sent.message_id
