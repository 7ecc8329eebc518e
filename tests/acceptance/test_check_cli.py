"""``agent-router check TEAM`` runs the guarantee checks from a shell: exit 0 and a summary for a
sound team, exit 1 with one line per violation once a delivered message is gone from the
transcript it was delivered into."""

from __future__ import annotations

import json

import sqlalchemy as sa

from agent_router import Router, Settings
from agent_router.outbox import RecordingPublisher
from tests.integration.helpers import start_running, start_waiting

from .test_operate_cli import run


def test_check_passes_a_sound_team_and_fails_a_lost_message(sqlite_url: str) -> None:
    router = Router(Settings(database_url=sqlite_url), publisher=RecordingPublisher())
    router.create_schema()
    team = router.create_team()
    router.create_agent(team.id, role="UI Operator")
    turn = start_running(router, team.id, "UI Operator_1", "Build the login page.")
    turn.append_assistant({"role": "assistant", "content": "Done."})
    turn.end()
    message_id = router.messages(team.id)[0].id
    router.close()

    sound = run("check", str(team.id), "--quiescent", database_url=sqlite_url)
    assert sound.returncode == 0, sound.stderr
    assert "lost=0" in sound.stdout and "violation" not in sound.stdout

    engine = sa.create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(
            sa.text("DELETE FROM ar_transcript_entries WHERE message_id = :m"), {"m": message_id}
        )
    engine.dispose()
    broken = run("check", str(team.id), database_url=sqlite_url)
    assert broken.returncode == 1
    assert f"violation: message {message_id} marked delivered but not in a transcript" in (
        broken.stdout.splitlines()
    )
    as_json = run("check", str(team.id), "--json", database_url=sqlite_url)
    report = json.loads(as_json.stdout)
    assert (as_json.returncode, report["ok"], report["lost"]) == (1, False, 1)

    unknown = run("check", "999999", database_url=sqlite_url)
    assert unknown.returncode == 1
    assert len(unknown.stderr.strip().splitlines()) == 1


def test_answer_by_question_id_reaches_the_asker_once(sqlite_url: str) -> None:
    router = Router(Settings(database_url=sqlite_url), publisher=RecordingPublisher())
    router.create_schema()
    team = router.create_team()
    router.create_agent(team.id, role="UI Operator")
    start_waiting(router, team.id, "UI Operator_1", "Team Leader", call_id="ask-1")
    (question,) = [m.question_id for m in router.messages(team.id) if m.question_id]
    assert question is not None
    router.close()

    done = run("answer", str(question), "Use OAuth.", database_url=sqlite_url)
    assert done.returncode == 0, done.stderr
    assert "answer to UI Operator_1" in done.stdout and "resolved" in done.stdout
    again = run("answer", str(question), "Use OAuth.", database_url=sqlite_url)
    assert again.returncode == 1
    assert len(again.stderr.strip().splitlines()) == 1
