"""The ``agent-router`` command: ``demo``, ``run``, ``worker``, ``beat``, ``flower``, the
operator's reads (``status``, ``ledger``, ``inspect``), acts (``send``, ``stop``, ``terminate``,
``sweep``, ``budget``), ``db``, ``bench``, ``chaos``, ``doctor``, ``timeline`` and ``web``."""

# isort: skip_file
# The modules register their commands on `app` in this order, which `--help` lists.
from agent_router.ops.cli.common import app, embedded_worker
from agent_router.ops.cli import failures
from agent_router.ops.cli import runs, processes, reads, acts, budgets, diagnose, views

__all__ = [
    "acts",
    "app",
    "budgets",
    "diagnose",
    "embedded_worker",
    "main",
    "processes",
    "reads",
    "runs",
    "views",
]


def main() -> None:
    failures.run_quietly_on_broken_pipe(app)
