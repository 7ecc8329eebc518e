"""A sender of a rolling deploy: it makes teams, or sends messages to their leads until a file
appears. The rolling-upgrade test runs it with either release's package first on the path, so
it uses only what both releases have (``Router``, ``Settings`` from ``AGENT_ROUTER_*``).

    python rolling_sender.py create N
        makes N teams and prints their ids, one a line
    python rolling_sender.py send LABEL STOP_FILE TEAM...
        a message to each team's lead every round (the first one also makes the team's lead
        create a sub-agent) until STOP_FILE exists; prints "TEAM MESSAGE_ID" for each message
        accepted
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from agent_router import Router, Settings

#: Seconds between two rounds of sends.
ROUND_SECONDS = 0.5

#: The directive that makes a lead create a sub-agent (the scripted model calls the tool).
CREATE = "@create_sub_agent " + json.dumps(
    {"role": "Full-Stack Engineer", "task": "Add a password reset."}
)


def main(argv: list[str]) -> None:
    router = Router(Settings())
    try:
        if argv[0] == "create":
            for _ in range(int(argv[1])):
                print(router.create_team().id, flush=True)
            return
        label, stop, teams = argv[1], Path(argv[2]), [int(t) for t in argv[3:]]
        n = 0
        while not stop.exists():
            for team in teams:
                content = f"{label} {n}" if n else f"{label} {n}\n{CREATE}"
                delivery = router.send(team, to="Team Leader", content=content)
                print(team, delivery.message_id, flush=True)
            n += 1
            time.sleep(ROUND_SECONDS)
    finally:
        router.close()


if __name__ == "__main__":
    main(sys.argv[1:])
