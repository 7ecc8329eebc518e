"""The ``agent-router`` console script. The command line needs the ``cli`` extra (typer, rich,
waitress), which a host that runs the router inside its own Celery app need not install; without
it the command says so in one line instead of a traceback."""

from __future__ import annotations

import sys

#: The distributions of the ``cli`` extra, by the name they are imported as.
CLI_MODULES = frozenset({"typer", "rich", "click", "waitress"})


def main() -> None:
    try:
        from agent_router.ops.cli import main as cli_main
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in CLI_MODULES:
            raise
        sys.exit(
            f"agent-router: error: the command line needs the cli extra ({exc.name} is not "
            "installed) (hint: pip install 'agent-router[cli]')"
        )
    cli_main()
