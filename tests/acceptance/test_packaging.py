"""What `pip install agent-router` gets: the built wheel holds the package with its data files
(migrations, the role catalogue, py.typed) and the console script, and the demo and the
migrations run from the wheel's copy of the code, not from the source tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # No build isolation: hatchling comes with the dev extra, so no network is needed.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(ROOT)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (built,) = out.glob("agent_router-*.whl")
    return built


def test_wheel_holds_the_package_data_and_the_console_script(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
        metadata = zf.read(f"{dist_info}/METADATA").decode()
    for path in (
        "agent_router/py.typed",
        "agent_router/agents/roles.toml",
        "agent_router/agents/demo_roles.toml",
        "agent_router/store/migrations/env.py",
        "agent_router/store/migrations/script.py.mako",
        "agent_router/store/migrations/versions/0001_initial_schema.py",
        # The swimlane page and the web UI are drawn from these.
        "agent_router/ops/web/static/swimlane.js",
        "agent_router/ops/web/static/swimlane.css",
        "agent_router/ops/web/static/app.js",
        "agent_router/ops/web/static/index.html",
    ):
        assert path in names, path
    assert not any(n.startswith(("tests/", "src/")) for n in names)
    assert "agent-router = agent_router.ops.cli:main" in entry_points
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    for dependency in ("celery", "sqlalchemy", "alembic", "psycopg", "pydantic-settings"):
        assert any(dependency in r.lower() for r in requires), dependency


def test_the_installed_code_migrates_and_runs_the_demo(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    env["PYTHONPATH"] = str(site)  # ahead of the editable install of the source tree
    cli = "import sys; from agent_router.ops.cli import main; sys.argv[0] = 'agent-router'; main()"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", cli, *args], check=False, cwd=tmp_path,
                              capture_output=True, text=True, timeout=180, env=env)  # fmt: skip

    where = subprocess.run(
        [sys.executable, "-c", "import agent_router; print(agent_router.__file__)"],
        check=True, capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(site)
    url = f"sqlite:///{tmp_path / 'installed.db'}"
    upgraded = run("db", "upgrade", "--database-url", url)
    assert upgraded.returncode == 0, upgraded.stderr
    demo = run("demo", "--json", "--database-url", url)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    result = json.loads(demo.stdout.splitlines()[-1])
    assert result["event"] == "result" and result["ok"] is True


def test_a_host_pinning_celery_5_5_and_redis_6_installs_it_with_its_pins(
    wheel: Path, tmp_path: Path
) -> None:
    """pip's resolver, from the package index, for a fresh environment holding a host's pins
    and the wheel: every pin stays as it is. (Through ``celery[redis]``, kombu's cap on redis-py
    made this ResolutionImpossible: the router depends on what it imports, with no cap.)"""
    pins = {"celery": "5.5.3", "redis": "6.4.0"}
    requirements = tmp_path / "host-requirements.txt"
    requirements.write_text("".join(f"{name}=={version}\n" for name, version in pins.items()))
    report = tmp_path / "report.json"
    resolved = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), "-r", str(requirements), str(wheel)],
        check=False, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resolved.returncode == 0, resolved.stderr[-3000:]
    installed = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert {name: installed.get(name) for name in pins} == pins
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert installed["agent-router"] == project["version"]
    assert "kombu" in installed  # resolved with the rest, not left out
