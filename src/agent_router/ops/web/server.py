"""``agent-router web``: a read-only UI over the router's database. The page polls JSON:

- ``GET /api/teams``: every team with its agents' states;
- ``GET /api/teams/N``: a team's agents (state, epoch, mailbox, questions, turns and messages);
- ``GET /api/teams/N/timeline``: the swimlane data (see :mod:`agent_router.ops.timeline`);
- ``GET /api/teams/N/agents/NAME/transcript``: an agent's transcript with each entry's provenance.

Nothing here writes: every request is a read of the database through the Router's store. The
standard library's threading HTTP server serves it (one thread a request); by default it listens
on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import logging
import re
import urllib.parse
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from agent_router import errors
from agent_router.ops.timeline import team_timeline
from agent_router.router import Router

logger = logging.getLogger(__name__)

_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/swimlane.js": ("swimlane.js", "text/javascript; charset=utf-8"),
    "/static/swimlane.css": ("swimlane.css", "text/css; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
}


def teams(router: Router) -> list[dict[str, Any]]:
    by_team: dict[int, list[dict[str, Any]]] = {}
    for s in router.store.reads.agent_statuses(None):
        by_team.setdefault(s.agent.team_id, []).append(
            {"name": s.agent.display_name, "state": s.agent.state.value}
        )
    return [{"team_id": t, "agents": agents} for t, agents in sorted(by_team.items())]


def team(router: Router, team_id: int) -> dict[str, Any]:
    data = team_timeline(router, team_id)
    agents = []
    for s in router.store.reads.agent_statuses(team_id):
        name = s.agent.display_name
        agents.append(
            {
                "name": name,
                "role": s.agent.role,
                "state": s.agent.state.value,
                "suspended": s.agent.suspended,
                "epoch": s.agent.epoch,
                "mailbox": s.agent.mailbox_depth,
                "open_questions": list(s.open_questions),
                "questions_to_answer": list(s.questions_to_answer),
                "turn_id": s.turn_id,
                "turns": sum(1 for t in data["turns"] if t["agent"] == name),
                "sent": sum(1 for m in data["messages"] if m["from"] == name),
                "received": sum(1 for m in data["messages"] if m["to"] == name),
            }
        )
    return {"team_id": team_id, "agents": agents, "last_event_id": data["last_event_id"]}


def transcript(router: Router, team_id: int, name: str) -> dict[str, Any]:
    agent = router.store.reads.agent(team_id, name)
    return {
        "team_id": team_id,
        "agent": agent.display_name,
        "state": agent.state.value,
        "entries": router.store.reads.transcript_entries(agent.id),
    }


_ROUTES: list[tuple[re.Pattern[str], Callable[..., Any]]] = [
    (re.compile(r"/api/teams"), teams),
    (re.compile(r"/api/teams/(\d+)"), lambda r, t: team(r, int(t))),
    (re.compile(r"/api/teams/(\d+)/timeline"), lambda r, t: team_timeline(r, int(t))),
    (
        re.compile(r"/api/teams/(\d+)/agents/([^/]+)/transcript"),
        lambda r, t, n: transcript(r, int(t), urllib.parse.unquote(n)),
    ),
]


def make_handler(router: Router) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "agent-router-web"

        def do_GET(self) -> None:
            path = urllib.parse.urlsplit(self.path).path
            if path in _STATIC:
                name, kind = _STATIC[path]
                body = resources.files("agent_router.ops.web").joinpath("static", name)
                self._send(HTTPStatus.OK, body.read_bytes(), kind)
                return
            for pattern, view in _ROUTES:
                match = pattern.fullmatch(path)
                if match:
                    self._json(view, router, *match.groups())
                    return
            self._send(HTTPStatus.NOT_FOUND, b'{"error": "not found"}', "application/json")

        def _json(self, view: Callable[..., Any], *args: Any) -> None:
            try:
                payload, status = view(*args), HTTPStatus.OK
            except errors.RefusedError as exc:  # an unknown team or agent
                payload, status = {"error": str(exc)}, HTTPStatus.NOT_FOUND
            except Exception as exc:
                logger.warning("web read failed", exc_info=True, extra={"action": "web"})
                payload, status = {"error": f"{type(exc).__name__}: {exc}"}, HTTPStatus(500)
            body = json.dumps(payload, default=str).encode()
            self._send(status, body, "application/json")

        def _send(self, status: HTTPStatus, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug(format, *args, extra={"action": "web"})

    return Handler


def make_server(router: Router, host: str, port: int) -> ThreadingHTTPServer:
    """The server, bound and ready; ``serve_forever()`` runs it."""
    server = ThreadingHTTPServer((host, port), make_handler(router))
    server.daemon_threads = True
    return server
