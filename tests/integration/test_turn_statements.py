"""On PostgreSQL a turn of the built-in loop that makes k model calls sends 2k + 1
statements, counted at the driver: its claim, which makes the transition before the first model
call too, one transition before each later model call, one after each, and its end, which
writes the turn's final output too (a lead's answer to the user, a sub-agent's completion report
to its lead); beside them only, after the end's commit, the outbox's mark of the lead's turn
task a report enqueued as published. Tool results between the calls go with the next
transition; the loop reads nothing on its own (the claim and the transitions return what it
reads). The same through PgBouncer in transaction pooling."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pytest

from agent_router import MessageSubtype, Router, Settings
from agent_router.agents.loop import TurnOutcome, claim, run_turn
from agent_router.agents.tools import default_registry
from agent_router.ops.bench import InstantModel
from agent_router.outbox import RecordingPublisher

from .helpers import statements_in_autocommit


@pytest.fixture(params=["postgresql", "pgbouncer"])
def router(request: pytest.FixtureRequest) -> Iterator[Router]:
    fixture = "own_pg_schema_url" if request.param == "postgresql" else "pgbouncer_url"
    url = str(request.getfixturevalue(fixture))
    router = Router(Settings(database_url=url, work_seconds=0.0), publisher=RecordingPublisher())
    yield router
    router.close()


def _model(model: InstantModel, _agent: object) -> InstantModel:
    return model


@pytest.mark.parametrize("calls", [1, 2, 4])
@pytest.mark.parametrize("who", ["lead", "sub-agent"])
def test_a_turn_of_k_model_calls_sends_2k_plus_1_statements(
    router: Router, calls: int, who: str
) -> None:
    team = router.create_team()
    agent = team.lead if who == "lead" else router.create_agent(team.id, role="Engineer")
    tools = default_registry()
    # Twice: the first turn of the agent in this process, then one whose request window the
    # process kept.
    for turn_number in (1, 2):
        router.send(team.id, to=agent.display_name, content=f"task {turn_number}", sender="user")
        model = InstantModel(calls - 1)  # a do_work call per model call, then the final reply
        with statements_in_autocommit(router) as seen:
            turn = claim(router, agent.id)
            assert turn is not None
            outcome = run_turn(router, turn, models=partial(_model, model), tools=tools)
        assert outcome is TurnOutcome.ENDED
        assert model.calls == calls
        transcript = router.transcript(team.id, agent.display_name)
        assert transcript[-1] == {"role": "assistant", "content": "Done."}
        # Each tool call of the turn has its result, in the transcript before the next call.
        results = [e for e in transcript if e["role"] == "tool"]
        assert len(results) == turn_number * (calls - 1)
        sent = [" ".join(statement.split()) for statement, _alone in seen]
        # After the end's commit, a sub-agent's report that woke its lead has the lead's turn
        # task published: the outbox marks it so, in a transaction of its own.
        marks = [s for s in sent if s.startswith("UPDATE ar_outbox SET published_at")]
        # (the second report finds the lead's turn scheduled already: nothing to publish).
        woke = who == "sub-agent" and turn_number == 1
        assert len(marks) == (1 if woke else 0), "\n".join(sent)
        assert len(sent) - len(marks) == 2 * calls + 1, "\n".join(sent)
        assert all(s.startswith("SELECT ar_") for s in sent if s not in marks)
        assert all(alone for _statement, alone in seen)
        # The final reply reached its reader, once per turn, with the end.
        if who == "lead":
            answers = [m for m in router.user_messages(team.id) if m.kind.value == "answer"]
            assert [m.content for m in answers] == ["Done."] * turn_number
        else:
            reports = [
                m
                for m in router.messages(team.id)
                if m.subtype is MessageSubtype.COMPLETION_REPORT
                and m.source_name == agent.display_name
            ]
            assert [(m.content, m.wake, m.dedup_key) for m in reports] == [
                ("Done.", True, f"report:{t.id}") for t in router.reads.turns(agent.id)
            ]
