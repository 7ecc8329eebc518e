"""What the turns of a worker run on, from its settings alone (no runtime factory): the model of
the team, else of the role, else ``AGENT_ROUTER_OPENAI_MODEL``, on the OpenAI-compatible server
of the ``openai_*`` settings (the scripted HTTP server here, which counts the requests it gets);
``scripted`` only when a team names it; a turn with no model fails with one typed error that
names the setting, in the ledger and in ``agent-router check``. The same for ``agent-router
worker`` and for a host's worker built by ``install(app)``; the worker logs its model at start."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from kombu import Queue

from agent_router import Router, Settings
from agent_router.agents.builder import for_router
from agent_router.agents.llm import SCRIPTED_MODEL, ScriptedModel
from agent_router.agents.loop import run_turn
from agent_router.agents.openai_model import OpenAIModel
from agent_router.agents.roles import RoleCatalogue
from agent_router.broker import CeleryPublisher
from agent_router.domain import LedgerAction, LedgerEvent
from agent_router.errors import InvalidArgumentError, ModelNotConfiguredError
from agent_router.ops.demo import wait_quiescent, wait_until
from tests.acceptance.test_run_cli import scripted_llm
from tests.integration.conftest import _wait_for_worker, _worker_env
from tests.integration.helpers import start_running
from tests.integration.test_host_traps import _host_env, _start_host_worker, _stop, _wait_ready
from tests.support.chat_server import ChatServer

ROOT = Path(__file__).parents[2]
CLI = str(Path(sys.executable).parent / "agent-router")
TIMEOUT = 60.0
API_KEY = "sk-test-secret"


def _failures(router: Router, team: int) -> list[LedgerEvent]:
    return [
        e
        for e in router.ledger(team)
        if e.action is LedgerAction.TURN_ENDED and e.detail.get("failed")
    ]


def _replies(router: Router, team: int, name: str = "Team Leader") -> list[str]:
    return [
        str(e["content"])
        for e in router.transcript(team, name)
        if e["role"] == "assistant" and e.get("content")
    ]


def _openai_env(server: ChatServer) -> dict[str, str]:
    return {
        "AGENT_ROUTER_OPENAI_MODEL": "test-model",
        "AGENT_ROUTER_OPENAI_BASE_URL": server.base_url,
        "AGENT_ROUTER_OPENAI_API_KEY": API_KEY,
    }


def _assert_serves(text: str, base_url: str) -> None:
    """The worker logged, at start, the model it calls and where, and never the API key."""
    lines = [line for line in text.splitlines() if "agent-router serves model test-model" in line]
    assert len(lines) == 1 and f"test-model at {base_url} " in lines[0], text[-3000:]
    assert API_KEY not in text


def _start_worker(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    hostname = f"ar-models-{uuid.uuid4().hex[:8]}@localhost"
    proc = subprocess.Popen(
        [CLI, "worker", "--no-supervise", "--concurrency=2", "--loglevel=INFO",
         f"--hostname={hostname}"],
        env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    return proc, hostname


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    env.update(AGENT_ROUTER_DATABASE_URL=settings.database_url, COLUMNS="200")
    return subprocess.run(
        [CLI, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


# ---------------------------------------------------------------------- in this process


def test_a_team_keeps_its_model_and_a_bad_one_is_refused(router: Router) -> None:
    team = router.create_team(model="gpt-4o-mini")
    assert team.model == "gpt-4o-mini"
    assert router.team(team.id).model == "gpt-4o-mini"
    assert router.team(router.create_team().id).model is None
    total, _ = router.reads.team_summaries(offset=0, limit=1)
    with pytest.raises(InvalidArgumentError, match="model"):
        router.create_team(model=" ")
    with pytest.raises(InvalidArgumentError, match="model"):
        router.create_team(model="x" * 201)
    assert router.reads.team_summaries(offset=0, limit=1)[0] == total  # nothing created


ROLES = """
[[roles]]
name = "Team Leader"
description = "Leads."
system_prompt = "You are the Team Leader."

