"""``POST /rooms/`` opens a room; ``POST /rooms/<id>/`` posts a message (form field ``text``);
``GET /rooms/<id>/`` lists the room's messages, the lead's replies included;
``GET /rooms/<id>/live`` is the room's live page, fed by ``GET /rooms/<id>/events``: the
team's feed as server-sent events."""

import json
import time
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt

from chat import agents
from chat.models import Room

PAGE = (Path(__file__).parent / "live.html").read_text()


@csrf_exempt
def rooms(request: HttpRequest) -> JsonResponse:
    room = agents.open_room()
    return JsonResponse({"room": room.id, "team": room.team_id}, status=201)


@csrf_exempt
def room(request: HttpRequest, room_id: int) -> JsonResponse:
    found = get_object_or_404(Room, pk=room_id)
    if request.method == "POST":
        agents.post(found, request.POST["text"])
    messages = [{"author": m.author, "text": m.text} for m in found.messages.all()]
    return JsonResponse({"messages": messages})


def live(request: HttpRequest, room_id: int) -> HttpResponse:
    get_object_or_404(Room, pk=room_id)
    return HttpResponse(PAGE)


def events(request: HttpRequest, room_id: int) -> StreamingHttpResponse:
    """The room's team feed read on from the ``Last-Event-ID`` the browser sends back when it
    reconnects, each item once; a stream ends after ``CHAT_STREAM_SECONDS`` (the browser
    reconnects, as after any dropped connection)."""
    team = get_object_or_404(Room, pk=room_id).team_id
    after = int(request.headers.get("Last-Event-ID") or 0)
    response = StreamingHttpResponse(_feed(team, after), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    return response


def _feed(team: int, after: int) -> Iterator[str]:
    yield "retry: 500\n\n"
    ends = time.monotonic() + settings.CHAT_STREAM_SECONDS
    while (left := ends - time.monotonic()) > 0:
        # Waits on the team's signal, not on the database, while nothing is new.
        items = agents.router().events(team, after=after, wait=min(left, 15.0))
        for item in items:
            after = item.cursor
            yield f"id: {after}\nevent: feed\ndata: {json.dumps(item.as_payload())}\n\n"
        if not items:
            yield ": quiet\n\n"  # a comment: the connection is alive
