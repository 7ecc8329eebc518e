"""Flower shows our turns: the real ``celery flower`` and a real ``agent-router worker`` (each a
subprocess) on the Redis broker, a turn run through them, and Flower's HTTP API read back.

The worker also serves Prometheus metrics (``AGENT_ROUTER_METRICS_PORT``); they are scraped too.
Everything runs on a private queue and private ports, and is stopped at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from celery import Celery
from celery.events.state import State
from kombu import Queue

from agent_router import Settings
from agent_router.agents.llm import SCRIPTED_MODEL
from agent_router.broker import create_app
from agent_router.constants import RUN_AGENT_TURN
from agent_router.ops.cli.processes import FLOWER_TASK_COLUMNS
from agent_router.ops.demo import wait_quiescent
from agent_router.worker import runtime
from tests.support.browser import chromium, screenshot

BIN = Path(sys.executable).parent
START_TIMEOUT = 60.0
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


def poll(
    fetch: Callable[[], T | None], what: str, log: Path, *, timeout: float = START_TIMEOUT
) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            value = fetch()
            if value is not None:
                return value
        time.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}; log:\n{log.read_text()[-4000:]}")


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A subprocess that is stopped (SIGTERM, then SIGKILL) whatever the test does."""
    with log.open("w") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class EventTap:
    """Celery's own event receiver on a thread: every task event, as sent."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.events: list[dict[str, Any]] = []
        self.ready = threading.Event()
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self.events.append})
            self.ready.set()
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def __enter__(self) -> EventTap:
        self._thread.start()
        assert self.ready.wait(10)
        time.sleep(0.5)  # the receiver's queue is bound once capture() consumes
        return self

    def __exit__(self, *exc: object) -> None:
        self._receiver.should_stop = True
        self._thread.join(timeout=10)


FLOWER_ROWS = """
return [...document.querySelectorAll("table tbody tr")].map((r) => r.innerText);
"""
#: The column headers shown (DataTables keeps a hidden copy of the header in the table).
FLOWER_HEADERS = """
return [...document.querySelectorAll("table thead th")]
  .filter((h) => h.getBoundingClientRect().height > 0).map((h) => h.textContent.trim());
"""
#: Each column's header and how far right it ends, the row's link to its task page, where the
#: table's box ends in the window and how far it scrolls sideways: what a reader of a 1400 px
#: window sees without scrolling.
FLOWER_LAYOUT = """
const heads = [...document.querySelectorAll("table thead th")]
  .filter((h) => h.getBoundingClientRect().height > 0);
const row = [...document.querySelectorAll("table tbody tr")].find((r) =>
  r.innerText.includes(arguments[0]));
const link = row && row.querySelector("a[href*='/task/']");
const table = document.getElementById("tasks-table");
const box = table.closest(".dataTables_scrollBody") || table.parentElement;
return {
  width: Math.min(document.documentElement.clientWidth, box.getBoundingClientRect().right),
  overflow: box.scrollWidth - box.clientWidth,
  columns: heads.map((h) => [h.textContent.trim(), h.getBoundingClientRect().right]),
  cells: row ? [...row.cells].map((c) => c.getBoundingClientRect().right) : [],
  link: link ? link.getAttribute("href") : null,
};
"""


#: The headers Flower gives the columns it can show.
FLOWER_LABELS = {"name": "Name", "uuid": "UUID", "args": "args", "state": "State",
                 "result": "Result", "received": "Received", "started": "Started",
                 "runtime": "Runtime", "worker": "Worker"}  # fmt: skip


def test_flower_columns_keep_the_uuid_and_the_turn_label() -> None:
    """The uuid is the row's only link to its task's page; args is the turn's label; state and
    runtime say how it went; received is what Flower's list sorts by (newest first), without
    which a new turn may be on any page."""
    columns = FLOWER_TASK_COLUMNS.split(",")
    assert {"uuid", "args", "state", "received", "runtime"} <= set(columns)
    assert set(columns) <= set(FLOWER_LABELS)


def flower_page_in_a_browser(base: str, label: str) -> None:
    """Flower's task list in a real browser: each turn reads as its label, state and result."""
    with chromium() as driver:
        driver.get(f"{base}/tasks")
        deadline = time.monotonic() + START_TIMEOUT
        rows: list[str] = []
        while time.monotonic() < deadline:
            rows = driver.execute_script(FLOWER_ROWS) or []
            if any(label in row for row in rows):
                break
            time.sleep(0.5)
        row = next((r for r in rows if label in r), None)
        assert row is not None, rows
        assert "SUCCESS" in row, row
        headers = driver.execute_script(FLOWER_HEADERS)
        assert headers == [FLOWER_LABELS[c] for c in FLOWER_TASK_COLUMNS.split(",")], headers
        # In the 1400 px window, every column ends inside it, the turn's row included, and the
        # uuid links to the task's page.
        layout = driver.execute_script(FLOWER_LAYOUT, label)
        assert layout["width"] <= 1400 and layout["overflow"] <= 0, layout
        for name, right in layout["columns"]:
            assert right <= layout["width"], (name, layout)
        assert layout["cells"] and max(layout["cells"]) <= layout["width"], layout
        assert layout["link"] is not None and "/task/" in layout["link"], layout
        assert not any(r.strip() == "agent_router.run_agent_turn" for r in rows)
        screenshot(driver, "flower_tasks")


