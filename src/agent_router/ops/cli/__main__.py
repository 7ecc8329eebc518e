"""``python -m agent_router.ops.cli``: the ``agent-router`` command (the worker supervisor
starts its child this way)."""

from agent_router.ops.cli import main

main()