[[roles]]
name = "Writer"
description = "Writes."
system_prompt = "You are a Writer."
model = "role-model"
"""


def test_the_team_model_wins_over_the_role_model_which_wins_over_the_setting(
    router: Router,
) -> None:
    settings = router.settings.model_copy(
        update={"openai_model": "setting-model", "openai_api_key": API_KEY}
    )
    roles = RoleCatalogue.from_toml(ROLES)
    models = for_router(Router(settings, store=router.store, publisher=None), roles).models
    plain, named = router.create_team(), router.create_team(model="team-model")
    for team, lead, writer in (
        (plain.id, "setting-model", "role-model"),
        (named.id, "team-model", "team-model"),
    ):
        chosen = models(router.team(team).lead)
        assert isinstance(chosen, OpenAIModel) and chosen.model_name == lead
        sub = router.create_agent(team, role="Writer")
        chosen = models(sub)
        assert isinstance(chosen, OpenAIModel) and chosen.model_name == writer
    scripted = router.create_team(model=SCRIPTED_MODEL)
    assert isinstance(models(scripted.lead), ScriptedModel)


def test_a_turn_without_a_model_fails_with_the_typed_error_and_no_reply(router: Router) -> None:
    built = for_router(router)  # the settings name no model
    team = router.create_team().id
    turn = start_running(router, team, "Team Leader")
    run_turn(router, turn, models=built.models, tools=built.tools)
    (failed, *_) = _failures(router, team)
    error = str(failed.detail["error"])
    assert error.startswith(f"{ModelNotConfiguredError.__name__}: ")
    assert "AGENT_ROUTER_OPENAI_MODEL" in error
    assert _replies(router, team) == []
    (status,) = router.reads.agent_statuses(team)
    assert status.last_error == error
    # The scripted model runs for a team that names it, and only its agents get do_work.
    scripted = router.create_team(model=SCRIPTED_MODEL)
    engineer = router.create_agent(scripted.id, role="Full-Stack Engineer")
    plain_engineer = router.create_agent(team, role="Full-Stack Engineer")
    names = {s["function"]["name"] for s in built.tools.schemas(engineer)}
    assert "do_work" in names
    assert "do_work" not in {s["function"]["name"] for s in built.tools.schemas(plain_engineer)}
    turn = start_running(router, scripted.id, "Team Leader")
    run_turn(router, turn, models=built.models, tools=built.tools)
    assert _failures(router, scripted.id) == []
    assert _replies(router, scripted.id)
    assert [s.last_error for s in router.reads.agent_statuses(scripted.id)] == [None, None]


# ---------------------------------------------------------------------- worker processes


def test_agent_router_worker_with_only_the_openai_settings_sends_turns_to_that_server(
    celery_settings: Settings, celery_app: Celery, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    with ChatServer(responder=scripted_llm) as server:
        env = {**_worker_env(celery_settings), **_openai_env(server)}
        proc, hostname = _start_worker(env, log)
        router = Router(celery_settings, publisher=CeleryPublisher(celery_app))
        try:
            _wait_for_worker(celery_app, hostname, proc, log)
            team = router.create_team().id
            router.send(team, to="Team Leader", content="Status, please.")
            wait_quiescent(router, team, timeout=TIMEOUT)
            requests = server.requests
            # A team that names the scripted model runs it: the server gets nothing more.
            scripted = router.create_team(model=SCRIPTED_MODEL).id
            router.send(scripted, to="Team Leader", content="Status, please.")
            wait_quiescent(router, scripted, timeout=TIMEOUT)
            assert len(server.requests) == len(requests)
        finally:
            _stop(proc)
            router.close()
    assert requests, log.read_text()[-3000:]
    assert {r.body["model"] for r in requests} == {"test-model"}
    assert {r.headers.get("authorization") for r in requests} == {f"Bearer {API_KEY}"}
    assert _failures(router, team) == [] and _replies(router, team)
    assert _failures(router, scripted) == [] and _replies(router, scripted)
    _assert_serves(log.read_text(), server.base_url)


@pytest.fixture
def chat_queue(redis_url: str) -> Iterator[str]:
    queue = f"chat.{uuid.uuid4().hex[:8]}"
    yield queue
    app = Celery(broker=redis_url, set_as_current=False)
    with app.connection_for_write() as conn:
        Queue(queue, channel=conn.default_channel).delete()
    app.close()


def test_a_hosts_worker_built_by_install_sends_turns_to_the_configured_server(
    celery_settings: Settings, celery_app: Celery, redis_url: str, chat_queue: str, tmp_path: Path
) -> None:
    log = tmp_path / "host-worker.log"
    with ChatServer(responder=scripted_llm) as server:
        # The host's worker (tests/support/host_chat.py: its own app, `install(app)`) consumes
        # the router's queue too: it runs the built-in loop's turns.
        env = _host_env({
            "CHAT_BROKER_URL": redis_url,
            "CHAT_QUEUE": chat_queue,
            "AGENT_ROUTER_DATABASE_URL": celery_settings.database_url,
            "AGENT_ROUTER_QUEUE": celery_settings.queue,
            "AGENT_ROUTER_REDIS_URL": redis_url,
            "AGENT_ROUTER_WORKER_SWEEPER": "false",
            **_openai_env(server),
        })  # fmt: skip
        proc, hostname = _start_host_worker(env, f"{chat_queue},{celery_settings.queue}", log, ROOT)
        router = Router(celery_settings, publisher=CeleryPublisher(celery_app))
        try:
            _wait_ready(celery_app, proc, hostname, log)
            team = router.create_team().id
            router.send(team, to="Team Leader", content="Status, please.")
            wait_quiescent(router, team, timeout=TIMEOUT)
        finally:
            _stop(proc)
            router.close()
        requests = server.requests
    assert requests, log.read_text()[-3000:]
    assert {r.body["model"] for r in requests} == {"test-model"}
    assert _failures(router, team) == [] and _replies(router, team)
    _assert_serves(log.read_text(), server.base_url)


def test_a_worker_without_a_model_fails_the_turn_in_the_ledger_and_check_says_what_to_set(
    celery_settings: Settings, celery_app: Celery, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    env = _worker_env(celery_settings.model_copy(update={"openai_model": None}))
    proc, hostname = _start_worker(env, log)
    router = Router(celery_settings, publisher=CeleryPublisher(celery_app))
    try:
        _wait_for_worker(celery_app, hostname, proc, log)
        team = router.create_team().id
        router.send(team, to="Team Leader", content="Status, please.")
        wait_until(lambda: bool(_failures(router, team)), "the turn to fail", timeout=TIMEOUT)
        wait_quiescent(router, team, timeout=TIMEOUT)
        scripted = router.create_team(model=SCRIPTED_MODEL).id
        router.send(scripted, to="Team Leader", content="Status, please.")
        wait_quiescent(router, scripted, timeout=TIMEOUT)
    finally:
        _stop(proc)
        router.close()
    failures = _failures(router, team)
    # The lead's turn and its one retry: the failed turn consumed its messages, so nothing
    # wakes the lead a third time.
    assert len(failures) == 2, [e.detail for e in failures]
    errors = {str(e.detail["error"]) for e in failures}
    assert all(
        e.startswith("ModelNotConfiguredError: ") and "AGENT_ROUTER_OPENAI_MODEL" in e
        for e in errors
    ), errors
    assert _replies(router, team) == []  # no canned reply
    assert _failures(router, scripted) == [] and _replies(router, scripted)
    checked = _cli(celery_settings, "check", str(team))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "ModelNotConfiguredError" in checked.stdout
    assert "AGENT_ROUTER_OPENAI_MODEL" in checked.stdout
    status = _cli(celery_settings, "status", str(team))
    assert status.returncode == 0, status.stdout + status.stderr
    assert "Team Leader: last turn failed: ModelNotConfiguredError: " in status.stdout
    assert "AGENT_ROUTER_OPENAI_MODEL" in status.stdout
    text = log.read_text()
    assert "no model configured" in text and "AGENT_ROUTER_OPENAI_MODEL" in text, text[-3000:]
