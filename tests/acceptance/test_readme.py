"""The README's example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parents[2] / "README.md"


def test_readme_starts_with_exactly_two_setup_commands() -> None:
    text = README.read_text()
    setup = text.split("## Set up", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in setup.strip().splitlines()]
    assert commands == ["./dev demo", "./dev test"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "./dev test" in ci


def test_readme_python_example_runs(tmp_path: Path) -> None:
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert block is not None
    result = subprocess.run(
        [sys.executable, "-c", block.group(1)],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "Build the login page." in result.stdout


def test_the_readme_activates_the_venv_before_its_first_agent_router_command() -> None:
    """The bare ``agent-router`` commands of the README need ``.venv`` (where ``./dev`` installs
    the CLI) on PATH: the README activates it before the first one, and ``./dev`` passes any
    other command on to that CLI."""
    text = README.read_text()
    blocks = [b.group(1) for b in re.finditer(r"```bash\n(.*?)```", text, re.S)]
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    first = next(i for i, line in enumerate(lines) if line.startswith("agent-router "))
    assert "source .venv/bin/activate" in [line.split("#")[0].strip() for line in lines[:first]]
    dev = (README.parent / "dev").read_text()
    assert "VENV=.venv\n" in dev
    assert 'exec "$VENV/bin/agent-router" "$cmd" "$@"' in dev
