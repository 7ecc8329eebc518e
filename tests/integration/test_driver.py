"""The statements that are their own transaction (a send that needs no question, an answer to
the agent waiting on it, a claim that only counts its turn, the common end of a turn, a
transcript append) go straight to the driver when nothing watches the engine's statements, and
through SQLAlchemy when a listener does; either way the pooled connection goes back to the pool
as it was taken, and a database error is the store's own. Each fits psycopg's cache of
converted queries. What they write is checked against the general way in the tests of each
statement, which run on the driver."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from agent_router import CommitUnknownError, MessageType, Router, Settings, StoreError
from agent_router.store import (
    answer_route,
    append_statement,
    claim_statement,
    driver,
    end_statement,
    one_statement,
)
from agent_router.store.values import SendRequest

from .helpers import assistant, start_running, tool_call

#: The statements that are their own transaction, by name.
STATEMENTS: dict[str, Any] = {
    "send": one_statement._STATEMENTS[False],
    "send from outside": one_statement._STATEMENTS[True],
    "answer": answer_route._STATEMENT,
    "claim": claim_statement._STATEMENT,
    "end": end_statement._STATEMENT,
    "append": append_statement._STATEMENT,
}
ALONE = {id(statement): name for name, statement in STATEMENTS.items()}


@pytest.fixture
def pg_router(pg_schema_url: str) -> Iterator[Router]:
    # One connection: every statement runs on it, so its state after each is what is checked.
    router = Router(Settings(database_url=pg_schema_url, pool_size=1))
    yield router
    router.close()


def _each_statement(router: Router) -> None:
    """A claim, a send from outside, a send from an agent, appends, an answer to the agent
    waiting on its question and the end of its turn."""
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    turn = start_running(router, team.id, "Engineer_1")
    router.send(team.id, to="Engineer_1", content="FYI", sender="user")
    router.send(team.id, to="Engineer_1", content="FYI", sender="Team Leader")
    turn.append_assistant(assistant(None, tool_call("ask-1", "ask_master")))
    question = turn.ask("Team Leader", "which auth module?", tool_call_id="ask-1").id
    delivery = router.send(
        team.id,
        to="Engineer_1",
        content="the OAuth one",
        sender="Team Leader",
        type=MessageType.ANSWER,
        question_id=question,
    )
    assert delivery.outcome.value == "resolved"
    turn.append_assistant(assistant("done"))
    assert turn.end().follow_up  # the two FYIs wait in the mailbox


@pytest.mark.parametrize("watched", [False, True], ids=["unwatched", "watched"])
def test_the_statements_alone_skip_sqlalchemys_execution_unless_watched(
    pg_router: Router, watched: bool
) -> None:
    engine = pg_router.store.engine
    executed: list[str] = []

    def execute(_conn: Any, element: Any, *_: Any) -> None:
        if id(element) in ALONE:
            executed.append(ALONE[id(element)])

    def cursor(*_: Any) -> None:
        pass

    event.listen(engine, "before_execute", execute)
    if watched:
        event.listen(engine, "before_cursor_execute", cursor)
    try:
        _each_statement(pg_router)
    finally:
        event.remove(engine, "before_execute", execute)
        if watched:
            event.remove(engine, "before_cursor_execute", cursor)
    expected = ["send from outside", "claim", "send from outside", "send", "append", "answer"]
    expected += ["append", "end"]
    assert executed == (expected if watched else [])


@pytest.mark.parametrize("name", list(STATEMENTS))
def test_each_statement_alone_fits_the_drivers_statement_cache(name: str) -> None:
    """psycopg converts a query's parameters once and caches it only up to this length; a
    longer statement is converted again on every call. SQLAlchemy compiles each once."""
    from psycopg import _queries
    from sqlalchemy.dialects import postgresql

    statement = STATEMENTS[name]
    assert statement._generate_cache_key() is not None
    text = str(statement.compile(dialect=postgresql.psycopg.dialect()))  # type: ignore[no-untyped-call]
    assert len(text) <= _queries.MAX_CACHED_STATEMENT_LENGTH


def _pooled(engine: sa.Engine) -> int:
    """The connections idle in the engine's pool."""
    pool: Any = engine.pool
    return int(pool.checkedin())


def _autocommit(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return bool(conn.connection.driver_connection.autocommit)  # type: ignore[union-attr]


def test_the_connection_goes_back_to_the_pool_as_it_was_taken(pg_router: Router) -> None:
    engine = pg_router.store.engine
    _each_statement(pg_router)
    assert _pooled(engine) == 1 and not _autocommit(engine)
    # Its next transaction is one: two statements of it share the transaction's id.
    with engine.connect() as conn:
        ids = [conn.execute(sa.text("SELECT txid_current()")).scalar_one() for _ in range(2)]
        conn.rollback()
    assert ids[0] == ids[1]


def test_a_database_error_on_the_driver_is_the_stores_and_changes_nothing(
    pg_router: Router,
) -> None:
    """A team id beyond the column's range fails in the database: a plain store error, not
    retried and not "commit unknown", and the connection is given back as it was taken."""
    engine = pg_router.store.engine
    team = pg_router.create_team()
    pg_router.create_agent(team.id, role="Engineer")
    before = pg_router.messages(team.id)
    with pytest.raises(StoreError) as raised:
        pg_router.store.route(
            SendRequest(
                team_id=2**70, to="Engineer_1", content="hi", sender="user", type=MessageType.TASK
            )
        )
    assert not isinstance(raised.value, CommitUnknownError) and not raised.value.retryable
    assert "out of range" in str(raised.value)
    assert _pooled(engine) == 1 and not _autocommit(engine)
    assert pg_router.messages(team.id) == before
    assert pg_router.send(team.id, to="Engineer_1", content="hi").outcome.value == (
        "triggered_new_turn"
    )


def test_a_parameter_left_out_is_named_before_anything_is_sent(pg_router: Router) -> None:
    claim = driver.compiled(claim_statement._STATEMENT, pg_router.store.engine.dialect)
    with pytest.raises(ValueError, match=r"\['b_agent', 'b_builtin'"):
        claim.parameters({"b_epoch": None, "b_now": None, "b_lease": None, "b_ratio": 0.8})


class _InterruptedError(Exception):
    pass


def test_a_send_interrupted_inside_its_statement_leaves_no_connection_mid_query(
    pg_router: Router,
) -> None:
    """A signal's exception (a worker's time limit, Ctrl-C) raised while the statement waits
    in the database: the exception reaches the caller, and the connection is closed rather than
    given back to the pool in the middle of its query; the next send takes a new connection.
    Whether the interrupted statement committed is unknown, as with a commit whose connection
    was lost: the server may still run it once the lock is released, and then only once."""
    engine = pg_router.store.engine
    team = pg_router.create_team()
    agent = pg_router.create_agent(team.id, role="Engineer")
    with engine.connect() as conn:
        before = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()

    def interrupt(*_: Any) -> None:
        raise _InterruptedError

    holder = sa.create_engine(pg_router.settings.database_url)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with holder.connect() as lock:
            lock.execute(
                sa.text("SELECT 1 FROM ar_agents WHERE id = :id FOR UPDATE"), {"id": agent.id}
            )
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(_InterruptedError):
                pg_router.send(team.id, to="Engineer_1", content="deploy")
            lock.rollback()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        holder.dispose()
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one() != before
        assert not conn.connection.driver_connection.autocommit  # type: ignore[union-attr]
    delivery = pg_router.send(team.id, to="Engineer_1", content="deploy")
    sent = [m.id for m in pg_router.messages(team.id)]
    assert delivery.message_id in sent and len(sent) <= 2
