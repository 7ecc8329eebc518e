"""Names shared with the outside world: Celery task names and Redis key names.

They live in one module so that a host app's routing rules, a Flower filter or a ``redis-cli``
session can find them, and so that renaming one is a single, visible change.
"""

from __future__ import annotations

from datetime import datetime

#: Every task of ours is named under this prefix, so a host app can route ``agent_router.*``.
TASK_PREFIX = "agent_router."

#: Claims the fenced turn ``(agent_id, epoch)`` and runs the agent loop.
RUN_AGENT_TURN = f"{TASK_PREFIX}run_agent_turn"

#: Redis keys are namespaced so the router can share a Redis database with its host.
REDIS_PREFIX = "agent_router:"


def wake_key(question_id: int, installation: str | None = None) -> str:
    """The list a blocked asker ``BLPOP``s on until its question is answered: named by the
    database's installation id (the store's ``installation_id``), so that databases sharing a
    Redis database never share a list; without one (a waker built on its own) by the question
    id alone, where the wake token tells another database's signal apart."""
    if installation is None:
        return f"{REDIS_PREFIX}wake:{question_id}"
    return f"{REDIS_PREFIX}wake:{installation}:{question_id}"


def feed_channel(installation: str, team_id: int) -> str:
    """The Redis pub/sub channel that wakes the readers of a team's feed and carries the
    pieces of its replies being written. Named by the database's installation id (the store's
    ``installation_id``) as well as the team's: pub/sub channels are shared by every database
    of a Redis server, and team ids start at 1 in every deployment."""
    return f"{REDIS_PREFIX}feed:{installation}:{team_id}"


def wake_token(deadline: datetime) -> str:
    """What a wake signal carries: its question's deadline, set once when the question opens,
    to the microsecond. A signal left by another database sharing the Redis database (whose
    question ids start at 1 as well) carries another, and the waiter re-reads instead."""
    return deadline.isoformat(timespec="microseconds")


#: One sweeper pass (beat-scheduled every ``Settings.sweep_seconds``).
SWEEP = f"{TASK_PREFIX}sweep"

#: Link / link_error callback of a background job: its completion becomes a notice.
BACKGROUND_DONE = f"{TASK_PREFIX}background_done"

#: Name of the sweeper's entry in the beat schedule.
SWEEP_SCHEDULE_ENTRY = "agent-router-sweep"
