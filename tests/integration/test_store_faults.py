"""Database faults reach the caller as the library's own errors: a connection lost during
COMMIT is "commit unknown" (distinct from a refusal and from a plain store error), and a retry
with the same dedup key is safe. The PostgreSQL backend of the transaction is really
terminated, from a second connection, at the moment named."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection

from agent_router import (
    CommitUnknownError,
    MessageType,
    QuestionClosedError,
    RefusedError,
    RouteOutcome,
    Router,
    Settings,
    StaleTurnError,
    StoreError,
)
from agent_router.domain import BudgetName, OutboxKind
from agent_router.outbox import RecordingPublisher

from ..conftest import PG_ADMIN_URL
from .helpers import assistant, start_running, tool_call, until_lock_waiters


@pytest.fixture
def pg_router(pg_schema_url: str) -> Iterator[Router]:
    router = Router(Settings(database_url=pg_schema_url))
    yield router
    router.close()


def _terminate_own_backend(connection: Connection) -> None:
    _terminate(connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


def _signal_backend(function: str, pid: int) -> None:
    """Call ``function`` (pg_terminate_backend, pg_cancel_backend) on the backend ``pid``, from
    a connection of its own."""
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"SELECT {function}(:pid)"), {"pid": pid})
    admin.dispose()


def _terminate(pid: int) -> None:
    """Terminate the backend ``pid``: its connection is lost."""
    _signal_backend("pg_terminate_backend", pid)


@contextmanager
def _cutting(router: Router, wanted: Callable[[str, Any], bool]) -> Iterator[list[int]]:
    """Meanwhile, the connection's backend is terminated before the first statement the router
    sends that ``wanted(statement, dbapi_connection)`` picks; the list yielded gets its pid."""
    cut: list[int] = []

    def listener(conn: Connection, _cursor: Any, statement: str, *_: Any) -> None:
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        if not cut and wanted(statement, dbapi):
            cut.append(dbapi.info.backend_pid)
            _terminate(cut[0])

    event.listen(router.store.engine, "before_cursor_execute", listener)
    try:
        yield cut
    finally:
        event.remove(router.store.engine, "before_cursor_execute", listener)


def test_the_error_hierarchy_keeps_unknown_apart_from_refused() -> None:
    assert issubclass(CommitUnknownError, StoreError)
    assert not issubclass(StoreError, RefusedError)
    assert not issubclass(CommitUnknownError, RefusedError)


def test_a_pooled_connection_lost_while_idle_is_replaced_and_the_send_commits_once(
    pg_router: Router,
) -> None:
    """A connection the server closed while it sat in the pool (a restart, an idle timeout,
    an operator) is found before anything is sent on it: the send runs on another and commits
    once."""
    team = pg_router.create_team()
    pg_router.create_agent(team.id, role="Engineer")
    with pg_router.store.engine.connect() as conn:  # the pool's one idle connection
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    _terminate(pid)
    time.sleep(0.2)  # the server's goodbye reaches the client's socket
    delivery = pg_router.send(team.id, to="Engineer_1", content="deploy")
    assert [m.id for m in pg_router.messages(team.id)] == [delivery.message_id]


def test_a_database_that_cannot_be_reached_is_a_retryable_store_error() -> None:
    """Nothing is sent when no connection can be made: a retryable StoreError, never "commit
    unknown", after the store's own runs again."""
    router = Router(Settings(database_url="postgresql+psycopg://root@127.0.0.1:1/none"))
    try:
        with pytest.raises(StoreError) as caught:
            router.send(1, to="Engineer_1", content="deploy")
    finally:
        router.close()
    assert caught.value.retryable and not isinstance(caught.value, CommitUnknownError)


def test_a_publish_mark_lost_after_a_committed_send_is_not_the_senders_error(
    pg_schema_url: str,
) -> None:
    """The send committed and its turn task went out; the connection that marks the outbox row
    published is then cut. The sender gets its delivery, not an error (its turn went on), and
    the row stays unpublished for the sweeper to send again (every turn task is fenced)."""
    publisher = RecordingPublisher()
    router = Router(Settings(database_url=pg_schema_url), publisher=publisher)
    team = router.create_team()
    with _cutting(router, lambda statement, _: statement.startswith("UPDATE ar_outbox")) as cut:
        delivery = router.send(team.id, to="Team Leader", content="go")
    try:
        assert cut and delivery.outcome is RouteOutcome.TRIGGERED_NEW_TURN
        assert [e.kind for e in publisher.entries] == [OutboxKind.ENQUEUE_TURN]
        ours = publisher.entries[0].id
        router.publish_outbox()  # still unpublished: sent again
        assert [e.id for e in publisher.entries].count(ours) == 2
    finally:
        router.close()


def _cancel(pid: int) -> None:
    """Cancel the statement the backend ``pid`` runs, as a statement_timeout does."""
    _signal_backend("pg_cancel_backend", pid)


