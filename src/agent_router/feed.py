"""Wake signals for a team's feed (:meth:`Router.events`): a reader that found nothing new
waits on its team's signal, not on the database, so a quiet team costs no statement while it
waits. Redis pub/sub in production (any process's commit reaches any process's reader), a
condition variable in the embedded mode. A reader starts listening before it reads, so a
signal sent between its read and its wait is not missed; a lost signal (Redis down) costs the
rest of the wait, never an event: the next read finds it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, Protocol

from agent_router.constants import feed_channel
from agent_router.logfields import get_logger

if TYPE_CHECKING:
    import redis

logger = get_logger(__name__)


class Listener(Protocol):
    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; ``True`` when a signal came since listening began."""


class TeamSignals(Protocol):
    def notify(self, team_id: int) -> None:
        """Something new is in the team's feed (sent after the commit that wrote it)."""

    def listen(self, team_id: int) -> Any:
        """A context manager giving a :class:`Listener` for the team's signals from now on."""


class _Counted:
    def __init__(self, signals: InProcessSignals, team_id: int) -> None:
        self._signals = signals
        self._team_id = team_id
        self._seen = signals.count(team_id)

    def wait(self, timeout: float) -> bool:
        return self._signals.wait_past(self._team_id, self._seen, timeout)


class InProcessSignals:
    """A counter per team under one condition: a listener waits for its team's counter to
    move past what it was when listening began. Only teams with a listener have a counter."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._counts: dict[int, int] = {}
        self._listeners: dict[int, int] = {}

    def notify(self, team_id: int) -> None:
        with self._condition:
            if team_id in self._counts:
                self._counts[team_id] += 1
                self._condition.notify_all()

    def count(self, team_id: int) -> int:
        with self._condition:
            return self._counts.get(team_id, 0)

    def wait_past(self, team_id: int, seen: int, timeout: float) -> bool:
        with self._condition:
            return self._condition.wait_for(
                lambda: self._counts.get(team_id, 0) != seen, timeout=max(timeout, 0.0)
            )

    @contextmanager
    def listen(self, team_id: int) -> Iterator[Listener]:
        with self._condition:
            self._listeners[team_id] = self._listeners.get(team_id, 0) + 1
            self._counts.setdefault(team_id, 0)
        try:
            yield _Counted(self, team_id)
        finally:
            with self._condition:
                self._listeners[team_id] -= 1
                if not self._listeners[team_id]:
                    del self._listeners[team_id], self._counts[team_id]


class _Subscribed:
    def __init__(self, pubsub: Any, error: type[Exception]) -> None:
        self._pubsub = pubsub
        self._error = error

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        try:
            while (left := deadline - time.monotonic()) > 0:
                message = self._pubsub.get_message(timeout=left)
                if message is not None and message.get("type") == "message":
                    return True
        except self._error as exc:
            logger.warning(
                "feed signals unavailable; the reader waits out its time",
                extra={"action": "feed_fallback", "error": repr(exc)},
            )
            time.sleep(max(0.0, deadline - time.monotonic()))
        return False


class RedisSignals:
    """``PUBLISH`` on ``agent_router:feed:<team>`` to notify; a reader ``SUBSCRIBE``s before
    it reads (the subscription is confirmed before the read), then waits for a message."""

    def __init__(self, url: str) -> None:
        import redis  # here, not at the top: a process without a feed reader never loads it

        self._client: redis.Redis = redis.Redis.from_url(url, socket_connect_timeout=2.0)
        self._error: type[Exception] = redis.RedisError

    def notify(self, team_id: int) -> None:
        try:
            self._client.publish(feed_channel(team_id), b"1")
        except self._error as exc:
            logger.warning(
                "feed signal not sent; readers find the event at their next read",
                extra={"action": "feed_signal_failed", "team_id": team_id, "error": repr(exc)},
            )

    @contextmanager
    def listen(self, team_id: int) -> Iterator[Listener]:
        pubsub = self._client.pubsub(ignore_subscribe_messages=False)
        try:
            try:
                pubsub.subscribe(feed_channel(team_id))
                # The confirmation: from here on no signal of the team is missed.
                pubsub.get_message(timeout=2.0)
            except self._error as exc:
                logger.warning(
                    "feed signals unavailable",
                    extra={"action": "feed_fallback", "team_id": team_id, "error": repr(exc)},
                )
            yield _Subscribed(pubsub, self._error)
        finally:
            with suppress(self._error):
                pubsub.close()

    def close(self) -> None:
        self._client.close()
