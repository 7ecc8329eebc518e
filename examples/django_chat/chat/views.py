"""``POST /rooms/`` opens a room; ``POST /rooms/<id>/`` posts a message (form field ``text``);
``GET /rooms/<id>/`` lists the room's messages, the lead's replies included."""

from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt

from chat import agents
from chat.models import Room


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
