"""The import contract in pyproject.toml (`lint-imports`): it holds on the source as committed,
and it breaks, naming the broken contract, when a lower layer imports a higher one or two
sibling modules import each other, even for annotations only."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
LAYERS = "Layers: ops > worker > agents > core > store > base"
CORE = "Core: router > budgeting, sweeper > hooks > turn, waker, outbox, broker"


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of src/ and pyproject.toml that a test may break."""
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """Run `lint-imports` over ``tree``'s copy of the package (not the installed one); its
    output without colours."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    result = subprocess.run(
        [str(LINT_IMPORTS), "--config", str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    result.stdout = ANSI.sub("", result.stdout)
    return result


def append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_contract_holds_on_the_source(copy: Path) -> None:
    result = lint_imports(copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 3 kept, 0 broken." in result.stdout


def test_an_upward_import_breaks_the_layers_contract(copy: Path) -> None:
    append(copy / "src/agent_router/store/models.py", "import agent_router.ops  # noqa")
    result = lint_imports(copy)
    assert result.returncode != 0
    assert LAYERS + " BROKEN" in result.stdout
    assert "agent_router.store.models -> agent_router.ops" in result.stdout


def test_a_core_module_importing_the_worker_breaks_the_layers_contract(copy: Path) -> None:
    append(copy / "src/agent_router/waker.py", "import agent_router.worker.runtime  # noqa")
    result = lint_imports(copy)
    assert result.returncode != 0
    assert LAYERS + " BROKEN" in result.stdout


def test_a_cycle_between_siblings_breaks_the_acyclic_contract(copy: Path) -> None:
    # formats imports domain; domain importing formats back closes a cycle inside the base
    # layer, which the layers contract alone allows (its modules are siblings of one layer).
    append(copy / "src/agent_router/domain.py", "import agent_router.formats  # noqa")
    result = lint_imports(copy)
    assert result.returncode != 0
    assert "No import cycles between sibling modules BROKEN" in result.stdout


def test_a_turn_importing_its_router_for_annotations_breaks_the_layers_contract(
    copy: Path,
) -> None:
    # The core's direction: the router uses turns, a turn knows its router as `TurnHost`. An
    # import made only for a type is still a dependency a reader has to follow back.
    append(
        copy / "src/agent_router/turn.py",
        "if TYPE_CHECKING:\n    from agent_router.router import Router  # noqa",
    )
    result = lint_imports(copy)
    assert result.returncode != 0
    assert CORE + " BROKEN" in result.stdout
    assert "agent_router.turn -> agent_router.router" in result.stdout


def test_the_budget_checks_importing_the_router_break_the_layers_contract(copy: Path) -> None:
    append(copy / "src/agent_router/budgeting.py", "import agent_router.router  # noqa")
    result = lint_imports(copy)
    assert result.returncode != 0
    assert CORE + " BROKEN" in result.stdout
    assert "agent_router.budgeting -> agent_router.router" in result.stdout