def test_flower_shows_turn_tasks_with_readable_args(
    pg_schema_url: str, redis_url: str, tmp_path: Path
) -> None:
    settings = Settings(
        database_url=pg_schema_url,
        broker_url=redis_url,
        queue=f"agent_router.test.{uuid.uuid4().hex[:10]}",
        work_seconds=0.01,
        scripted_write_seconds=0.0,
        openai_model=SCRIPTED_MODEL,
    )
    flower_port, metrics_port = free_port(), free_port()
    hostname = f"ar-flower-{uuid.uuid4().hex[:8]}@localhost"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_ROUTER_", "FLOWER_"))}
    env.update(
        AGENT_ROUTER_DATABASE_URL=settings.database_url,
        AGENT_ROUTER_BROKER_URL=settings.broker_url,
        AGENT_ROUTER_QUEUE=settings.queue,
        AGENT_ROUTER_WORK_SECONDS="0.01",
        AGENT_ROUTER_SCRIPTED_WRITE_SECONDS="0",
        AGENT_ROUTER_OPENAI_MODEL=SCRIPTED_MODEL,
        AGENT_ROUTER_METRICS_PORT=str(metrics_port),
        AGENT_ROUTER_METRICS_CLUSTER_GAUGES="true",
        # The session database holds every earlier test's teams: no sweeping of their leftovers.
        AGENT_ROUTER_WORKER_SWEEPER="false",
        # Flower 2 serves its API only with authentication, or when told it may go without.
        FLOWER_UNAUTHENTICATED_API="true",
    )
    flower_log, worker_log = tmp_path / "flower.log", tmp_path / "worker.log"
    base = f"http://127.0.0.1:{flower_port}"
    app = create_app(settings, main=f"agent_router_flower_{uuid.uuid4().hex[:6]}")
    # Our command, with its defaults: 127.0.0.1 and the columns that show each turn's label.
    flower_cmd = [str(BIN / "agent-router"), "flower", f"--port={flower_port}"]
    worker_cmd = [str(BIN / "agent-router"), "worker", "--concurrency=4", f"--hostname={hostname}"]
    try:
        with process(flower_cmd, env, flower_log), process(worker_cmd, env, worker_log):
            poll(lambda: http_get(f"{base}/healthcheck") or None, "Flower's HTTP API", flower_log)
            poll(
                lambda: app.control.ping(destination=[hostname], timeout=0.5) or None,
                "the worker to answer a ping",
                worker_log,
            )
            # Flower knows the worker from its events: from now on it sees every task event.
            poll(
                lambda: hostname in json.loads(http_get(f"{base}/api/workers?refresh=1")) or None,
                "Flower to list the worker",
                flower_log,
            )

            rt = runtime.configure(settings, app=app)
            try:
                router = rt.router
                team = router.create_team()
                engineer = router.create_agent(team.id, role="Full-Stack Engineer")
                with EventTap(app) as tap:
                    router.send(
                        team.id, to=engineer.display_name, content="Add a /health endpoint."
                    )
                    wait_quiescent(router, team.id, timeout=60)
                    poll(
                        lambda: (
                            any(
                                e.get("agent") == "Team Leader" and e.get("action") == "turn_ended"
                                for e in tap.events
                            )
                            or None
                        ),
                        "the lead's progress events",
                        worker_log,
                        timeout=10,
                    )
            finally:
                runtime.reset()

            label = f"{engineer.display_name} (team {team.id}) epoch 1 [new]"

            def our_task() -> dict[str, Any] | None:
                url = f"{base}/api/tasks?taskname={RUN_AGENT_TURN}&limit=1000"
                tasks: dict[str, dict[str, Any]] = json.loads(http_get(url))
                for task in tasks.values():
                    if task.get("args") == label and task.get("state") == "SUCCESS":
                        return task
                return None

            task = poll(our_task, f"Flower to show {label!r} as SUCCESS", flower_log, timeout=30)
            assert task["name"] == RUN_AGENT_TURN
            assert task["kwargs"] == "{}"
            assert task["result"] == "'ended'"
            assert task["worker"] == hostname
            # Compact: names and numbers, never a transcript or a message's content.
            assert "health" not in json.dumps(task)

            # Routing and state changes were sent as task-started events of that very task.
            events = [e for e in tap.events if e.get("uuid") == task["uuid"]]
            progress = [e for e in events if "action" in e]
            assert {e["type"] for e in progress} == {"task-started"}
            # Celery's event state (Flower's) shows the turn STARTED until it succeeded.
            state = State()
            tasks: dict[str, Any] = state.tasks  # type: ignore[attr-defined]
            for event in events:
                if event["type"] == "task-succeeded":
                    assert tasks[task["uuid"]].state == "STARTED"
                state.event(event)
            assert tasks[task["uuid"]].state == "SUCCESS"
            # ... and its start is the turn's start, before its first progress event, not the
            # time of the last one.
            received = next(e["timestamp"] for e in events if e["type"] == "task-received")
            assert received <= tasks[task["uuid"]].started <= progress[0]["timestamp"]
            assert tasks[task["uuid"]].started < progress[-1]["timestamp"]
            steps = [(e["action"], e.get("agent_state") or e.get("outcome")) for e in progress]
            assert steps[0] == ("turn_claimed", "running")
            assert ("route", "triggered_new_turn") in steps  # its report woke the lead
            assert steps[-1] == ("turn_ended", "completed")
            assert "health" not in json.dumps(progress)

            # The lead's turn (woken by the completion report) is there too.
            lead_label = f"Team Leader (team {team.id}) epoch 1 [new]"
            url = f"{base}/api/tasks?taskname={RUN_AGENT_TURN}&limit=1000"
            args = {t.get("args") for t in json.loads(http_get(url)).values()}
            assert lead_label in args

            flower_page_in_a_browser(base, label)

            # The worker's log lines carry their context in the text (Celery's formatter).
            log = worker_log.read_text()
            # The lead's name, its id, and the Celery task the line was logged in (Flower's).
            assert f'route team_id={team.id} agent="Team Leader" agent_id=' in log, log[-3000:]
            assert "outcome=triggered_new_turn" in log
            # A turn's end is logged once, with how it ended, under its task's id.
            ended = [line for line in log.splitlines() if f"agent_id={engineer.id} " in line]
            ended = [line for line in ended if "turn_ended" in line or "turn ended" in line]
            assert len(ended) == 1, ended
            assert f"turn_ended team_id={team.id} " in ended[0]
            assert (
                f"agent_id={engineer.id} celery_task_id={task['uuid']} action=turn_ended"
                in (ended[0])
            )
            assert "failed=False state=completed" in ended[0]

            metrics = http_get(f"http://127.0.0.1:{metrics_port}/metrics").decode()
            assert 'agent_router_turns_started_total{trigger="new"} 2.0' in metrics
            assert 'agent_router_turn_duration_seconds_count{status="ended"} 2.0' in metrics
            assert 'agent_router_mailbox_depth{agent_state="completed"}' in metrics
    finally:
        with app.connection_for_write() as conn:
            Queue(settings.queue, channel=conn.default_channel).delete()
        app.close()
