"""On PostgreSQL a turn of the built-in loop that makes k model calls makes at most 2k + 2
transitions, counted at the driver: its claim, one before each model call and one after it, and
its end; beside them only what the turn sends (here the lead's answer to the user). Tool results
between the calls go with the next transition; the loop reads nothing on its own (the claim and
the transitions return what it reads). The same through PgBouncer in transaction pooling."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pytest

from agent_router import Router, Settings
from agent_router.agents.loop import TurnOutcome, run_turn
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
def test_a_turn_of_k_model_calls_sends_at_most_2k_plus_2_statements(
    router: Router, calls: int
) -> None:
    team = router.create_team()
    lead = team.lead
    tools = default_registry()
    # Twice: the first turn of the agent in this process, then one whose request window the
    # process kept.
    for turn_number in (1, 2):
        router.send(team.id, to=lead.display_name, content=f"task {turn_number}", sender="user")
        model = InstantModel(calls - 1)  # a do_work call per model call, then the final reply
        with statements_in_autocommit(router) as seen:
            turn = router.claim(lead.id, builtin=True)
            assert turn is not None
            outcome = run_turn(router, turn, models=partial(_model, model), tools=tools)
        assert outcome is TurnOutcome.ENDED
        assert model.calls == calls
        transcript = router.transcript(team.id, lead.display_name)
        assert transcript[-1] == {"role": "assistant", "content": "Done."}
        # Each tool call of the turn has its result, in the transcript before the next call.
        results = [e for e in transcript if e["role"] == "tool"]
        assert len(results) == turn_number * (calls - 1)
        sent = [" ".join(statement.split()) for statement, _alone in seen]
        answers = [s for s in sent if s.startswith("SELECT ar_tell_user")]
        assert len(answers) == 1, "\n".join(sent)  # the lead's final reply, to the user
        assert len(sent) - len(answers) <= 2 * calls + 2, "\n".join(sent)
        assert all(alone for _statement, alone in seen)
