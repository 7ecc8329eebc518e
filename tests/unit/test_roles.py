"""The shipped catalogues: a general-purpose default for a chat product, the demo's software
team beside it, and a lookup whose error names the roles there are."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_router import errors
from agent_router.agents.roles import DEMO_ROLES, ROLES_FILE_ENV, RoleCatalogue, roles_from_env


def test_the_default_catalogue_is_general_purpose_and_the_demo_ships_its_own() -> None:
    default = RoleCatalogue.default()
    assert [r.name for r in default.sub_agent_roles()] == ["Researcher", "Writer", "Assistant"]
    assert default.lead is not None and "software" not in default.lead.system_prompt
    demo = RoleCatalogue.demo()
    assert [r.name for r in demo.sub_agent_roles()] == ["UI Operator", "Full-Stack Engineer"]
    assert RoleCatalogue.from_file_or_default(DEMO_ROLES).names() == demo.names()
    assert RoleCatalogue.from_file_or_default(None).names() == default.names()


def test_the_roles_file_variable_picks_the_catalogue(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(ROLES_FILE_ENV, raising=False)
    assert "Researcher" in roles_from_env().names()
    monkeypatch.setenv(ROLES_FILE_ENV, DEMO_ROLES)
    assert "UI Operator" in roles_from_env().names()
    own = tmp_path / "roles.toml"
    own.write_text('[[roles]]\nname = "Support Agent"\nsystem_prompt = "You answer tickets."\n')
    monkeypatch.setenv(ROLES_FILE_ENV, str(own))
    assert roles_from_env().names() == ["Support Agent"]


def test_an_unknown_role_is_refused_with_the_roles_there_are() -> None:
    roles = RoleCatalogue.default()
    assert roles.sub_agent_role("Writer").name == "Writer"
    for name in ("Pirate", "Team Leader"):
        with pytest.raises(errors.UnknownRoleError) as refused:
            roles.sub_agent_role(name)
        assert refused.value.roles == ["Researcher", "Writer", "Assistant"]
        message = str(refused.value)
        assert message.startswith(f"unknown role {name!r}; roles: Researcher, Writer, Assistant")
        assert "\n" not in message and ROLES_FILE_ENV in message
    assert isinstance(refused.value, errors.RefusedError)
