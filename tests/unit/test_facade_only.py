"""The facade is the only door: the agent loop, the operator's tools and the worker reach the
database through the :class:`~agent_router.router.Router`'s methods and its read views
(``router.reads``), never through an attribute named ``store`` (a Router's, a Turn's, anyone's).
The import contract cannot see such a reach, as it is no import; this test reads the syntax
trees. Opening a store of their own by name (``agent_router.store.open_store``, ``make_engine``)
stays allowed: that is an import, which the contract orders."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "agent_router"
OUTSIDE_THE_CORE = ("agents", "ops", "worker")


def store_reaches(tree: ast.AST) -> list[int]:
    """The lines of ``tree`` that read an attribute named ``store``: ``x.store`` (an
    ``ast.Attribute``, whatever ``x`` is) or ``getattr(x, "store")``."""
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if (isinstance(node, ast.Attribute) and node.attr == "store")
        or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "hasattr", "setattr"}
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == "store"
        )
    )


def reaches_in(root: Path) -> list[str]:
    """``file:line`` of every reach through ``.store`` in the modules under ``root``."""
    found = []
    for package in OUTSIDE_THE_CORE:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            found += [f"{path.relative_to(root.parent)}:{n}" for n in store_reaches(tree)]
    return found


def test_agents_ops_and_worker_reach_no_store_attribute() -> None:
    assert [p for p in OUTSIDE_THE_CORE if (PACKAGE / p).is_dir()] == list(OUTSIDE_THE_CORE)
    found = reaches_in(PACKAGE)
    assert found == [], "use the Router's methods or router.reads:\n" + "\n".join(found)


def test_the_check_finds_each_shape_of_reach() -> None:
    source = "\n".join(
        [
            "from agent_router import store",  # an import by name is not a reach
            "router.store.reads.team(1)",
            "turn._router.store.drain(record)",
            "self.router.store",
            "getattr(router, 'store')",
            "router.reads.team(1)",  # the door
            "store = open_store(settings)",  # a store of its own
            "store.reads.team(1)",
        ]
    )
    assert store_reaches(ast.parse(source)) == [2, 3, 4, 5]


def test_a_reach_is_named_by_file_and_line(tmp_path: Path) -> None:
    root = tmp_path / "agent_router"
    for package in OUTSIDE_THE_CORE:
        (root / package).mkdir(parents=True)
    (root / "ops" / "tool.py").write_text("x = 1\nrouter.store.engine\n")
    (root / "store.py").write_text("self.store = store\n")  # the core may
    assert reaches_in(root) == ["agent_router/ops/tool.py:2"]
