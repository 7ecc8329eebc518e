from django.db import models


class Room(models.Model):
    """A chat room; its agent team lives in the router (``team_id``)."""

    team_id = models.BigIntegerField(unique=True)


class ChatMessage(models.Model):
    room = models.ForeignKey(Room, on_delete=models.CASCADE, related_name="messages")
    author = models.CharField(max_length=200)
    text = models.TextField()
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
