"""The process-wide pieces a turn task needs: the Router, the models, the tools.

Built lazily from ``Settings()`` (``AGENT_ROUTER_*`` environment variables) the first time a task
runs in a worker process, so a forked worker child builds its own database pool. The models and
tools come from :func:`agent_router.agents.builder.build` (the team's, the role's or
``AGENT_ROUTER_OPENAI_MODEL``'s model; the roles' MCP servers and host functions), the same in
``agent-router worker``, a host's worker and ``agent-router run``;
``AGENT_ROUTER_RUNTIME_FACTORY`` replaces all of it with a host's own. The demo, the tests and a
host call :func:`configure` to override any of it.
"""

from __future__ import annotations

import enum
import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass

from celery import Celery

from agent_router.agents import builder
from agent_router.agents.llm import ModelFactory
from agent_router.agents.loop import run_turn
from agent_router.agents.tools import ToolRegistry
from agent_router.broker import CeleryPublisher, create_app
from agent_router.hooks import HookChain, RouterHooks
from agent_router.router import Router
from agent_router.settings import Settings
from agent_router.worker import hosting, metrics
from agent_router.worker.task_events import TaskEventHooks

#: Runs one claimed turn to its end (the built-in loop, or a host's own loop over the turn API);
#: returns its outcome (a ``StrEnum``), which becomes the task's result.
TurnRunner = Callable[..., enum.StrEnum]


@dataclass(frozen=True, kw_only=True)
class Runtime:
    router: Router
    models: ModelFactory
    tools: ToolRegistry
    app: Celery
    runner: TurnRunner = run_turn


class _Slot:
    """The process's runtime, swapped under a lock (worker threads read it concurrently)."""

    lock = threading.Lock()
    runtime: Runtime | None = None


def default_hooks(settings: Settings | None = None) -> RouterHooks:
    """What a worker reports: Flower task events of the running turn, Prometheus metrics, and
    OpenTelemetry spans when ``settings.tracing`` is on."""
    hooks: list[RouterHooks] = [TaskEventHooks(), metrics.default_hooks()]
    if settings is not None and settings.tracing:
        from agent_router.worker.tracing import TracingHooks

        hooks.append(TracingHooks())
    return HookChain(hooks)


def _build(
    settings: Settings,
    app: Celery | None,
    models: ModelFactory | None,
    tools: ToolRegistry | None,
    hooks: RouterHooks | None = None,
) -> Runtime:
    app = app or create_app(settings)
    router = (
        worker_router(settings, app)
        if hooks is None
        else Router(settings, publisher=CeleryPublisher(app), hooks=hooks)
    )
    if models is None or tools is None:
        built = builder.for_router(router)
        models, tools = models or built.models, tools or built.tools
    return Runtime(router=router, models=models, tools=tools, app=app)


def configure(
    settings: Settings | None = None,
    *,
    app: Celery | None = None,
    models: ModelFactory | None = None,
    tools: ToolRegistry | None = None,
    hooks: RouterHooks | None = None,
) -> Runtime:
    """Replace the process's runtime. ``app`` is where the Router publishes turn tasks (default:
    a new app for ``settings``); ``hooks`` default to :func:`default_hooks`. The previous
    Router's pool is closed."""
    new = _build(settings or Settings(), app, models, tools, hooks)
    with _Slot.lock:
        old, _Slot.runtime = _Slot.runtime, new
    if old is not None:
        old.router.close()
    return new


def current(app: Celery | None = None) -> Runtime:
    """The process's runtime, built from ``Settings()`` on first use (by
    ``Settings.runtime_factory`` when set). ``app`` is where turn tasks get published if the
    runtime has to be built now; by default the app of the task this thread runs (a host's
    task calling :func:`agent_router.agents.hosted.claim`): a host worker publishes follow-ups
    through its own app and broker, never an in-process ``memory://`` one that no worker
    reads."""
    with _Slot.lock:
        if _Slot.runtime is None:
            app = app or _running_task_app()
            hosting.require_enabled(app)  # install() left the router off in this host process
            settings = Settings()
            if settings.runtime_factory:
                _Slot.runtime = _from_factory(settings.runtime_factory, settings, app)
            else:
                _Slot.runtime = _build(settings, app, None, None)
        return _Slot.runtime


def _running_task_app() -> Celery | None:
    """The app of the Celery task this thread is running, if any."""
    from celery import current_task

    # A proxy of the thread's running task: false outside a task.
    return current_task.app if current_task else None


def worker_router(settings: Settings, app: Celery) -> Router:
    """The Router a worker's runtime needs: it publishes through ``app`` and reports what a
    worker reports (:func:`default_hooks`: Flower's task events, Prometheus metrics, traces).
    A ``runtime_factory`` builds its Runtime's router with this."""
    return Router(settings, publisher=CeleryPublisher(app), hooks=default_hooks(settings))


def _from_factory(spec: str, settings: Settings, app: Celery | None) -> Runtime:
    module, _, name = spec.partition(":")
    factory = getattr(importlib.import_module(module), name)
    built = factory(settings, app or create_app(settings))
    if not isinstance(built, Runtime):
        raise TypeError(f"{spec} returned {type(built).__name__}, not a Runtime")
    hooks = built.router.hooks
    if isinstance(hooks, HookChain) and not hooks.hooks:
        # A factory that built its Router with no hooks: its worker still reports its turns
        # to Flower and its metrics endpoint, as any worker does.
        built.router.hooks = default_hooks(settings)
    return built


def _router_and_tools() -> tuple[Router, ToolRegistry]:
    rt = current()
    return rt.router, rt.tools


# The turn API of a host's task (agents.hosted.claim) finds this process's router and tools here.
builder.serve_from(_router_and_tools)


def reset() -> None:
    """Forget the runtime (closing its pool); the next :func:`current` builds a fresh one."""
    with _Slot.lock:
        old, _Slot.runtime = _Slot.runtime, None
    if old is not None:
        old.router.close()
