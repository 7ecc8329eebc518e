"""The CLI's read commands start without what only the worker and the acts need: a command
like ``agent-router status`` loads the store and the settings, not Celery, redis-py, the worker
runtime or the model SDKs."""

from __future__ import annotations

import json
import subprocess
import sys

#: Modules a read command never needs; each one costs tens of milliseconds to import.
NOT_AT_STARTUP = [
    "celery.app",
    "redis",
    "agent_router.worker.runtime",
    "agent_router.worker.celery_app",
    "agent_router.agents.loop",
    "openai",
    "mcp",
]


def _loaded_after(statement: str, modules: list[str]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has imported after running ``statement``."""
    found = f"[m for m in {modules!r} if m in sys.modules]"
    probe = f"{statement}\nimport json, sys\nprint(json.dumps({found}))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return list(json.loads(out.stdout.splitlines()[-1]))


def test_the_cli_starts_without_celery_redis_or_the_worker() -> None:
    assert _loaded_after("import agent_router.ops.cli", NOT_AT_STARTUP) == []


def test_the_package_loads_router_settings_and_turn_on_first_use() -> None:
    heavy = ["agent_router.router", "agent_router.settings", "agent_router.turn", "sqlalchemy"]
    assert _loaded_after("import agent_router", heavy) == []
    used = "from agent_router import Router, Settings, Turn"
    assert _loaded_after(used, heavy) == heavy
    assert _loaded_after("import agent_router as ar; ar.Settings", heavy) == [
        "agent_router.settings"
    ]
