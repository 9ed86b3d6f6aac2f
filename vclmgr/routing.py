from django.urls import path

from console.consumers import SerialConsumer, VNCConsumer
from core.consumers import EventConsumer

websocket_urlpatterns = [
    path("ws/events/", EventConsumer.as_asgi()),
    path("ws/console/<int:vm_id>/vnc/", VNCConsumer.as_asgi()),
    path("ws/console/<int:vm_id>/serial/", SerialConsumer.as_asgi()),
]
