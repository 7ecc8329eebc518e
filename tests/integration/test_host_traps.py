"""What a host meets on its first day, with a real host Celery app and worker
(``tests/support/host_chat.py`` run by ``celery -A ... worker``) beside the router's own worker:

- a host-owned runner named without a queue runs on the host's worker: the turn that the CLI
  starts and the follow-up that the router's worker publishes go where the host's app routes
  the task, never to the router's queue;
- a host worker configured without AGENT_ROUTER_BROKER_URL publishes what its turns start
  through the host app's broker, not an in-process ``memory://`` one;
- a host worker with no AGENT_ROUTER_* configuration at all stays quiet and writes nothing;
- a host whose AGENT_ROUTER_DATABASE_URL is invalid (or unset) starts its web process and its
  worker, serves and runs its own tasks; the router's tasks fail there with one typed line.

No sweeper runs in these workers: a turn published to the wrong place would wait forever (the
test times out) instead of being rescued a sweep period later.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from kombu import Queue

from agent_router import Router, Settings
from agent_router.agents.llm import directive
from agent_router.broker import CeleryPublisher, create_app
from agent_router.constants import RUN_AGENT_TURN
from agent_router.ops.demo import wait_quiescent, wait_until
from agent_router.worker import install
from agent_router.worker.runtime import Runtime

ROOT = Path(__file__).parents[2]
CLI = str(Path(sys.executable).parent / "agent-router")
TIMEOUT = 60.0


def _host_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_ROUTER_", "CHAT_"))}
    env["PYTHONPATH"] = str(ROOT)  # tests.support.host_chat, from any working directory
    return {**env, **extra}


def _start_host_worker(
    env: dict[str, str], queue: str, log: Path, cwd: Path, host: str = "tests.support.host_chat"
) -> tuple[subprocess.Popen[bytes], str]:
    hostname = f"chat-{uuid.uuid4().hex[:8]}@localhost"
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", host, "worker",
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
    # One line says why the router is off here and what the variable accepts.
    assert text.count("agent-router is off in this process") == 1
    assert "AGENT_ROUTER_DATABASE_URL is not set; accepted: SQLAlchemy URL" in text
    assert "sweep failed" not in text and "no such table" not in text
    assert list(workdir.iterdir()) == []  # no agent_router.db, nothing else


#: The host's web process: its WSGI app served on a free port, the port printed first.
WEB = (
    "from wsgiref.simple_server import make_server; "
    "from tests.support.host_web import application; "
    "server = make_server('127.0.0.1', 0, application); "
    "print(server.server_port, flush=True); server.serve_forever()"
)


@pytest.mark.parametrize(
    ("database_url", "said"),
    [
        pytest.param(
            "mysql://chat:s3cret@db/chat",
            "AGENT_ROUTER_DATABASE_URL is invalid: database_url must be a sqlite:// or "
            "postgresql:// URL; accepted: SQLAlchemy URL",
            id="invalid",
        ),
        pytest.param(None, "AGENT_ROUTER_DATABASE_URL is not set; accepted:", id="unset"),
    ],
)
def test_a_host_with_a_bad_database_url_starts_serves_and_runs_its_own_tasks(
    redis_url: str, chat_queue: str, tmp_path: Path, database_url: str | None, said: str
) -> None:
    workdir = tmp_path / "host"
    workdir.mkdir()
    extra = {"CHAT_BROKER_URL": redis_url, "CHAT_QUEUE": chat_queue}
    if database_url is not None:
        extra["AGENT_ROUTER_DATABASE_URL"] = database_url
    env = _host_env(extra)
    log = tmp_path / "host-worker.log"
    worker, hostname = _start_host_worker(env, chat_queue, log, workdir, "tests.support.host_web")
    web_log = tmp_path / "web.log"
    web = subprocess.Popen(
        [sys.executable, "-c", WEB], env=env, cwd=workdir, stdout=subprocess.PIPE,
        stderr=web_log.open("w"), text=True,
    )  # fmt: skip
    client = Celery(broker=redis_url, set_as_current=False)
    try:
        _wait_ready(client, worker, hostname, log)
        assert web.stdout is not None
        port = int(web.stdout.readline() or 0)
        assert port, web_log.read_text()
        # The web process serves, and its request runs the host's task on the host's worker.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/shout?text=hello", timeout=60) as r:
            assert r.read() == b"HELLO"
        # The router's task, sent to this worker, fails with the typed line.
        client.send_task(RUN_AGENT_TURN, args=(1, 1), queue=chat_queue)
        wait_until(
            lambda: "RouterDisabledError" in log.read_text(), "the task to fail", timeout=TIMEOUT
        )
        assert worker.poll() is None and web.poll() is None
    finally:
        _stop(worker)
        web.terminate()
        web.wait(timeout=60)
        client.close()
    worker_text, web_text = log.read_text(), web_log.read_text()
    for text in (worker_text, web_text):
        # Once as the process made the host's app (the worker's failed task repeats it).
        startup = text.split("RouterDisabledError", 1)[0]
        assert startup.count("agent-router is off in this process") == 1, text
        assert said in startup
        assert "s3cret" not in text and "Traceback" not in startup
    assert f"RouterDisabledError: agent-router is off in this process: {said}" in worker_text
    assert "no such table" not in worker_text
    assert list(workdir.iterdir()) == []  # no agent_router.db, nothing else
