"""docs/configuration.md is generated from Settings and committed up to date."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from agent_router.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_config_docs", ROOT / "scripts" / "gen_config_docs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_configuration_page_is_up_to_date() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == generator().render(), "run: python scripts/gen_config_docs.py"


def test_every_setting_is_documented_with_its_variable() -> None:
    page = generator().render()
    for name, field in Settings.model_fields.items():
        assert field.description, f"Settings.{name} needs a description"
        assert f"`AGENT_ROUTER_{name.upper()}`" in page, name


def test_every_default_is_a_value() -> None:
    page = generator().render()
    assert "PydanticUndefined" not in page
    # Settings whose default is made by a factory (an empty table) show that value.
    runners = next(line for line in page.splitlines() if "`AGENT_ROUTER_RUNNERS`" in line)
    assert "| `{}` |" in runners
