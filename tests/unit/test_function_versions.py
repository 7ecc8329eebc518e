"""The names a release installs its store functions under: every function of the files gets
the release's version, nothing else does, and every named statement calls those names."""

from __future__ import annotations

import re

from agent_router.store import functions

OTHER = "0123456789abcdef"


def test_every_installed_name_fits_in_a_postgresql_name() -> None:
    assert all(len(functions.installed_name(n)) <= functions.MAX_NAME for n in functions.names())


def test_only_functions_are_renamed() -> None:
    """Tables and types keep their names; a function's name inside another's stays whole."""
    statement = "SELECT ar_send(1) FROM ar_agents, ar_send_many(CAST(x AS ar_message_type))"
    assert functions.versioned(statement, OTHER) == (
        f"SELECT ar_send_v{OTHER}(1) FROM ar_agents, "
        f"ar_send_many_v{OTHER}(CAST(x AS ar_message_type))"
    )


def test_every_named_statement_and_every_definition_calls_this_releases_names() -> None:
    called = re.compile(r"\b(ar_\w+)\(")
    texts = [str(q) for q in functions.queries().values()] + [
        functions.versioned(functions.source())
    ]
    found = {name for text in texts for name in called.findall(text)}
    assert found == {functions.installed_name(n) for n in functions.names()}
