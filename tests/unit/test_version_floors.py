"""The lowest-versions run installs exactly the floors ``pyproject.toml`` declares: every core
dependency's lower bound, and those of the ``cli`` extra, is pinned in
``constraints/lowest.txt``, at that very version."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).parents[2]


def _floors() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors: dict[str, str] = {}
    for line in [*project["dependencies"], *project["optional-dependencies"]["cli"]]:
        req = Requirement(line)
        (lower,) = [s.version for s in req.specifier if s.operator == ">="]
        floors[canonicalize_name(req.name)] = lower
    return floors


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in (ROOT / "constraints" / "lowest.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_every_floor_is_pinned_at_that_version() -> None:
    floors, pins = _floors(), _pins()
    assert set(floors) <= set(pins)
    assert {n: Version(pins[n]) for n in floors} == {n: Version(v) for n, v in floors.items()}


def test_the_floors_a_chat_backend_runs_are_accepted() -> None:
    floors = _floors()
    # Celery 5.3 with redis-py 4.6, as chat backends run them, install without an upgrade.
    assert (floors["celery"], floors["kombu"], floors["redis"]) == ("5.3", "5.3", "4.6")


def test_the_command_lines_dependencies_are_not_the_hosts() -> None:
    """typer needs rich 13.8, which a host's lock may hold lower: they come with the ``cli``
    extra only, as the web server does."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {canonicalize_name(Requirement(line).name) for line in project["dependencies"]}
    assert not core & {"typer", "rich", "waitress"}
    assert canonicalize_name("packaging") in core  # kombu's Redis transport imports it