def _cut_while_blocked(
    router: Router, agent_id: int, call: Callable[[], Any], cut: Callable[[int], None] = _terminate
) -> BaseException:
    """Run ``call`` in a thread while another transaction holds the agent's row locked, so
    that the call, its own transaction, waits for that lock inside the database;
    ``cut`` the waiting backend (terminate it), then release the lock. The error ``call``
    raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # the test asserts which
            raised.append(exc)

    holder = sa.create_engine(router.settings.database_url)
    try:
        with holder.connect() as conn:
            conn.execute(
                sa.text("SELECT 1 FROM ar_agents WHERE id = :id FOR UPDATE"), {"id": agent_id}
            )
            thread = threading.Thread(target=run)
            thread.start()
            waiting: list[int] = []
            for _ in range(500):
                # pg_stat_activity is read once per transaction unless its snapshot is cleared.
                conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
                waiting = list(
                    conn.execute(
                        sa.text(
                            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                            " AND wait_event_type = 'Lock' AND query LIKE 'SELECT ar\\_%'"
                        )
                    ).scalars()
                )
                if waiting:
                    break
                time.sleep(0.01)
            assert len(waiting) == 1, "the call never waited for the lock"
            cut(waiting[0])
            conn.rollback()
            thread.join(30)
    finally:
        holder.dispose()
    assert not thread.is_alive() and len(raised) == 1
    return raised[0]


def test_a_connection_lost_during_a_send_is_commit_unknown(pg_router: Router) -> None:
    """A send is one call of its function in autocommit: its commit is the call's own, so a
    connection lost during it leaves the outcome unknown (never a silent
    repeat that could deliver twice). Here the backend is cut while the call waits for the
    receiver's lock: nothing was written, and the sender's retry delivers once."""
    team = pg_router.create_team()
    agent = pg_router.create_agent(team.id, role="Engineer")
    error = _cut_while_blocked(
        pg_router, agent.id, lambda: pg_router.send(team.id, to="Engineer_1", content="deploy")
    )
    assert isinstance(error, CommitUnknownError)
    assert pg_router.messages(team.id) == []
    delivery = pg_router.send(team.id, to="Engineer_1", content="deploy")
    assert [m.id for m in pg_router.messages(team.id)] == [delivery.message_id]


def test_a_connection_lost_during_the_claim_is_commit_unknown(pg_router: Router) -> None:
    """A claim is one call in autocommit: a connection lost during it leaves unknown whether
    the turn was claimed (a claimed turn the worker never learnt of is taken over when its
    lease lapses). Here the backend is cut while the call waits for the agent's lock: nothing
    was written, and the worker's retry claims the turn once."""
    team = pg_router.create_team()
    agent = pg_router.create_agent(team.id, role="Engineer")
    pg_router.send(team.id, to="Engineer_1", content="deploy", sender="user")
    error = _cut_while_blocked(pg_router, agent.id, lambda: pg_router.claim(agent.id))
    assert isinstance(error, CommitUnknownError)
    assert pg_router.agent(team.id, "Engineer_1").state.value == "scheduled"
    assert pg_router.store.reads.turns(agent.id) == []
    turn = pg_router.claim(agent.id)
    assert turn is not None
    assert [t.id for t in pg_router.store.reads.turns(agent.id)] == [turn.record.id]
    assert pg_router.store.budget(team.id).used[BudgetName.TURNS] == 1


def test_a_connection_lost_during_the_answer_is_commit_unknown(pg_router: Router) -> None:
    """An answer to the agent blocked on its question is one call in autocommit: a connection
    lost during it is CommitUnknownError. Here the backend is cut while the
    call waits for the asker's lock: nothing was written, the asker still waits, and the
    answer sent again resolves the wait once; sent a third time it finds the question closed."""
    team = pg_router.create_team()
    agent = pg_router.create_agent(team.id, role="Engineer")
    turn = start_running(pg_router, team.id, "Engineer_1")
    turn.append_assistant(assistant(None, tool_call("ask-1", "ask_master")))
    question = turn.ask("Team Leader", "which auth module?", tool_call_id="ask-1").id
    answer: dict[str, Any] = {
        "to": "Engineer_1",
        "content": "the OAuth one",
        "sender": "Team Leader",
        "type": MessageType.ANSWER,
        "question_id": question,
    }
    error = _cut_while_blocked(pg_router, agent.id, lambda: pg_router.send(team.id, **answer))
    assert isinstance(error, CommitUnknownError)
    assert pg_router.agent(team.id, "Engineer_1").state.value == "waiting"
    delivery = pg_router.send(team.id, **answer)
    assert delivery.outcome.value == "resolved"
    with pytest.raises(QuestionClosedError):
        pg_router.send(team.id, **answer)
    answers = [m.id for m in pg_router.messages(team.id) if m.type is MessageType.ANSWER]
    assert answers == [delivery.message_id]


