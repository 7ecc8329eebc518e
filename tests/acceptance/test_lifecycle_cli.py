"""``agent-router team delete`` and ``agent-router prune`` from a shell: a dry run counts, a
real run deletes, an unknown team is one error line."""

from __future__ import annotations

import json
from pathlib import Path

from agent_router import Router, Settings

from .test_operate_cli import run


def test_team_delete_and_prune_with_dry_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    router = Router(Settings(database_url=url))
    router.create_schema()
    keep, doomed = router.create_team(), router.create_team()
    for team in (keep, doomed):
        router.create_agent(team.id, role="Engineer")
        router.send(team.id, to="Engineer_1", content="hello")
    router.close()

    # The team still owes its message (undelivered) and the turn it started: kept, one line.
    kept = run("team", "delete", str(doomed.id), database_url=url)
    assert kept.returncode == 1 and len(kept.stderr.splitlines()) == 1
    assert "still owes 1 undelivered messages" in kept.stderr
    assert "--include-undelivered" in kept.stderr
    owed = ["--include-undelivered"]
    dry = run("team", "delete", str(doomed.id), "--dry-run", "--json", *owed, database_url=url)
    assert dry.returncode == 0, dry.stderr
    counted = json.loads(dry.stdout)
    assert counted["dry_run"] and counted["teams"] == [doomed.id] and counted["total"] > 0
    assert counted["owed"]["undelivered_messages"] == 1
    real = run("team", "delete", str(doomed.id), "--json", *owed, database_url=url)
    assert json.loads(real.stdout)["rows"] == counted["rows"]
    ledger = run("ledger", str(doomed.id), "--json", database_url=url)
    (dropped,) = [json.loads(line) for line in ledger.stdout.splitlines()]
    assert dropped["action"] == "owed_dropped"  # the record outlives the team
    again = run("team", "delete", str(doomed.id), database_url=url)
    assert again.returncode == 1
    assert again.stderr.startswith(f"agent-router: error: unknown team {doomed.id} (hint: ")
    assert len(again.stderr.splitlines()) == 1

    # The kept team has a scheduled agent (its task was never claimed): not finished.
    pruned = run("prune", "--older-than-days", "0", "--dry-run", database_url=url)
    assert pruned.returncode == 0 and pruned.stdout.startswith("would delete teams -: ")
    assert Router(Settings(database_url=url)).team(keep.id).id == keep.id
