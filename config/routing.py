"""WebSocket routes (served by daphne through `config.asgi`)."""

from django.urls import path

from surfaces.chat.consumers import ChatConsumer

websocket_urlpatterns = [
    path("ws/chat/", ChatConsumer.as_asgi(), name="ws-chat"),
]
