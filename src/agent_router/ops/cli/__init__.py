"""The ``agent-router`` command: ``demo``, ``run``, ``worker``, ``beat``, ``flower``, the
operator's reads (``status``, ``ledger``, ``inspect``), acts (``send``, ``stop``, ``terminate``,
``sweep``, ``budget``), ``db``, ``bench``, ``chaos``, ``doctor``, ``timeline`` and ``web``."""

# isort: skip_file
import gc
import os
import sys

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


#: The width help is laid out for when it goes to a pipe or a file (and COLUMNS does not say):
#: no line of it is cut to fit a terminal that is not there.
PIPE_WIDTH = 160


def main() -> None:
    if not sys.stdout.isatty() and not os.environ.get("COLUMNS"):
        import typer.rich_utils

        typer.rich_utils.MAX_WIDTH = typer.rich_utils.MAX_WIDTH or PIPE_WIDTH
    # What the imports built lives as long as the process: out of the collector's reach, it is
    # not scanned again by each collection nor at exit (a short command like `status` ends about
    # 0.1 s sooner).
    gc.freeze()
    failures.run_quietly_on_broken_pipe(app)
