"""The sweeper on a timer inside every worker process (``Settings.worker_sweeper``).

Beat's sweep is a task message on the turn queue, and the chaos run showed where that costs
recovery time: a pass waits behind turn tasks while every worker slot is busy, a pass held by a
worker that is then killed stays unacknowledged until the broker's visibility timeout (it has
expired by then, so it never runs), and no pass runs while the broker is away. A timer thread in
the worker's main process needs neither a slot nor a message: each worker sweeps every
``sweep_seconds``, starting at a random point of the period so that the passes of N workers
interleave, and a killed worker only takes its own timer with it. Until the worker is ready
(consuming), its passes only take over expired leases: that needs nothing but the database, so
a worker that starts while the broker is away, or while a Redis restart has ended every other
worker, still recovers dead turns within lease + sweep period; the rest of a pass waits, since a
worker that starts to a backlog already queued would see agents scheduled for a while and nothing
running, and re-enqueue every one.

Every step of a pass is idempotent and guarded in the store (a takeover re-checks the lease under
the agent lock, a re-enqueue skips locked rows), so timers in many workers, and beat on top of
them, duplicate at most a fenced turn task. Beat keeps working for whoever runs it.

``agent-router worker`` (and ``celery -A agent_router.celery_app worker``) install the step; a
host app adds it with :func:`install`, along with :class:`WorkerServes`, which logs at start what
the worker's turns run on.
"""

from __future__ import annotations

import os
import random
import threading
from typing import Any

from celery import Celery, bootsteps
from pydantic import ValidationError

from agent_router.logfields import get_logger
from agent_router.settings import Settings
from agent_router.worker import hosting

logger = get_logger(__name__)


def _worker_settings(app: Any, off: str, *, action: str) -> Settings | None:
    """The settings a worker step runs with; ``None`` when the router is off in this process
    (``install()`` said why, once, when the host's app was made) or a setting is invalid, which
    the step logs as one line, ``off``, naming the variable, never its value (a URL may hold a
    password). The worker runs on either way: the host's tasks need no router."""
    if hosting.disabled_reason(app) is not None:
        return None
    try:
        return Settings()
    except ValidationError as exc:
        logger.warning("%s: %s", off, hosting.invalid_setting(exc), extra={"action": action})
        return None


class WorkerSweeper(bootsteps.StartStopStep):
    """Worker bootstep: a :class:`~agent_router.worker.embedded.SweeperThread` in the worker's main
    process, from worker start to shutdown, unless ``Settings.worker_sweeper`` is off.

    It has its own :class:`~agent_router.router.Router` (one database connection at a time)
    rather than the turn runtime's, so that a prefork worker's children, which build their
    runtime after the fork, never share a connection pool with their parent."""

    label = "agent-router sweeper"

    def create(self, parent: Any) -> Any:
        settings = _worker_settings(parent.app, "agent-router sweeper off", action="sweep")
        if settings is None or not settings.worker_sweeper:
            return None
        if "database_url" not in settings.model_fields_set:
            # A host worker that has the router installed but not configured: sweeping the
            # default SQLite file would create it here and fail on every pass.
            logger.info(
                "agent-router sweeper off: AGENT_ROUTER_DATABASE_URL is not set",
                extra={"action": "sweep"},
            )
            return None
        # Imported here: the router pulls in the store and its driver, which a process that only
        # configures an app (beat, a sender) need not load.
        from agent_router.broker import CeleryPublisher
        from agent_router.router import Router
        from agent_router.worker.embedded import SweeperThread

        router = Router(settings, publisher=CeleryPublisher(parent.app))
        # A prefork pool's children are forks of this process: each drops its copy of this
        # router's connection pool, so that it never uses (or closes) the parent's connections.
        os.register_at_fork(after_in_child=router.after_fork)
        period = settings.sweep_seconds
        on_report = None
        if settings.metrics_port is not None:
            from agent_router.worker import metrics

            on_report = metrics.default_hooks().record_sweep
        return SweeperThread(
            router,
            period=period,
            first_after=random.uniform(0.0, period),
            on_report=on_report,
            ready=threading.Event(),
        )

    def start(self, parent: Any) -> None:
        """Start the timer: takeovers only until this worker is ready (its consumer takes
        tasks), whole passes from then on."""
        sweeper = self.obj
        if sweeper is None:
            return
        from celery.signals import worker_ready

        def ready(**_: Any) -> None:
            worker_ready.disconnect(ready)
            if sweeper.ready is not None:
                sweeper.ready.set()

        worker_ready.connect(ready, weak=False)
        sweeper.start()

    def stop(self, parent: Any) -> None:
        sweeper, self.obj = self.obj, None
        if sweeper is not None:
            sweeper.stop()
            sweeper.router.close()

    def terminate(self, parent: Any) -> None:
        self.stop(parent)


class WorkerServes(bootsteps.StartStopStep):
    """Worker bootstep: at start, one log record per model endpoint the worker's turns may call
    (model name and base URL, never the API key) and one per tool source (an MCP server by name
    and transport, a host-function module), as :func:`agent_router.agents.builder.build` builds
    them from ``Settings()``; a warning when no model is configured, and the factory's name when
    ``AGENT_ROUTER_RUNTIME_FACTORY`` builds the runtime instead."""

    label = "agent-router serves"

    def start(self, parent: Any) -> None:
        settings = _worker_settings(
            parent.app, "agent-router serves nothing", action="worker_model"
        )
        if settings is None:
            return
        try:
            log_serves(settings)
        except Exception:  # the turns report a bad configuration; the worker still starts
            logger.exception("agent-router: the models and tools cannot be built")


#: The log message of each kind of record :func:`log_serves` writes.
_SERVES = {
    "model": "agent-router serves model {model} at {base_url} ({source})",
    "mcp_server": "agent-router serves MCP server {server} ({transport})",
    "host_tools": "agent-router serves the host functions of module {host_module}",
}


def log_serves(settings: Settings) -> None:
    """Log what a worker with ``settings`` runs turns with (see :class:`WorkerServes`)."""
    if settings.runtime_factory:
        logger.info(
            "agent-router runtime from %s",
            settings.runtime_factory,
            extra={"action": "worker_runtime", "factory": settings.runtime_factory},
        )
        return
    from agent_router.agents.builder import build

    records = build(settings).describe()
    for record in records:
        # The message says it all: a host's worker prints no extra fields.
        logger.info(_SERVES[record["kind"]].format(**record), extra={
            "action": f"worker_{record['kind']}", **{k: v for k, v in record.items() if k != "kind"}
        })  # fmt: skip
    if not any(r.get("model") for r in records):
        logger.warning(
            "agent-router: no model configured; a turn fails unless its team or role names a "
            "model: set AGENT_ROUTER_OPENAI_MODEL",
            extra={"action": "worker_model"},
        )


def install(app: Celery) -> None:
    """Run the sweeper in every worker of ``app`` (it reads ``Settings()`` when a worker starts;
    ``AGENT_ROUTER_WORKER_SWEEPER=false`` turns it off), and log what its turns run on.
    Idempotent."""
    steps = app.steps["worker"]
    for step in (WorkerSweeper, WorkerServes):
        if step not in steps:
            steps.add(step)
