"""Wake signals for a team's feed (:meth:`Router.events`): a reader that found nothing new
waits on its team's signal, not on the database, so a quiet team costs no statement while it
waits. Redis pub/sub in production (any process's commit reaches any process's reader), a
condition variable in the embedded mode. A reader starts listening before it reads, so a
signal sent between its read and its wait is not missed; a lost signal (Redis down) costs the
rest of the wait, never an event: the next read finds it.

The same channel carries the pieces of a reply being written (deltas): published, never stored,
they reach only the readers listening at that moment."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agent_router.constants import feed_channel
from agent_router.logfields import get_logger

if TYPE_CHECKING:
    import redis

logger = get_logger(__name__)


@dataclass(frozen=True)
class Wake:
    """What woke a reader: ``committed`` when something new was committed to the feed, and
    the pieces of replies being written (``deltas``, each a JSON-ready mapping) that came."""

    committed: bool
    deltas: tuple[Mapping[str, Any], ...] = ()


class Listener(Protocol):
    def wait(self, timeout: float) -> Wake | None:
        """Block up to ``timeout`` seconds; what came since listening began, or ``None``."""


class TeamSignals(Protocol):
    def notify(self, team_id: int) -> None:
        """Something new is in the team's feed (sent after the commit that wrote it)."""

    def say(self, team_id: int, delta: Mapping[str, Any]) -> None:
        """A piece of a reply being written, for the team's readers waiting now (not kept)."""

    def listen(self, team_id: int) -> Any:
        """A context manager giving a :class:`Listener` for the team's signals from now on."""


class _Mailbox:
    def __init__(self, signals: InProcessSignals) -> None:
        self._signals = signals
        self.committed = False
        self.deltas: list[Mapping[str, Any]] = []

    def wait(self, timeout: float) -> Wake | None:
        return self._signals.wait_on(self, timeout)


class InProcessSignals:
    """A mailbox per listener under one condition: a notification marks its team's, a delta
    is added to them; a listener waits for its own to fill."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._listeners: dict[int, set[_Mailbox]] = {}

    def notify(self, team_id: int) -> None:
        with self._condition:
            for box in self._listeners.get(team_id, ()):
                box.committed = True
            self._condition.notify_all()

    def say(self, team_id: int, delta: Mapping[str, Any]) -> None:
        with self._condition:
            for box in self._listeners.get(team_id, ()):
                box.deltas.append(delta)
            self._condition.notify_all()

    def wait_on(self, box: _Mailbox, timeout: float) -> Wake | None:
        with self._condition:
            if not self._condition.wait_for(
                lambda: box.committed or bool(box.deltas), timeout=max(timeout, 0.0)
            ):
                return None
            wake = Wake(committed=box.committed, deltas=tuple(box.deltas))
            box.committed, box.deltas = False, []
            return wake

    @contextmanager
    def listen(self, team_id: int) -> Iterator[Listener]:
        box = _Mailbox(self)
        with self._condition:
            self._listeners.setdefault(team_id, set()).add(box)
        try:
            yield box
        finally:
            with self._condition:
                self._listeners[team_id].discard(box)
                if not self._listeners[team_id]:
                    del self._listeners[team_id]


#: What a notification publishes; a delta is published as its JSON object.
_COMMITTED = b"1"


class _Subscribed:
    def __init__(self, pubsub: Any, error: type[Exception]) -> None:
        self._pubsub = pubsub
        self._error = error

    def wait(self, timeout: float) -> Wake | None:
        deadline = time.monotonic() + timeout
        try:
            while (left := deadline - time.monotonic()) > 0:
                message = self._pubsub.get_message(timeout=left)
                if message is not None and message.get("type") == "message":
                    return self._drained(message["data"])
        except self._error as exc:
            logger.warning(
                "feed signals unavailable; the reader waits out its time",
                extra={"action": "feed_fallback", "error": repr(exc)},
            )
            time.sleep(max(0.0, deadline - time.monotonic()))
        return None

    def _drained(self, data: bytes) -> Wake:
        """The first message and those already queued behind it, up to a notification."""
        deltas: list[Mapping[str, Any]] = []
        while data != _COMMITTED:
            deltas.append(json.loads(data))
            message = self._pubsub.get_message(timeout=0.0)
            if message is None or message.get("type") != "message":
                return Wake(committed=False, deltas=tuple(deltas))
            data = message["data"]
        return Wake(committed=True, deltas=tuple(deltas))


class RedisSignals:
    """``PUBLISH`` on ``agent_router:feed:<team>`` to notify; a reader ``SUBSCRIBE``s before
    it reads (the subscription is confirmed before the read), then waits for a message."""

    def __init__(self, url: str) -> None:
        import redis  # here, not at the top: a process without a feed reader never loads it

        self._client: redis.Redis = redis.Redis.from_url(url, socket_connect_timeout=2.0)
        self._error: type[Exception] = redis.RedisError

    def notify(self, team_id: int) -> None:
        try:
            self._client.publish(feed_channel(team_id), _COMMITTED)
        except self._error as exc:
            logger.warning(
                "feed signal not sent; readers find the event at their next read",
                extra={"action": "feed_signal_failed", "team_id": team_id, "error": repr(exc)},
            )

    def say(self, team_id: int, delta: Mapping[str, Any]) -> None:
        try:
            self._client.publish(feed_channel(team_id), json.dumps(delta, ensure_ascii=False))
        except self._error as exc:
            logger.warning(
                "feed delta not sent; readers get the reply whole when it is stored",
                extra={"action": "feed_delta_failed", "team_id": team_id, "error": repr(exc)},
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
