"""Who sees the tools that talk to the user: the lead both (``tell_user``, ``ask_user``), a
sub-agent ``tell_user`` only where its role says ``talks_to_user = true``, and none
``ask_user``."""

from __future__ import annotations

import pytest

from agent_router.agents.roles import RoleCatalogue
from agent_router.agents.tools import team_registry
from agent_router.domain import Agent, AgentState
from agent_router.errors import ConfigurationError

ROLES = """
[[roles]]
name = "Concierge"
system_prompt = "You talk to the user."
talks_to_user = true

[[roles]]
name = "Researcher"
system_prompt = "You research."
"""


def _agent(role: str, *, lead: bool = False) -> Agent:
    return Agent(
        id=1,
        team_id=1,
        display_name="Team Leader" if lead else f"{role}_1",
        role=role,
        is_lead=lead,
        state=AgentState.RUNNING,
        suspended=False,
        epoch=1,
        pending_trigger=None,
    )


def test_the_lead_and_roles_that_say_so_talk_to_the_user() -> None:
    registry = team_registry(RoleCatalogue.from_toml(ROLES))
    lead = set(registry.visible_names(_agent("Team Leader", lead=True)))
    concierge = set(registry.visible_names(_agent("Concierge")))
    researcher = set(registry.visible_names(_agent("Researcher")))
    assert {"tell_user", "ask_user"} <= lead
    assert "tell_user" in concierge
    assert "ask_user" not in concierge
    assert not {"tell_user", "ask_user"} & researcher


def test_talks_to_user_is_true_or_false() -> None:
    with pytest.raises(ConfigurationError, match="talks_to_user must be true or false"):
        RoleCatalogue.from_toml(ROLES.replace("talks_to_user = true", 'talks_to_user = "yes"'))
