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
from sqlalchemy.orm import Session

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


class FaultAt:
    """Terminate the transaction's backend at the session event ``name`` (``times`` times)."""

    def __init__(self, router: Router, name: str, *, times: int = 1) -> None:
        self.sessions: Any = router.store._sessions
        self.name = name
        self.left = times
        self.fired = False

    def __call__(self, session: Session, *args: Any) -> None:
        if self.left:
            self.left -= 1
            self.fired = True
            # after_begin passes the connection; at before_commit the session holds one.
            connection = args[1] if len(args) > 1 else session.connection()
            _terminate_own_backend(connection)

    def __enter__(self) -> FaultAt:
        event.listen(self.sessions, self.name, self)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.sessions, self.name, self)


def test_the_error_hierarchy_keeps_unknown_apart_from_refused() -> None:
    assert issubclass(CommitUnknownError, StoreError)
    assert not issubclass(StoreError, RefusedError)
    assert not issubclass(CommitUnknownError, RefusedError)


def test_a_connection_lost_during_commit_is_commit_unknown_and_a_retry_is_safe(
    pg_router: Router,
) -> None:
    team = pg_router.create_team()
    pg_router.create_agent(team.id, role="Engineer")
    with FaultAt(pg_router, "before_commit"), pytest.raises(CommitUnknownError):
        pg_router.send(team.id, to="Engineer_1", content="deploy", dedup_key="deploy-1")
    # The sender does not know whether it committed: it retries with the same key.
    delivery = pg_router.send(team.id, to="Engineer_1", content="deploy", dedup_key="deploy-1")
    again = pg_router.send(team.id, to="Engineer_1", content="deploy", dedup_key="deploy-1")
    assert again.duplicate and again.message_id == delivery.message_id
    assert [m.content for m in pg_router.messages(team.id)] == ["deploy"]


def test_a_connection_lost_before_commit_is_retried_and_commits_once(pg_router: Router) -> None:
    team = pg_router.create_team()
    pg_router.create_agent(team.id, role="Engineer")
    # With a dedup key the send is a transaction of several statements (the general way).
    with FaultAt(pg_router, "after_begin") as fault:
        delivery = pg_router.send(team.id, to="Engineer_1", content="deploy", dedup_key="d-1")
    assert fault.fired  # the first run lost its connection; the second committed
    assert [m.id for m in pg_router.messages(team.id)] == [delivery.message_id]


def test_every_run_losing_its_connection_is_a_retryable_store_error(pg_router: Router) -> None:
    team = pg_router.create_team()
    pg_router.create_agent(team.id, role="Engineer")
    with FaultAt(pg_router, "after_begin", times=10), pytest.raises(StoreError) as caught:
        pg_router.send(team.id, to="Engineer_1", content="deploy", dedup_key="d-1")
    assert caught.value.retryable and not isinstance(caught.value, CommitUnknownError)
    assert pg_router.messages(team.id) == []  # nothing was written


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


@contextmanager
def _watched(router: Router, watched: bool) -> Iterator[None]:
    """Meanwhile, when ``watched``, a listener watches the engine's statements as a host's
    tracing does (setting an attribute on SQLAlchemy's execution context): the statements that
    are their own transaction then go through SQLAlchemy, not straight to the driver."""

    def trace(
        _conn: Any, _cursor: Any, _statement: str, _params: Any, context: Any, *_: Any
    ) -> None:
        context.traced = True

    if watched:
        event.listen(router.store.engine, "before_cursor_execute", trace)
    try:
        yield
    finally:
        if watched:
            event.remove(router.store.engine, "before_cursor_execute", trace)


def _cancel(pid: int) -> None:
    """Cancel the statement the backend ``pid`` runs, as a statement_timeout does."""
    _signal_backend("pg_cancel_backend", pid)


