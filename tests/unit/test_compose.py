"""compose/docker-compose.yml describes the deployment the docs describe: the services exist, they
share one image, every command of ours is a real ``agent-router`` command with real options, and
every AGENT_ROUTER_* variable is a real setting (or a real option's variable)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from agent_router.ops.cli import app
from agent_router.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
DOCKERFILE = ROOT / "compose" / "Dockerfile"


def services() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load(COMPOSE.read_text())
    return dict(data["services"])


def ours() -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services().items() if s.get("image") == "agent-router:latest"}


def resolve(argv: list[str]) -> tuple[Any, list[str]]:
    """The (click) command ``agent-router argv...`` runs, and the arguments left for it. Typer
    vendors its own click, so groups are recognised by their ``commands``, not by class."""
    command: Any = typer.main.get_command(app)
    args = list(argv)
    while hasattr(command, "commands") and args and not args[0].startswith("-"):
        sub = command.commands.get(args[0])
        assert sub is not None, f"no command {args[0]!r} in {argv}"
        command, args = sub, args[1:]
    assert not hasattr(command, "commands"), f"{argv} names a group, not a command"
    return command, args


def option_envvars(command: Any) -> set[str]:
    found: set[str] = set()
    for param in command.params:
        envvar = getattr(param, "envvar", None)
        if isinstance(envvar, str):
            found.add(envvar)
        elif envvar:
            found.update(envvar)
    return found


def test_the_topology_is_complete() -> None:
    names = set(services())
    assert {"postgres", "redis", "migrate", "beat", "flower"} <= names
    workers = [n for n, s in ours().items() if s["command"][:2] == ["agent-router", "worker"]]
    assert len(workers) == 2
    beats = [n for n, s in ours().items() if s["command"][:2] == ["agent-router", "beat"]]
    assert beats == ["beat"], "exactly one beat"
    # The migration job runs once, after PostgreSQL is up; the rest waits for it.
    migrate = services()["migrate"]
    assert migrate["command"] == ["agent-router", "db", "upgrade"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    # One exporter of the cluster gauges, read by the Prometheus of the compose file.
    assert ours()["metrics"]["command"][:2] == ["agent-router", "metrics"]
    assert "prometheus" in names and "grafana" in names
    for name in (*workers, "beat", "flower", "metrics"):
        depends = ours()[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert depends["redis"]["condition"] == "service_healthy", name
    assert "healthcheck" in services()["postgres"] and "healthcheck" in services()["redis"]


def test_one_image_built_from_the_dockerfile() -> None:
    mine = ours()
    assert set(mine) == set(services()) - {"postgres", "redis", "prometheus", "grafana"}
    for name, service in mine.items():
        assert service["build"] == {"context": "..", "dockerfile": "compose/Dockerfile"}, name
    dockerfile = DOCKERFILE.read_text()
    assert 'pip install ".[cli,flower]"' in dockerfile
    assert "COPY src ./src" in dockerfile


@pytest.mark.parametrize("name", sorted(ours()))
def test_each_command_is_a_real_cli_command_with_real_options(name: str) -> None:
    service = ours()[name]
    argv = service["command"]
    assert argv[0] == "agent-router", "every process of ours runs through the same CLI"
    command, args = resolve(argv[1:])
    known = {opt for p in command.params for opt in getattr(p, "opts", [])}
    passthrough = bool(command.context_settings.get("allow_extra_args"))
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in known:
            continue
        assert passthrough, f"{name}: {flag} is not an option of `agent-router {argv[1]}`"
    # Parsing accepts the arguments as they are written.
    command.make_context(argv[1], list(args), resilient_parsing=True)


@pytest.mark.parametrize("name", sorted(ours()))
def test_environment_names_real_settings(name: str) -> None:
    service = ours()[name]
    command, _ = resolve(service["command"][1:])
    settings = {f"AGENT_ROUTER_{field.upper()}" for field in Settings.model_fields}
    allowed = settings | option_envvars(command)
    env = service["environment"]
    for key in env:
        if key.startswith("AGENT_ROUTER_"):
            assert key in allowed, f"{name}: {key} is neither a setting nor an option"
        else:
            assert key.startswith("FLOWER_") and name == "flower", f"{name}: unexpected {key}"
    # The values are valid settings, too (Settings validates each one).
    Settings(**{k.removeprefix("AGENT_ROUTER_").lower(): v for k, v in env.items()
                if k in settings})  # fmt: skip
