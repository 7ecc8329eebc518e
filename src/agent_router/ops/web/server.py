"""``agent-router web``: a read-only live page over the router's database, safe to leave running.

The page (``/``, with its script and style under ``/static/``) reads JSON:

- ``GET /api/teams?offset=&limit=``: a page of the teams, each with its agents by state and its
  latest activity;
- ``GET /api/teams/N?after=&wait=``: the id of the team's latest event (what the page follows);
  with ``after``, the id the page has, a long poll: it waits on the team's feed signal
  (:meth:`Router.events`) without reading the database, and answers once the feed moves or
  ``wait`` is over;
- ``GET /api/teams/N/view?from=&to=&offset=&limit=&agent=&focus=``: a page of the team's agents
  (its table and its lanes, from one snapshot; the lead and the focused agent on every page)
  and, between two times, their turns, model calls and tool calls, messages and questions, and
  who in the team is blocked now (:func:`agent_router.ops.timeline.view`); the messages are
  cut at a cap, and the response says up to when they are complete;
- ``GET /api/teams/N/overview``: the whole team by time bucket, its idle gaps and its outside
  senders (:func:`agent_router.ops.timeline.overview`);
- ``GET /api/teams/N/messages/ID``, ``GET /api/teams/N/turns/ID``: one message's content and
  ledger line, one turn's ledger lines;
- ``GET /api/teams/N/agents/NAME/transcript?start=&limit=``: entries of an agent's transcript,
  with each entry's provenance.

Nothing here writes. What keeps it safe to leave running:

- only requests whose ``Host`` header names this server (127.0.0.1, localhost, [::1], the
  address it listens on, and the names it is given) are answered, so that a page of another
  site cannot read it through DNS rebinding;
- with a token (required when listening on anything but loopback), every request must carry it:
  ``Authorization: Bearer TOKEN``, or the cookie that opening ``/?token=TOKEN`` once sets (team
  ids are sequential: the token is what keeps a team from being read by whoever guesses one);
- waitress serves it: its event loop reads each request whole before one of a fixed number of
  threads answers it, and closes connections idle past a timeout, so slow or half-open
  connections hold no thread;
- a malformed id or parameter is a 4xx with one line of our own; a database error is a 503 that
  says only that; no response carries a driver's text or a traceback;
- responses forbid caching, framing and content sniffing, and the page's scripts run under a
  Content-Security-Policy that allows its own files only.
"""

from __future__ import annotations

import hmac
import http.cookies
import ipaddress
import json
import logging
import math
import re
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from importlib import resources
from typing import Any, cast

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import MultiSocketServer, TcpWSGIServer
from waitress.task import ThreadedTaskDispatcher

from agent_router import errors
from agent_router.feed import RedisSignals
from agent_router.ops import timeline
from agent_router.ops.explain import describe
from agent_router.router import Router
from agent_router.store.timeline import TimelineQuery
from agent_router.validation import MAX_ID, MAX_INT32, MAX_NAME_CHARS

logger = logging.getLogger(__name__)

#: Host names a server on loopback always answers to.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})
#: Open connections waitress keeps at most (each costs a socket, not a thread).
CONNECTION_LIMIT = 1000
#: Bytes of a request's headers, and of its body, that waitress reads at most.
MAX_HEADERS = 64 * 1024
MAX_BODY = 1024
#: Agents (lanes) of one page at most, and by default.
MAX_LANES = 500
DEFAULT_LANES = 60
#: Messages of one window at most, and by default.
MAX_ARROWS = 20_000
DEFAULT_ARROWS = 2500
#: Ledger events one window reads at most: a window of a huge team comes in pieces.
SCAN_EVENTS = 20_000
#: Teams of one page at most.
MAX_TEAMS = 500
#: Transcript entries of one page at most.
MAX_ENTRIES = 1000
#: The longest a window may reach, in seconds (about 30 years): past it a time is malformed.
MAX_SECONDS = 1e9
#: Overviews kept, by team and latest event.
OVERVIEW_CACHE = 32
#: The longest one long poll of ``/api/teams/N`` waits, in seconds.
LONGEST_WAIT = 25.0