def _cut_while_blocked(
    router: Router, agent_id: int, call: Callable[[], Any], cut: Callable[[int], None] = _terminate
) -> BaseException:
    """Run ``call`` in a thread while another transaction holds the agent's row locked, so
    that the statement that is its own transaction waits for that lock inside the database;
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
                            " AND wait_event_type = 'Lock' AND query LIKE 'WITH%'"
                        )
                    ).scalars()
                )
                if waiting:
                    break
                time.sleep(0.01)
            assert len(waiting) == 1, "the statement never waited for the lock"
            cut(waiting[0])
            conn.rollback()
            thread.join(30)
    finally:
        holder.dispose()
    assert not thread.is_alive() and len(raised) == 1
    return raised[0]


@pytest.mark.parametrize("watched", [False, True], ids=["driver", "sqlalchemy"])
def test_a_connection_lost_during_a_one_statement_send_is_commit_unknown(
    pg_router: Router, watched: bool
) -> None:
    """A send that needs no question is one statement in autocommit: its commit is the
    statement's own, so a connection lost during it leaves the outcome unknown (never a silent
    repeat that could deliver twice). Here the backend is cut while the statement waits for the
    receiver's lock: nothing was written, and the sender's retry delivers once."""
    team = pg_router.create_team()
    agent = pg_router.create_agent(team.id, role="Engineer")
    with _watched(pg_router, watched):
        error = _cut_while_blocked(
            pg_router, agent.id, lambda: pg_router.send(team.id, to="Engineer_1", content="deploy")
        )
        assert isinstance(error, CommitUnknownError)
        assert pg_router.messages(team.id) == []
        delivery = pg_router.send(team.id, to="Engineer_1", content="deploy")
    assert [m.id for m in pg_router.messages(team.id)] == [delivery.message_id]


@pytest.mark.parametrize("watched", [False, True], ids=["driver", "sqlalchemy"])
def test_a_connection_lost_during_the_claim_statement_is_commit_unknown(
    pg_router: Router, watched: bool
) -> None:
    """A claim that only counts its turn is one statement in autocommit: a connection lost
    during it leaves unknown whether the turn was claimed (a claimed turn the worker never
    learnt of is taken over when its lease lapses). Here the backend is cut while the statement
    waits for the agent's lock: nothing was written, and the worker's retry claims the turn
    once."""
    team = pg_router.create_team()
    agent = pg_router.create_agent(team.id, role="Engineer")
    pg_router.send(team.id, to="Engineer_1", content="deploy", sender="user")
    with _watched(pg_router, watched):
        error = _cut_while_blocked(pg_router, agent.id, lambda: pg_router.claim(agent.id))
        assert isinstance(error, CommitUnknownError)
        assert pg_router.agent(team.id, "Engineer_1").state.value == "scheduled"
        assert pg_router.store.reads.turns(agent.id) == []
        turn = pg_router.claim(agent.id)
    assert turn is not None
    assert [t.id for t in pg_router.store.reads.turns(agent.id)] == [turn.record.id]
    assert pg_router.store.budget(team.id).used[BudgetName.TURNS] == 1


@pytest.mark.parametrize("watched", [False, True], ids=["driver", "sqlalchemy"])
def test_a_connection_lost_during_the_answer_statement_is_commit_unknown(
    pg_router: Router, watched: bool
) -> None:
    """An answer to the agent blocked on its question is one statement in autocommit: a
    connection lost during it is CommitUnknownError. Here the backend is cut while the
    statement waits for the asker's lock: nothing was written, the asker still waits, and the
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
    with _watched(pg_router, watched):
        error = _cut_while_blocked(pg_router, agent.id, lambda: pg_router.send(team.id, **answer))
        assert isinstance(error, CommitUnknownError)
        assert pg_router.agent(team.id, "Engineer_1").state.value == "waiting"
        delivery = pg_router.send(team.id, **answer)
        assert delivery.outcome.value == "resolved"
        with pytest.raises(QuestionClosedError):
            pg_router.send(team.id, **answer)
    answers = [m.id for m in pg_router.messages(team.id) if m.type is MessageType.ANSWER]
    assert answers == [delivery.message_id]


@pytest.mark.parametrize("watched", [False, True], ids=["driver", "sqlalchemy"])
def test_a_connection_lost_during_the_end_statement_is_commit_unknown(
    pg_router: Router, watched: bool
) -> None:
    """The common end of a turn is one statement in autocommit: a connection lost during it is
    CommitUnknownError. Here the backend is cut while the statement waits for the agent's lock:
    nothing was written, the turn still runs, and the end sent again ends it once; sent a
    third time it is refused as stale."""
    team = pg_router.create_team()
    agent = pg_router.create_agent(team.id, role="Engineer")
    turn = start_running(pg_router, team.id, "Engineer_1")
    turn.append_assistant(assistant("done"))
    with _watched(pg_router, watched):
        error = _cut_while_blocked(pg_router, agent.id, turn.end)
        assert isinstance(error, CommitUnknownError)
        assert pg_router.agent(team.id, "Engineer_1").state.value == "running"
        assert turn.end().state.value == "completed"
        with pytest.raises(StaleTurnError):
            turn.end()
    ended = [e for e in pg_router.ledger(team.id) if e.action.value == "turn_ended"]
    assert len(ended) == 1


@pytest.mark.parametrize("watched", [False, True], ids=["driver", "sqlalchemy"])
def test_a_connection_lost_during_the_append_statement_is_commit_unknown(
    pg_router: Router, watched: bool
) -> None:
    """A transcript append is one statement in autocommit: a connection lost during it is
    CommitUnknownError (the built-in loop then leaves the turn to recovery). Here the backend
    is cut while the statement waits for the agent's lock: nothing was written, and the reply
    appended again lands once, at the next position."""
    team = pg_router.create_team()
    agent = pg_router.create_agent(team.id, role="Engineer")
    turn = start_running(pg_router, team.id, "Engineer_1")
    before = pg_router.transcript(team.id, "Engineer_1")
    reply = assistant("done")
    with _watched(pg_router, watched):
        error = _cut_while_blocked(pg_router, agent.id, lambda: turn.append_assistant(reply))
        assert isinstance(error, CommitUnknownError) and error.transient
        assert pg_router.transcript(team.id, "Engineer_1") == before
        turn.append_assistant(reply)
    assert pg_router.transcript(team.id, "Engineer_1") == [*before, reply]
    positions = [e["position"] for e in pg_router.store.reads.transcript_entries(agent.id)]
    assert positions == list(range(len(before) + 1))


@pytest.mark.parametrize("watched", [False, True], ids=["driver", "sqlalchemy"])
def test_a_one_statement_send_that_the_server_ends_in_a_deadlock_runs_again(
    pg_router: Router, watched: bool
) -> None:
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

    with _watched(pg_router, watched), holder.connect() as conn, holder.connect() as watcher:
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


@pytest.mark.parametrize("watched", [False, True], ids=["driver", "sqlalchemy"])
def test_a_one_statement_send_the_server_cancels_is_a_plain_store_error(
    pg_router: Router, watched: bool
) -> None:
    """A statement the server cancels (a host's statement_timeout or lock_timeout, an
    operator's pg_cancel_backend) is answered over a live connection: it rolled back and wrote
    nothing. The send's error is a plain StoreError, not "commit unknown", and not run again by
    the store (a timeout would only repeat); a send again delivers once."""
    team = pg_router.create_team()
    agent = pg_router.create_agent(team.id, role="Engineer")
    with _watched(pg_router, watched):
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
