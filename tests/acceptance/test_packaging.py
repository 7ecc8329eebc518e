"""What `pip install agent-router` gets: the built wheel holds the package with its data files
(migrations, the role catalogue, py.typed) and the console script, and the demo and the
migrations run from the wheel's copy of the code, not from the source tree."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tomllib
import uuid
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
    assert "agent-router = agent_router.ops.console:main" in entry_points
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


#: Run by the fresh environment's Python: a team on the router, a message to its lead, and the
#: turns a worker of that environment runs (the team names the built-in scripted model, which
#: needs no server), until the team has nothing left to do.
TEAM_RUN = """
import json
from agent_router import LedgerAction, Router, Settings
from agent_router.ops.demo import wait_quiescent

router = Router(Settings())
team = router.create_team(model="scripted")
router.create_agent(team.id, role="Full-Stack Engineer")
router.send(team.id, to="Team Leader", content="Status, please.")
wait_quiescent(router, team.id, timeout=120)
actions = {e.action.value for e in router.ledger(team.id)}
print(json.dumps({"lead": router.agent(team.id, "Team Leader").state.value,
                  "claimed": LedgerAction.TURN_CLAIMED.value in actions,
                  "ended": LedgerAction.TURN_ENDED.value in actions}))
router.close()
"""


@pytest.mark.postgres
@pytest.mark.redis
def test_a_plain_install_runs_a_worker_turn_on_redis_and_postgresql(
    wheel: Path, tmp_path: Path, redis_url: str, fresh_pg_url: str
) -> None:
    """``pip install agent-router`` alone (no extra, no dev tools) in a new environment: a
    worker (``celery -A agent_router.celery_app worker``) and a ``Router`` on a Redis broker and
    PostgreSQL run a team's turns. (Without ``packaging``, which kombu's Redis transport
    imports, the first publish failed with "No module named 'packaging'".) The command line
    is the ``cli`` extra's: without it, ``agent-router`` says so in one line."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python, bin_dir = str(venv / "bin" / "python"), venv / "bin"
    installed = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", str(wheel)],
        check=False, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    queue = f"plain.{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_ROUTER_", "PYTHON"))}
    env |= {
        "AGENT_ROUTER_DATABASE_URL": fresh_pg_url,
        "AGENT_ROUTER_BROKER_URL": redis_url,
        "AGENT_ROUTER_QUEUE": queue,
        "AGENT_ROUTER_SCRIPTED_WRITE_SECONDS": "0",
        "AGENT_ROUTER_WORK_SECONDS": "0",
        "AGENT_ROUTER_ROLES_FILE": "demo",  # the scripted lead staffs the demo's roles
    }

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*args], check=False, cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip

    schema = run(python, "-c", "from agent_router import Router, Settings; "
                 "Router(Settings()).create_schema()")  # fmt: skip
    assert schema.returncode == 0, schema.stderr[-3000:]
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [str(bin_dir / "celery"), "-A", "agent_router.celery_app", "worker", "--pool=threads",
         "--concurrency=4", "--loglevel=INFO", f"--hostname=plain-{queue}@localhost"],
        cwd=tmp_path, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        team = run(python, "-c", TEAM_RUN)
        assert worker.poll() is None, log.read_text()[-3000:]
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        _delete_queue(redis_url, queue)
    assert team.returncode == 0, team.stderr[-3000:] + log.read_text()[-3000:]
    assert json.loads(team.stdout.splitlines()[-1]) == {
        "lead": "completed",
        "claimed": True,
        "ended": True,
    }
    assert "No module named" not in log.read_text()
    # No command-line dependencies came with it, and the command says what it needs.
    assert run(python, "-c", "import typer").returncode != 0
    cli = run(str(bin_dir / "agent-router"), "status")
    assert cli.returncode == 1
    assert cli.stderr.strip() == (
        "agent-router: error: the command line needs the cli extra (typer is not installed) "
        "(hint: pip install 'agent-router[cli]')"
    )


def _delete_queue(redis_url: str, queue: str) -> None:
    from celery import Celery
    from kombu import Queue

    app = Celery(broker=redis_url, set_as_current=False)
    with app.connection_for_write() as conn:
        Queue(queue, channel=conn.default_channel).delete()
    app.close()


#: A chat backend's lock from late 2023 (after its move to pydantic 2): what it pins of what the
#: router depends on, directly or not.
HOST_LOCK = {
    "sqlalchemy": "2.0.23",
    "rich": "13.7.0",
    "typing-extensions": "4.9.0",
    "python-dotenv": "1.0.0",
    "pydantic": "2.5.3",
    "celery": "5.3.6",
    "kombu": "5.3.4",
    "redis": "5.0.1",
}


def test_a_host_locked_at_sqlalchemy_2_0_23_and_rich_13_7_installs_it_with_its_lock(
    wheel: Path, tmp_path: Path
) -> None:
    """pip's resolver, with the host's lock as constraints (``pip install -c constraints.txt
    agent-router``, as docs/integration.md says): it resolves, every locked version stays, and
    nothing of the command line (typer, rich) comes with it. With SQLAlchemy's floor at 2.0.36
    and typer and rich among the dependencies this was ResolutionImpossible."""
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in HOST_LOCK.items()))
    report = tmp_path / "report.json"
    resolved = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), "-c", str(constraints), str(wheel)],
        check=False, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resolved.returncode == 0, resolved.stderr[-3000:]
    installed = {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert {n: installed[n] for n in HOST_LOCK if n in installed} == {
        n: v for n, v in HOST_LOCK.items() if n != "rich"
    }
    assert "rich" not in installed and "typer" not in installed
