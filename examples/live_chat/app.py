"""A chat page that streams a team to the browser with server-sent events: what the user says,
the lead's progress notes and questions, and its answers, live, each once.

Standard library only, beside agent-router. It takes the router's settings from the
``AGENT_ROUTER_*`` variables (database, broker, Redis) and leaves the turns to an
``agent-router worker`` on the same settings::

    agent-router worker &
    python examples/live_chat/app.py --port 8000      # then open http://127.0.0.1:8000/

``GET /`` opens a team and redirects to its page; ``POST /teams/<id>/messages`` (form field
``text``) sends the user's message to the lead (it answers an open ``ask_user`` question too);
``GET /teams/<id>/events`` is the feed as an event stream: ``Router.events`` read on from the
``Last-Event-ID`` the browser sends back when it reconnects, waiting on the team's signal
between events (no polling). Each stream ends after ``--stream-seconds`` and the browser
reconnects with its cursor, as it does after any dropped connection.

With ``AGENT_ROUTER_STREAM_TO_USER=true`` on the worker (and an OpenAI-compatible model), the
feed also carries the lead's reply while it is written (items of kind ``delta``, never stored):
the page shows that text as it grows, and puts the answer in its place once it is stored whole.
A piece sent while the browser was reconnecting is not sent again; the answer is."""

from __future__ import annotations

import argparse
import json
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import parse_qs

from agent_router import Router

#: What the page shows of a team's feed: the user's messages and the messages to the user.
SHOWN = ("user", "progress", "question", "answer")

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Team {team}</title><link rel="icon" href="data:,">
<style>
body {{ font: 15px system-ui, sans-serif; max-width: 50rem; margin: 2rem auto; }}
#chat {{ list-style: none; padding: 0; }}
#chat li {{ margin: .4rem 0; padding: .5rem .8rem; border-radius: .5rem; white-space: pre-wrap; }}
#chat li.user {{ background: #dbeafe; margin-left: 6rem; }}
#chat li.progress {{ color: #555; font-style: italic; }}
#chat li.question {{ background: #fef3c7; }}
#chat li.answer, #chat li.streaming {{ background: #dcfce7; }}
#chat li.streaming {{ opacity: .7; }}
textarea {{ width: 100%; height: 4rem; }}
</style></head>
<body data-team="{team}" data-connections="0" data-seen="">
<h1>Team {team}</h1>
<ul id="chat"></ul>
<form id="say"><textarea name="text" id="text"></textarea><button id="send">Send</button></form>
<script>
const team = document.body.dataset.team;
const chat = document.getElementById("chat");
const shown = {shown};
const streaming = new Map();  // a reply being written: its stream id -> its line
const seen = (kind) => {{ document.body.dataset.seen += kind + " "; }};
const source = new EventSource(`/teams/${{team}}/events`);
source.onopen = () => {{
  document.body.dataset.connections = Number(document.body.dataset.connections) + 1;
}};
source.addEventListener("feed", (event) => {{
  const item = JSON.parse(event.data);
  if (item.kind === "delta") {{
    let growing = streaming.get(item.stream);
    if (!growing) {{
      growing = document.createElement("li");
      growing.className = "streaming";
      growing.dataset.sender = item.sender;
      streaming.set(item.stream, growing);
      chat.append(growing);
      seen("delta");
    }}
    growing.textContent += item.content;
    return;
  }}
  if (!shown.includes(item.kind)) return;
  if (item.kind === "answer") {{  // stored whole: it takes the place of the streamed text
    for (const [stream, growing] of streaming) {{
      if (growing.dataset.sender === item.sender) {{ growing.remove(); streaming.delete(stream); }}
    }}
  }}
  seen(item.kind);
  const line = document.createElement("li");
  line.className = item.kind;
  line.dataset.cursor = event.lastEventId;
  line.textContent = item.content;
  chat.append(line);
}});
document.getElementById("say").addEventListener("submit", async (event) => {{
  event.preventDefault();
  const text = document.getElementById("text");
  const body = new URLSearchParams({{text: text.value}});
  await fetch(`/teams/${{team}}/messages`, {{method: "POST", body}});
  text.value = "";
}});
</script></body></html>
"""


class Chat(BaseHTTPRequestHandler):
    router: ClassVar[Router]
    stream_seconds: ClassVar[float] = 30.0

    def do_GET(self) -> None:
        if self.path == "/":
            team = self.router.create_team()
            self.send_response(303)
            self.send_header("Location", f"/teams/{team.id}")
            self.end_headers()
        elif match := re.fullmatch(r"/teams/(\d+)", self.path):
            body = PAGE.format(team=int(match[1]), shown=json.dumps(SHOWN)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif match := re.fullmatch(r"/teams/(\d+)/events", self.path):
            self.stream(int(match[1]))
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        match = re.fullmatch(r"/teams/(\d+)/messages", self.path)
        if match is None:
            self.send_error(404)
            return
        form = parse_qs(self.rfile.read(int(self.headers["Content-Length"] or 0)).decode())
        team_id = int(match[1])
        lead = self.router.team(team_id).lead.display_name
        self.router.send(team_id, to=lead, content=form["text"][0], sender="user")
        self.send_response(204)
        self.end_headers()

    def stream(self, team_id: int) -> None:
        """The feed from the browser's cursor on, until ``stream_seconds`` have passed."""
        after = int(self.headers.get("Last-Event-ID") or 0)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.wfile.write(b"retry: 500\n\n")
        self.wfile.flush()
        ends = time.monotonic() + self.stream_seconds
        while (left := ends - time.monotonic()) > 0:
            items = self.router.events(team_id, after=after, wait=min(left, 15.0))
            for item in items:
                after = item.cursor
                data = json.dumps(item.as_payload())
                self.wfile.write(f"id: {after}\nevent: feed\ndata: {data}\n\n".encode())
            if not items:
                self.wfile.write(b": quiet\n\n")  # a comment: the connection is alive
            self.wfile.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--stream-seconds", type=float, default=30.0)
    args = parser.parse_args()
    Chat.router = Router()
    Chat.stream_seconds = args.stream_seconds
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Chat)
    server.daemon_threads = True
    try:
        server.serve_forever()
    finally:
        Chat.router.close()


if __name__ == "__main__":
    main()