def test_a_connection_lost_during_the_end_is_commit_unknown(pg_router: Router) -> None:
    """The end of a turn is one call in autocommit: a connection lost during it is
    CommitUnknownError. Here the backend is cut while the call waits for the agent's lock:
    nothing was written, the turn still runs, and the end sent again ends it once; sent a
    third time it is refused as stale."""
    team = pg_router.create_team()
    agent = pg_router.create_agent(team.id, role="Engineer")
    turn = start_running(pg_router, team.id, "Engineer_1")
    turn.append_assistant(assistant("done"))
    error = _cut_while_blocked(pg_router, agent.id, turn.end)
    assert isinstance(error, CommitUnknownError)
    assert pg_router.agent(team.id, "Engineer_1").state.value == "running"
    assert turn.end().state.value == "completed"
    with pytest.raises(StaleTurnError):
        turn.end()
    ended = [e for e in pg_router.ledger(team.id) if e.action.value == "turn_ended"]
    assert len(ended) == 1


def test_a_connection_lost_during_the_append_is_commit_unknown(pg_router: Router) -> None:
    """A transcript append is one call in autocommit: a connection lost during it is
    CommitUnknownError (the built-in loop then leaves the turn to recovery). Here the backend
    is cut while the call waits for the agent's lock: nothing was written, and the reply
    appended again lands once, at the next position."""
    team = pg_router.create_team()
    agent = pg_router.create_agent(team.id, role="Engineer")
    turn = start_running(pg_router, team.id, "Engineer_1")
    before = pg_router.transcript(team.id, "Engineer_1")
    reply = assistant("done")
    error = _cut_while_blocked(pg_router, agent.id, lambda: turn.append_assistant(reply))
    assert isinstance(error, CommitUnknownError) and error.transient
    assert pg_router.transcript(team.id, "Engineer_1") == before
    turn.append_assistant(reply)
    assert pg_router.transcript(team.id, "Engineer_1") == [*before, reply]
    positions = [e["position"] for e in pg_router.store.reads.transcript_entries(agent.id)]
    assert positions == list(range(len(before) + 1))


def test_a_send_that_the_server_ends_in_a_deadlock_runs_again(pg_router: Router) -> None:
    """A deadlock is broken by the server rolling one transaction back: nothing of it was
    written, so the send runs again (never "commit unknown"). Here the lead's send to
    Engineer_1 locks Engineer_1 and then waits for the lead's row (its sender's key), which a
    second transaction holds and which then asks for Engineer_1: the send, which waited first,
    is the one the server rolls back; run again, it delivers once."""
    team = pg_router.create_team()
    engineer = pg_router.create_agent(team.id, role="Engineer")
    lead = pg_router.agent(team.id, "Team Leader")
    holder = sa.create_engine(pg_router.store.engine.url)
    outcome: list[Any] = []

    def send() -> None:
        try:
            outcome.append(
                pg_router.send(team.id, to="Engineer_1", content="deploy", sender="Team Leader")
            )
        except BaseException as exc:  # reported below
            outcome.append(exc)

    with holder.connect() as conn, holder.connect() as watcher:
        # The holder's own deadlock check comes long after the send's (one second).
        conn.execute(sa.text("SET LOCAL deadlock_timeout = '30s'"))
        lock = sa.text("SELECT id FROM ar_agents WHERE id = :id FOR UPDATE")
        conn.execute(lock, {"id": lead.id})
        thread = threading.Thread(target=send)
        thread.start()
        until_lock_waiters(watcher, 1)
        conn.execute(lock, {"id": engineer.id})  # the cycle: the server ends the send's run
        conn.rollback()
        thread.join(timeout=60)
    holder.dispose()
    assert len(outcome) == 1 and not isinstance(outcome[0], BaseException), outcome
    assert [m.id for m in pg_router.messages(team.id)] == [outcome[0].message_id]


def test_a_send_the_server_cancels_is_a_plain_store_error(pg_router: Router) -> None:
    """A statement the server cancels (a host's statement_timeout or lock_timeout, an
    operator's pg_cancel_backend) is answered over a live connection: it rolled back and wrote
    nothing. The send's error is a plain StoreError, not "commit unknown", and not run again by
    the store (a timeout would only repeat); a send again delivers once."""
    team = pg_router.create_team()
    agent = pg_router.create_agent(team.id, role="Engineer")
    error = _cut_while_blocked(
        pg_router,
        agent.id,
        lambda: pg_router.send(team.id, to="Engineer_1", content="deploy"),
        cut=_cancel,
    )
    assert isinstance(error, StoreError), error
    assert not isinstance(error, CommitUnknownError) and not error.retryable, error
    assert pg_router.messages(team.id) == []
    delivery = pg_router.send(team.id, to="Engineer_1", content="deploy")
    assert [m.id for m in pg_router.messages(team.id)] == [delivery.message_id]