_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/swimlane.js": ("swimlane.js", "text/javascript; charset=utf-8"),
    "/static/swimlane.css": ("swimlane.css", "text/css; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
}
_HEADERS = [
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
]
_DIGITS = re.compile(r"[0-9]{1,30}")
#: A token travels in a header, a cookie and a query string: characters none of them escape.
_TOKEN = re.compile(r"[A-Za-z0-9._~-]{16,}")


class BadRequestError(errors.InvalidArgumentError):
    """Raised when a request's path or query parameter is malformed."""


class _MissingTokenError(Exception):
    """The request carries no token, or the wrong one."""


@dataclass(frozen=True, kw_only=True)
class Access:
    """Who may read the page: the Host names it answers to, and the token it asks for."""

    hosts: frozenset[str]
    token: str | None
    cookie: str  # the token's cookie name (one per port: browsers share cookies across ports)


def access(host: str, port: int, *, token: str | None, names: Iterable[str] = ()) -> Access:
    """The access rules of a server listening on ``host``: the loopback names, the address
    itself (unless it is a wildcard), and ``names``; a token is required unless ``host`` is
    loopback. Raises :class:`~agent_router.errors.ConfigurationError` for a missing or short
    token."""
    if token is not None and not _TOKEN.fullmatch(token):
        raise errors.ConfigurationError(
            "the web token must be at least 16 characters long, of letters, digits and . _ ~ -"
        )
    if token is None and not is_loopback(host):
        raise errors.ConfigurationError(
            f"agent-router web listening on {host} needs a token (--token or "
            "AGENT_ROUTER_WEB_TOKEN): whoever reaches the port could read every team"
        )
    hosts = set(LOOPBACK_HOSTS) | {_host_name(n) for n in names if n.strip()}
    if host not in ("0.0.0.0", "::", ""):
        hosts.add(_host_name(f"[{host}]" if ":" in host else host))
    return Access(hosts=frozenset(hosts), token=token, cookie=f"agent_router_web_{port}")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(host: str) -> str:
    """A Host header without its port, lower-cased (``[::1]:8765`` -> ``[::1]``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


# ------------------------------------------------------------------------------ the views


def _integer(params: dict[str, str], name: str, default: int, maximum: int) -> int:
    value = params.get(name)
    if value is None or value == "":
        return default
    if not _DIGITS.fullmatch(value) or int(value) > maximum:
        raise BadRequestError(f"{name} must be an integer from 0 to {maximum}")
    return int(value)


def _seconds(params: dict[str, str], name: str) -> float | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise BadRequestError(f"{name} must be a number of seconds") from None
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_SECONDS):
        raise BadRequestError(f"{name} must be a number of seconds from 0 to {MAX_SECONDS:g}")
    return seconds


def _text(params: dict[str, str], name: str) -> str | None:
    value = params.get(name)
    if not value:
        return None
    if len(value) > MAX_NAME_CHARS or any(ord(c) < 32 for c in value):
        raise BadRequestError(f"{name} must be 1-{MAX_NAME_CHARS} printable characters")
    return value


def _id(text: str, what: str, unknown: type[errors.RefusedError]) -> int:
    """An id from a path: digits only; one past the largest id names nothing (404)."""
    if not _DIGITS.fullmatch(text):
        raise BadRequestError(f"{what} id must be a positive integer")
    value = int(text)
    if not 1 <= value <= MAX_ID:
        raise unknown(f"unknown {what} {value}")
    return value


class Views:
    """The JSON views, over one router. Each is a read; none writes."""

    def __init__(
        self, router: Router, *, waiters: int = 1, longest_wait: float = LONGEST_WAIT
    ) -> None:
        self.router = router
        self._overviews: OrderedDict[tuple[int, int], dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        # A long poll holds one of the server's threads while it waits: at most this many at
        # once, the others answered at once (their page asks again after a second).
        self._waiters = threading.BoundedSemaphore(waiters)
        self._longest_wait = longest_wait

    def teams(self, params: dict[str, str]) -> dict[str, Any]:
        offset = _integer(params, "offset", 0, MAX_ID)
        limit = _integer(params, "limit", 50, MAX_TEAMS) or 50
        total, teams = self.router.reads.team_summaries(offset=offset, limit=limit)
        return {
            "offset": offset,
            "limit": limit,
            "total": total,
            "items": [
                {
                    "team_id": t.team_id,
                    "created_at": f"{t.created_at.isoformat()}Z",
                    "agents": sum(t.states.values()),
                    "states": {s.value: n for s, n in sorted(t.states.items())},
                    "last_event_at": f"{t.last_event_at.isoformat()}Z" if t.last_event_at else None,
                }
                for t in teams
            ],
        }

    def team(self, params: dict[str, str], team: str) -> dict[str, Any]:
        """What the page follows: the id of the team's latest event (cheap: one index probe).

        With ``after`` (the id the page has) and ``wait`` (seconds, at most
        ``longest_wait``) while that is still the latest, a long poll: it waits on the
        team's feed signal (:meth:`Router.events` from that id: the messages to the lead and to
        the user, the lead's turns), sending the database nothing meanwhile, and answers when
        the feed moved or the wait is over, with the latest id again (which other agents'
        events move too). ``waited`` says whether it waited: a server without Redis, or with
        its waiting threads taken, answers at once, and the page asks again a second later."""
        team_id = _id(team, "team", errors.UnknownTeamError)
        after = _integer(params, "after", -1, MAX_ID) if params.get("after") else None
        wait = min(_seconds(params, "wait") or 0.0, self._longest_wait)
        self.router.team(team_id)  # an unknown team is a 404
        latest = self.router.reads.latest_event(team_id)
        answer = {"team_id": team_id, "last_event_id": latest, "waited": False}
        # Only a signal another process can send (Redis) is worth waiting for: in-process
        # signals never hear of a commit of the workers', so without Redis the page polls.
        if after != latest or wait <= 0 or not isinstance(self.router.signals, RedisSignals):
            return answer
        if not self._waiters.acquire(blocking=False):
            return answer
        try:
            deadline = time.monotonic() + wait
            while (left := deadline - time.monotonic()) > 0:
                items = self.router.events(team_id, after=latest, wait=left)
                if any(item.kind != "delta" for item in items):  # pieces of a reply: not yet
                    break
        finally:
            self._waiters.release()
        return answer | {"last_event_id": self.router.reads.latest_event(team_id), "waited": True}

    def view(self, params: dict[str, str], team: str) -> dict[str, Any]:
        start = _seconds(params, "from") or 0.0
        end = _seconds(params, "to")
        if end is not None and end < start:
            raise BadRequestError("to must not be before from")
        query = TimelineQuery(
            start=start,
            end=end,
            offset=_integer(params, "offset", 0, MAX_ID),
            limit=_integer(params, "limit", DEFAULT_LANES, MAX_LANES) or DEFAULT_LANES,
            name=_text(params, "agent"),
            focus=_text(params, "focus"),
            max_arrows=_integer(params, "max", DEFAULT_ARROWS, MAX_ARROWS) or DEFAULT_ARROWS,
            max_scan=SCAN_EVENTS,
        )
        return timeline.view(self.router, _id(team, "team", errors.UnknownTeamError), query)

    def overview(self, params: dict[str, str], team: str) -> dict[str, Any]:
        team_id = _id(team, "team", errors.UnknownTeamError)
        latest = self.router.reads.latest_event(team_id)
        key = (team_id, latest)
        with self._lock:
            if key in self._overviews:
                self._overviews.move_to_end(key)
                return self._overviews[key]
        data = timeline.overview(self.router, team_id)
        with self._lock:
            self._overviews[key] = data
            while len(self._overviews) > OVERVIEW_CACHE:
                self._overviews.popitem(last=False)
        return data

    def message(self, params: dict[str, str], team: str, message: str) -> dict[str, Any]:
        team_id = _id(team, "team", errors.UnknownTeamError)
        msg, events = self.router.reads.routed_message(
            team_id, _id(message, "message", errors.UnknownMessageError)
        )
        return {
            "message_id": msg.id,
            "from": msg.source_name,
            "to": msg.target_name,
            "type": msg.type.value,
            "subtype": msg.subtype.value if msg.subtype else None,
            "status": msg.status.value,
            "drop_reason": msg.drop_reason,
            "content": msg.content,
            "lines": [f"ledger #{e.id}: {describe(e, {msg.id: msg})}" for e in events],
        }

    def turn(self, params: dict[str, str], team: str, turn: str) -> dict[str, Any]:
        team_id = _id(team, "team", errors.UnknownTeamError)
        record, events = self.router.reads.turn_events(
            team_id, _id(turn, "turn", errors.UnknownTurnError)
        )
        return {"id": record.id, "lines": [describe(e, {}) for e in events]}

    def transcript(self, params: dict[str, str], team: str, name: str) -> dict[str, Any]:
        team_id = _id(team, "team", errors.UnknownTeamError)
        agent = self.router.agent(team_id, name)
        start = _integer(params, "start", 0, MAX_INT32)  # a position: a 32-bit column
        limit = _integer(params, "limit", 200, MAX_ENTRIES) or 200
        return {
            "team_id": team_id,
            "agent": agent.display_name,
            "state": agent.state.value,
            "start": start,
            "limit": limit,
            "entries": self.router.reads.transcript_entries(agent.id, start=start, limit=limit),
        }


_ROUTES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"/api/teams"), "teams"),
    (re.compile(r"/api/teams/([^/]*)"), "team"),
    (re.compile(r"/api/teams/([^/]*)/view"), "view"),
    (re.compile(r"/api/teams/([^/]*)/overview"), "overview"),
    (re.compile(r"/api/teams/([^/]*)/messages/([^/]*)"), "message"),
    (re.compile(r"/api/teams/([^/]*)/turns/([^/]*)"), "turn"),
    (re.compile(r"/api/teams/([^/]*)/agents/([^/]*)/transcript"), "transcript"),
]


# ------------------------------------------------------------------------------ the app


StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class WebApp:
    """The WSGI application: access rules first, then the page's files or a JSON view."""

    def __init__(
        self,
        router: Router,
        rules: Access,
        *,
        waiters: int = 1,
        longest_wait: float = LONGEST_WAIT,
    ) -> None:
        self.views = Views(router, waiters=waiters, longest_wait=longest_wait)
        self.rules = rules

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterator[bytes]:
        try:
            status, headers, body = self._respond(environ)
        except Exception:  # the last resort: nothing of the error leaves the server
            logger.exception("web request failed", extra={"action": "web"})
            status, headers, body = _json(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error")
        length = [("Content-Length", str(len(body)))]
        start_response(f"{status.value} {status.phrase}", headers + length + _HEADERS)
        return iter([] if environ.get("REQUEST_METHOD") == "HEAD" else [body])

    def _respond(self, environ: dict[str, Any]) -> tuple[HTTPStatus, list[tuple[str, str]], bytes]:
        host = _host_name(environ.get("HTTP_HOST", ""))
        if host not in self.rules.hosts:
            return _json(HTTPStatus.BAD_REQUEST, "this server does not answer to that Host")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            status, headers, body = _json(HTTPStatus.METHOD_NOT_ALLOWED, "read-only: GET only")
            return status, [*headers, ("Allow", "GET, HEAD")], body
        raw_path = _raw_path(environ)
        params = _params(environ.get("QUERY_STRING", ""))
        if self.rules.token is not None:
            given = params.get("token")
            if given is not None and environ.get("REQUEST_METHOD") == "GET":
                return self._enter(given, environ)
            try:
                self._check_token(environ)
            except _MissingTokenError:
                return _json(
                    HTTPStatus.UNAUTHORIZED,
                    "a token is required: open /?token=TOKEN once, or send "
                    "Authorization: Bearer TOKEN",
                )
        if raw_path in _STATIC:
            name, kind = _STATIC[raw_path]
            body = resources.files("agent_router.ops.web").joinpath("static", name).read_bytes()
            return HTTPStatus.OK, [("Content-Type", kind)], body
        for pattern, name in _ROUTES:
            match = pattern.fullmatch(raw_path)
            if match:
                try:
                    args = [urllib.parse.unquote(g, errors="strict") for g in match.groups()]
                except UnicodeDecodeError:
                    return _json(HTTPStatus.BAD_REQUEST, "the path is not UTF-8")
                return self._view(name, params, args)
        return _json(HTTPStatus.NOT_FOUND, "not found")

    def _check_token(self, environ: dict[str, Any]) -> None:
        expected = (self.rules.token or "").encode()
        auth = environ.get("HTTP_AUTHORIZATION", "")
        if auth.startswith("Bearer ") and hmac.compare_digest(auth[7:].encode(), expected):
            return
        cookies = http.cookies.SimpleCookie()
        try:
            cookies.load(environ.get("HTTP_COOKIE", ""))
        except http.cookies.CookieError:
            raise _MissingTokenError from None
        cookie = cookies.get(self.rules.cookie)
        if cookie is not None and hmac.compare_digest(cookie.value.encode(), expected):
            return
        raise _MissingTokenError

    def _enter(
        self, given: str, environ: dict[str, Any]
    ) -> tuple[HTTPStatus, list[tuple[str, str]], bytes]:
        """``?token=``: the right one sets the cookie and sends the browser to the same
        address without it (out of the history and the address bar)."""
        if not hmac.compare_digest(given.encode(), (self.rules.token or "").encode()):
            return _json(HTTPStatus.UNAUTHORIZED, "wrong token")
        rest = [
            (k, v)
            for k, v in urllib.parse.parse_qsl(environ.get("QUERY_STRING", ""))
            if k != "token"
        ]
        location = _own_path(_raw_path(environ)) + (
            "?" + urllib.parse.urlencode(rest) if rest else ""
        )
        cookie = f"{self.rules.cookie}={given}; Path=/; HttpOnly; SameSite=Strict"
        return (
            HTTPStatus.SEE_OTHER,
            [("Location", location), ("Set-Cookie", cookie)],
            b"",
        )

    def _view(
        self, name: str, params: dict[str, str], args: list[str]
    ) -> tuple[HTTPStatus, list[tuple[str, str]], bytes]:
        try:
            payload = getattr(self.views, name)(params, *args)
        except (
            errors.UnknownTeamError,
            errors.UnknownAgentError,
            errors.UnknownMessageError,
            errors.UnknownTurnError,
        ) as exc:
            return _json(HTTPStatus.NOT_FOUND, _line(exc))
        except errors.RefusedError as exc:  # a malformed id, name or parameter
            return _json(HTTPStatus.BAD_REQUEST, _line(exc))
        except errors.StoreError:
            logger.warning("web read failed", exc_info=True, extra={"action": "web"})
            return _json(HTTPStatus.SERVICE_UNAVAILABLE, "the database cannot be read now")
        body = json.dumps(payload, default=str).encode()
        return HTTPStatus.OK, [("Content-Type", "application/json")], body


def _line(exc: BaseException) -> str:
    """One line of our own error's text."""
    return " ".join(str(exc).split())[:300]


def _json(status: HTTPStatus, error: str) -> tuple[HTTPStatus, list[tuple[str, str]], bytes]:
    body = json.dumps({"error": error}).encode()
    return status, [("Content-Type", "application/json")], body


def _raw_path(environ: dict[str, Any]) -> str:
    """The request's path as it was sent (percent-escaped): a name holding ``/`` is one path
    segment, and the escapes are decoded as UTF-8 per segment."""
    uri = environ.get("REQUEST_URI")
    if uri:
        return urllib.parse.urlsplit(uri).path or "/"
    return urllib.parse.quote(environ.get("PATH_INFO", "/").encode("latin-1"), safe="/")


def _own_path(path: str) -> str:
    """``path`` when it is one of this server's own (the page, its files, a view), else ``/``:
    a redirect never names what a browser reads as another host (``/\\evil.example``,
    ``//evil.example``)."""
    if path in _STATIC or any(pattern.fullmatch(path) for pattern, _ in _ROUTES):
        return path
    return "/"


def _params(query: str) -> dict[str, str]:
    """A query string's parameters (the last of a repeated one). Malformed percent-escapes
    are refused by the views that read them, not here."""
    return dict(urllib.parse.parse_qsl(query, keep_blank_values=True))


def make_server(
    router: Router,
    host: str,
    port: int,
    *,
    rules: Access,
    threads: int = 8,
    timeout_seconds: float = 30.0,
    connection_limit: int = CONNECTION_LIMIT,
    longest_wait: float = LONGEST_WAIT,
) -> Any:
    """The server, bound and ready: ``run()`` serves until ``close()``. ``effective_port`` is
    the port it listens on (for port 0). ``timeout_seconds`` is each connection's idle timeout
    and each request's deadline: its headers must arrive within it of their first byte, its
    body within it of the headers. ``longest_wait``: the longest a long poll waits."""
    adj = Adjustments(
        host=host,
        port=port,
        threads=threads,
        channel_timeout=max(1, math.ceil(timeout_seconds)),
        cleanup_interval=max(1, min(math.ceil(timeout_seconds / 4), 10)),
        connection_limit=connection_limit,
        # poll(), not select(): select() takes no file descriptor past 1023.
        asyncore_use_poll=True,
        # Every request is a GET: a body is never read, and a big one is not buffered either.
        max_request_body_size=MAX_BODY,
        max_request_header_size=MAX_HEADERS,
        ident="agent-router-web",
        expose_tracebacks=False,
        clear_untrusted_proxy_headers=True,
    )
    dispatcher = ThreadedTaskDispatcher()
    dispatcher.set_thread_count(adj.threads)
    # Long polls take at most half the threads: the page's other reads always find one.
    app = WebApp(router, rules, waiters=max(1, threads // 2), longest_wait=longest_wait)
    sockets: dict[int, Any] = {}
    servers = [
        _GuardedServer(app, sockets, dispatcher=dispatcher, adj=adj, sockinfo=info)
        for info in adj.listen
    ]
    for server in servers:
        server.request_seconds = timeout_seconds
    if len(servers) == 1:
        return servers[0]
    listening = [(cast(Any, s).effective_host, cast(Any, s).effective_port) for s in servers]
    return MultiSocketServer(sockets, adj, listening, dispatcher, servers[-1].log_info)


class _Channel(HTTPChannel):
    """A connection that remembers when the request it is reading began, and when its headers
    ended: its deadline counts from there, however the bytes trickle in."""

    server: _GuardedServer

    def __init__(self, server: _GuardedServer, *args: Any, **kwargs: Any) -> None:
        # A connection that sends nothing yet is waiting for its first request.
        self.began: float | None = time.monotonic()
        self.headers_ended: float | None = None
        super().__init__(server, *args, **kwargs)
        server.waiting[self] = None

    def received(self, data: bytes) -> bool:
        now = time.monotonic()
        if self.request is None and self.began is None:
            self.began, self.headers_ended = now, None
            self.server.waiting[self] = None  # the newest: last in the order
        done = super().received(data)
        if self.request is None:  # read whole: it waits for a thread now, not for the client
            self.began = None
            self.server.waiting.pop(self, None)
        elif self.request.headers_finished and self.headers_ended is None:
            self.headers_ended = now
        return done

    def late(self, now: float, seconds: float) -> bool:
        """Whether the request being read is past its deadline: its headers ``seconds`` after
        its first byte, its body ``seconds`` after its headers."""
        if self.began is None or self.requests:
            return False
        return now - (self.headers_ended or self.began) > seconds

    def del_channel(self, map: Any = None) -> None:
        self.server.waiting.pop(self, None)
        super().del_channel(map)


class _GuardedServer(TcpWSGIServer):
    """waitress's server that closes a connection whose request is past its deadline, and that
    at its connection limit drops the connection that has waited longest for its request to
    make room for a new one, instead of accepting nothing more (what a slowloris wants)."""

    channel_class = _Channel
    #: The deadline of a request's headers, and of its body (set by :func:`make_server`).
    request_seconds = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: The connections reading a request, the longest waiting first.
        self.waiting: OrderedDict[_Channel, None] = OrderedDict()
        super().__init__(*args, **kwargs)

    def _full(self) -> bool:
        channels: dict[int, Any] = cast(Any, self).active_channels
        return len(channels) >= self.adj.connection_limit

    def readable(self) -> bool:
        # waitress's own, but for the limit: maintenance on its interval (timed in float
        # seconds, which waitress's type stubs call int).
        server: Any = self
        now = time.time()
        if now >= server.next_channel_cleanup:
            server.next_channel_cleanup = now + self.adj.cleanup_interval
            self.maintenance(now)
        return bool(self.accepting) and (not self._full() or self._longest_waiting() is not None)

    def _longest_waiting(self) -> _Channel | None:
        """The connection that has waited longest for its request, of those no thread is
        answering (one that sent a request behind the one being answered is left alone)."""
        return next((c for c in self.waiting if not c.requests), None)

    def handle_accept(self) -> None:
        if self._full() and (oldest := self._longest_waiting()) is not None:
            self.waiting.pop(oldest)
            oldest.handle_close()
        super().handle_accept()

    def maintenance(self, now: float) -> None:
        cast(Any, super()).maintenance(now)  # closes the idle ones
        clock = time.monotonic()
        for channel in list(self.waiting):
            if channel.late(clock, self.request_seconds):
                channel.will_close = True
                self.waiting.pop(channel, None)
