"""Every option of every `agent-router` command can also come from an AGENT_ROUTER_*
environment variable (shown in --help), so a deployment configures the CLI like the worker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer.core
import typer.main

from agent_router.ops.cli import app


def _commands(command: Any, ctx: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if hasattr(command, "list_commands"):
        for name in command.list_commands(ctx):
            yield from _commands(command.get_command(ctx, name), ctx, f"{path} {name}".strip())
    else:
        yield path, command


ROOT = typer.main.get_command(app)
COMMANDS = dict(_commands(ROOT, ROOT.make_context("agent-router", [], resilient_parsing=True)))


def test_the_commands_are_all_found() -> None:
    assert {"demo", "worker", "beat", "status", "ledger", "send", "db upgrade"} <= set(COMMANDS)
    assert {"inspect message", "inspect agent", "bench", "chaos", "sweep"} <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_has_an_environment_variable(name: str) -> None:
    options = [p for p in COMMANDS[name].params if isinstance(p, typer.core.TyperOption)]
    assert options, name
    for option in options:
        assert isinstance(option.envvar, str), (name, option.name)
        assert option.envvar.startswith("AGENT_ROUTER_"), (name, option.name, option.envvar)
