from django.urls import path

from chat import views

urlpatterns = [
    path("rooms/", views.rooms),
    path("rooms/<int:room_id>/", views.room),
    path("rooms/<int:room_id>/live", views.live),
    path("rooms/<int:room_id>/events", views.events),
]
