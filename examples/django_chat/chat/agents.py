"""The chat backend's glue to agent-router: a team per room whose lead the chat's own task runs
(``chat.lead_turn`` on the chat queue); a user's message goes to the lead with ``send``."""

from chat_site.celery import app
from django.conf import settings

from agent_router import Router
from agent_router.worker import runtime
from chat.models import ChatMessage, Room

LEAD_RUNNER = f"chat.lead_turn@{settings.CHAT_QUEUE}"


def router() -> Router:
    return runtime.current(app).router  # AGENT_ROUTER_* settings; publishes through our app


def open_room() -> Room:
    team = router().create_team(lead_runner=LEAD_RUNNER, model=settings.CHAT_AGENT_MODEL)
    return Room.objects.create(team_id=team.id)


def post(room: Room, text: str, author: str = "user") -> None:
    ChatMessage.objects.create(room=room, author=author, text=text)
    router().send(room.team_id, to="Team Leader", content=text, sender=author)
