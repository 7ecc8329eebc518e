"""What a worker built with the documented OpenAI runtime factory reports, started as an operator
starts it (``agent-router --log-format json worker``, supervised): JSON log lines that name the
agent, the Celery task and, for each model call, the model and its tokens; and Prometheus
counters of the turns it ran."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from celery import Celery

from agent_router import Router, Settings
from agent_router.broker import CeleryPublisher
from agent_router.ops.demo import wait_quiescent
from tests.acceptance.test_run_cli import scripted_llm
from tests.integration.conftest import _wait_for_worker, _worker_env
from tests.support.chat_server import ChatServer

TIMEOUT = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def _sample(metrics: str, name: str) -> float:
    """The value of the sample line that starts with ``name`` (labels included)."""
    line = next(line for line in metrics.splitlines() if line.startswith(name))
    return float(line.rsplit(" ", 1)[1])


def test_an_openai_runtime_worker_logs_json_with_names_task_ids_tokens_and_counts_its_turns(
    celery_settings: Settings, celery_app: Celery, tmp_path: Path
) -> None:
    port = _free_port()
    hostname = f"ar-reports-{uuid.uuid4().hex[:8]}@localhost"
    log = tmp_path / "worker.log"
    with ChatServer(responder=scripted_llm) as server, log.open("wb") as out:
        env = _worker_env(celery_settings)
        env.update(
            AGENT_ROUTER_RUNTIME_FACTORY="agent_router.ops.team_run:openai_runtime",
            AGENT_ROUTER_OPENAI_MODEL="test-model",
            AGENT_ROUTER_OPENAI_BASE_URL=server.base_url,
            AGENT_ROUTER_OPENAI_API_KEY="sk-test",
            AGENT_ROUTER_METRICS_PORT=str(port),
        )
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "agent-router"), "--log-format", "json",
             "worker", "--concurrency=2", "--loglevel=INFO", f"--hostname={hostname}"],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        router = Router(celery_settings, publisher=CeleryPublisher(celery_app))
        try:
            _wait_for_worker(celery_app, hostname, proc, log)
            team = router.create_team().id
            router.send(team, to="Team Leader", content="Status, please.")
            wait_quiescent(router, team, timeout=TIMEOUT)
            deadline = time.monotonic() + TIMEOUT
            metrics = _scrape(port)
            while 'agent_router_model_calls_total{model="test-model"} 1.0' not in metrics:
                assert time.monotonic() < deadline, metrics[-3000:]
                time.sleep(0.2)
                metrics = _scrape(port)
        finally:
            router.close()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    assert _sample(metrics, 'agent_router_turns_started_total{trigger="new"}') == 1.0

    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert records, log.read_text()[-3000:]
    (call,) = [r for r in records if r.get("action") == "model_call"]
    assert call["agent"] == "Team Leader" and call["team_id"] == team
    assert call["model"] == "test-model"
    assert (call["prompt_tokens"], call["completion_tokens"]) == (1, 1)  # the server's usage
    assert call["celery_task_id"]
    # Every line the turn logged names its task: the one Flower shows for it.
    in_turn = [r for r in records if r.get("turn_id") is not None]
    assert in_turn and {r.get("celery_task_id") for r in in_turn} == {call["celery_task_id"]}
