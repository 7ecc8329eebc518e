"""Size limits over src/ (migrations aside), measured by scripts/size_report.py: no module over
600 lines, no class over 40 methods, no function over 60 lines."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def size_report() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "size_report", ROOT / "scripts" / "size_report.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["size_report"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def over(sizes: list[Any], limit: int) -> list[str]:
    return [str(s) for s in sizes if s.size > limit]


def test_no_module_class_or_function_over_its_limit() -> None:
    tool = size_report()
    report = tool.measure(ROOT / "src")
    assert report.modules and report.classes and report.functions
    assert not over(report.modules, tool.MAX_MODULE_LINES), "modules over 600 lines"
    assert not over(report.classes, tool.MAX_CLASS_METHODS), "classes over 40 methods"
    assert not over(report.functions, tool.MAX_FUNCTION_LINES), "functions over 60 lines"


def test_the_report_measures_what_it_says(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg" / "migrations").mkdir(parents=True)
    (src / "pkg" / "migrations" / "m.py").write_text("x = 1\n" * 700)
    methods = "".join(f"    def m{i}(self) -> None:\n        pass\n" for i in range(41))
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    (src / "pkg" / "big.py").write_text(
        f"class C:\n{methods}\n\n@staticmethod\ndef long() -> None:\n{body}"
    )
    report = size_report().measure(src)
    assert [m.path for m in report.modules] == ["pkg/big.py"]  # migrations left out
    assert [(c.name, c.size) for c in report.classes] == [("C", 41)]
    longest = max(report.functions, key=lambda f: f.size)
    assert (longest.name, longest.size) == ("long", 62)  # decorator and def line included
