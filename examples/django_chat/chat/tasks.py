"""The lead's turns run in the chat's own task, through the router's turn API; each model call
goes through ``turn.complete``, which counts it against the team's budgets."""

from celery import shared_task
from django.conf import settings

from agent_router.agents import hosted
from chat.lead_model import ChatLeadClient
from chat.models import ChatMessage, Room


@shared_task(name="chat.lead_turn", acks_late=True, reject_on_worker_lost=True)
def lead_turn(agent_id: int, epoch: int) -> str:
    with hosted.claim(agent_id, epoch) as turn:
        if turn is None:  # a duplicate or stale delivery: the turn runs elsewhere
            return "refused"
        client = ChatLeadClient()  # openai.OpenAI() in a deployment
        while (text := turn.step(turn.complete(client, model=settings.CHAT_MODEL))) is None:
            pass  # tool calls ran (sub-agents created, questions answered); ask again
        room = Room.objects.get(team_id=turn.team_id)
        ChatMessage.objects.create(room=room, author=turn.display_name, text=text)
    return turn.outcome
