"""What a host meets on its first day, with a real host Celery app and worker
(``tests/support/host_chat.py`` run by ``celery -A ... worker``) beside the router's own worker:

- a host-owned runner named without a queue runs on the host's worker: the turn that the CLI
  starts and the follow-up that the router's worker publishes go where the host's app routes
  the task, never to the router's queue;
- a host worker configured without AGENT_ROUTER_BROKER_URL publishes what its turns start
  through the host app's broker, not an in-process ``memory://`` one;
- a host worker with no AGENT_ROUTER_* configuration at all stays quiet and writes nothing.

No sweeper runs in these workers: a turn published to the wrong place would wait forever (the
test times out) instead of being rescued a sweep period later.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from kombu import Queue

from agent_router import Router, Settings
from agent_router.agents.llm import directive
from agent_router.ops.demo import wait_quiescent, wait_until
from agent_router.worker import install
from agent_router.worker.celery_app import create_app
from agent_router.worker.publisher import CeleryPublisher
from agent_router.worker.runtime import Runtime

ROOT = Path(__file__).parents[2]
CLI = str(Path(sys.executable).parent / "agent-router")
TIMEOUT = 60.0


def _host_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_ROUTER_", "CHAT_"))}
    env["PYTHONPATH"] = str(ROOT)  # tests.support.host_chat, from any working directory
    return {**env, **extra}


def _start_host_worker(
    env: dict[str, str], queue: str, log: Path, cwd: Path
) -> tuple[subprocess.Popen[bytes], str]:
    hostname = f"chat-{uuid.uuid4().hex[:8]}@localhost"
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.support.host_chat", "worker",
         "--pool=threads", "--concurrency=4", "--loglevel=INFO", f"--hostname={hostname}",
         f"--queues={queue}"],
        env=env, cwd=cwd, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    return proc, hostname


def _wait_ready(app: Celery, proc: subprocess.Popen[bytes], hostname: str, log: Path) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the host worker exited with {proc.returncode}:\n{log.read_text()}")
        if app.control.ping(destination=[hostname], timeout=0.5):
            return
    pytest.fail(f"the host worker did not answer a ping:\n{log.read_text()}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def chat_queue(redis_url: str) -> Iterator[str]:
    queue = f"chat.{uuid.uuid4().hex[:8]}"
    yield queue
    app = Celery(broker=redis_url, set_as_current=False)
    with app.connection_for_write() as conn:
        Queue(queue, channel=conn.default_channel).delete()
    app.close()


def _lead_texts(router: Router, team: int) -> list[str]:
    return [
        str(e["content"])
        for e in router.transcript(team, "Team Leader")
        if e["role"] == "assistant" and e.get("content")
    ]


def test_a_runner_without_a_queue_and_a_host_worker_without_a_broker_setting_run_the_team(
    subprocess_worker: Runtime,
    celery_settings: Settings,
    redis_url: str,
    chat_queue: str,
    tmp_path: Path,
) -> None:
    # The host's web process: its app routes chat.* to its queue; its router records the lead's
    # runner as README shows it, without a queue.
    host = Celery(f"chat_{uuid.uuid4().hex[:6]}", broker=redis_url, set_as_current=False)
    host.conf.task_routes = {"chat.*": {"queue": chat_queue}}
    install(host, celery_settings)
    web = Router(celery_settings, publisher=CeleryPublisher(host))
    team = web.create_team(lead_runner="chat.lead_turn").id
    assert web.agent(team, "Team Leader").runner == f"chat.lead_turn@{chat_queue}"
    # The router's own app sends a host task it has no route for to Celery's default queue,
    # never to the router's queue.
    own = create_app(celery_settings)
    assert own.amqp.router.route({}, "chat.other")["queue"].name == "celery"
    own.close()
    # The host's worker consumes the host's queue only, and has the router's database and queue
    # but no AGENT_ROUTER_BROKER_URL: its broker is its app's.
    env = _host_env({
        "CHAT_BROKER_URL": redis_url,
        "CHAT_QUEUE": chat_queue,
        "AGENT_ROUTER_DATABASE_URL": celery_settings.database_url,
        "AGENT_ROUTER_QUEUE": celery_settings.queue,
        "AGENT_ROUTER_REDIS_URL": redis_url,
        "AGENT_ROUTER_WORKER_SWEEPER": "false",
    })  # fmt: skip
    log = tmp_path / "host-worker.log"
    proc, hostname = _start_host_worker(env, chat_queue, log, ROOT)
    try:
        _wait_ready(host, proc, hostname, log)
        # The first turn starts from the CLI (the router's own app publishes it); the lead's
        # host turn staffs a sub-agent (published by the host worker), which runs on the
        # router's worker and reports; that report's follow-up is published by the router's
        # worker, and runs on the host's worker again.
        create = directive("create_sub_agent", role="Researcher", task="Find it out.")
        sent = subprocess.run(
            [CLI, "send", str(team), "Team Leader", f"Build the login page.\n{create}"],
            env=_host_env({
                "AGENT_ROUTER_DATABASE_URL": celery_settings.database_url,
                "AGENT_ROUTER_BROKER_URL": celery_settings.broker_url,
                "AGENT_ROUTER_QUEUE": celery_settings.queue,
            }),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        assert "triggered_new_turn" in sent.stdout
        wait_until(
            lambda: any("from Researcher_1" in t for t in _lead_texts(web, team)),
            "the sub-agent's report to reach the host's lead",
            timeout=TIMEOUT,
        )
        wait_quiescent(web, team, timeout=TIMEOUT)
        texts = _lead_texts(web, team)
        assert len(texts) >= 2 and all(t.startswith("(host) ") for t in texts)
        assert web.agent(team, "Researcher_1").runner is None  # the built-in loop
    finally:
        _stop(proc)
        web.close()
        host.close()
    router_log = (tmp_path / "worker.log").read_text()
    assert "unregistered task" not in router_log.lower()
    assert "chat.lead_turn" not in router_log


def test_a_host_worker_without_router_settings_stays_quiet_and_writes_nothing(
    redis_url: str, chat_queue: str, tmp_path: Path
) -> None:
    workdir = tmp_path / "host"
    workdir.mkdir()
    env = _host_env({"CHAT_BROKER_URL": redis_url, "CHAT_QUEUE": chat_queue})
    log = tmp_path / "host-worker.log"
    proc, hostname = _start_host_worker(env, chat_queue, log, workdir)
    ping = Celery(broker=redis_url, set_as_current=False)
    try:
        _wait_ready(ping, proc, hostname, log)
        # Longer than a sweep period (5 s by default, first pass within it): a sweeper would
        # have run by now.
        time.sleep(Settings().sweep_seconds + 1.0)
        assert proc.poll() is None
    finally:
        _stop(proc)
        ping.close()
    text = log.read_text()
    assert "agent-router sweeper off: AGENT_ROUTER_DATABASE_URL is not set" in text
    assert "sweep failed" not in text and "no such table" not in text
    assert list(workdir.iterdir()) == []  # no agent_router.db, nothing else
