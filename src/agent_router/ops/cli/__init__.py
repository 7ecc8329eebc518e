"""The ``agent-router`` command: ``demo``, ``run``, ``worker``, ``beat``, ``flower``, the
operator's reads (``status``, ``ledger``, ``inspect``), acts (``send``, ``stop``, ``terminate``,
``sweep``, ``budget``), ``db``, ``bench``, ``chaos``, ``doctor``, ``timeline`` and ``web``."""

# isort: skip_file
import gc

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
    # What the imports built lives as long as the process: out of the collector's reach, it is
    # not scanned again by each collection nor at exit (a short command like `status` ends about
    # 0.1 s sooner).
    gc.freeze()
    failures.run_quietly_on_broken_pipe(app)
