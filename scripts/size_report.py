"""Print the largest modules, the classes with the most methods and the longest functions in src/.

A size is a reason to look, not a limit: a module that runs long because what is in it belongs
together stays whole.

Sizes are read from the syntax tree (``ast``): a module's size is its line count, a class's its
number of methods (functions defined directly in its body), a function's the lines from its
``def`` (decorators included) to its last line. Alembic migrations are left out: they are
generated schema, not code anyone reads as logic.

    python scripts/size_report.py [SRC] [--all N]
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, kw_only=True)
class Size:
    """One measured thing: where it is, what it is called and how big it is."""

    path: str
    name: str
    size: int

    def __str__(self) -> str:
        where = f"{self.path}:{self.name}" if self.name else self.path
        return f"{self.size:5d}  {where}"


@dataclass(frozen=True, kw_only=True)
class Report:
    """Every module, class and function of a source tree with its size."""

    modules: list[Size]
    classes: list[Size]
    functions: list[Size]


def source_files(src: Path) -> Iterator[Path]:
    """The Python files under ``src``, migrations excluded."""
    for path in sorted(src.rglob("*.py")):
        if "migrations" not in path.relative_to(src).parts:
            yield path


def _function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return (node.end_lineno or node.lineno) - first + 1


def measure(src: Path) -> Report:
    """Measure every module, class and function under ``src``."""
    modules: list[Size] = []
    classes: list[Size] = []
    functions: list[Size] = []
    for path in source_files(src):
        text = path.read_text(encoding="utf-8")
        rel = str(path.relative_to(src))
        modules.append(Size(path=rel, name="", size=len(text.splitlines())))
        for node in ast.walk(ast.parse(text, filename=rel)):
            if isinstance(node, ast.ClassDef):
                methods = [
                    n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                ]
                classes.append(Size(path=rel, name=node.name, size=len(methods)))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions.append(Size(path=rel, name=node.name, size=_function_lines(node)))
    return Report(modules=modules, classes=classes, functions=functions)


def _largest(sizes: list[Size], count: int) -> list[Size]:
    return sorted(sizes, key=lambda s: s.size, reverse=True)[:count]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", nargs="?", type=Path, default=ROOT / "src")
    parser.add_argument("--all", type=int, default=1, metavar="N", help="show the N largest")
    args = parser.parse_args(argv)
    report = measure(args.src)
    for title, sizes in (
        ("largest module (lines)", report.modules),
        ("largest class (methods)", report.classes),
        ("longest function (lines)", report.functions),
    ):
        print(f"{title}:")
        for size in _largest(sizes, args.all):
            print(f"  {size}")


if __name__ == "__main__":
    main()
