"""The lowest- and newest-versions runs (``./dev test-lowest``, ``./dev test-newest``) name their
tests by pytest node id: each one must exist, or those runs stop with "not found" at the end of
``./dev test``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _version_tests() -> list[str]:
    script = (ROOT / "dev").read_text()
    block = re.search(r"^VERSION_TESTS=\((.*?)^\)", script, re.S | re.M)
    assert block is not None, "VERSION_TESTS=( ... ) not found in ./dev"
    return [item.strip('"') for item in block.group(1).split()]


def test_every_test_of_the_versions_runs_exists() -> None:
    tests = _version_tests()
    assert len(tests) >= 5
    for node in tests:
        path, _, name = node.partition("::")
        assert (ROOT / path).is_file(), node
        if name:
            tree = ast.parse((ROOT / path).read_text())
            functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
            assert name in functions, node
