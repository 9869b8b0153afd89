"""ASGI entry point served by daphne: HTTP through Django, WebSocket chat through channels.

`daphne -b 127.0.0.1 -p 8000 config.asgi:application` (or `manage.py runserver`, which is daphne's).

* HTTP: Django (REST API, SSE chat, admin, pages). With DEBUG on, static files are served here too, so a
  bare daphne serves the chat page's script and the admin's styles; in production put them behind the
  proxy (`manage.py collectstatic`, `STATIC_ROOT`).
* WebSocket `ws/chat/`: `ChatOriginValidator` (the `Origin` header must name an allowed host, as channels'
  `AllowedHostsOriginValidator`; a handshake without `Origin` is accepted only when it authenticates with
  a token), then `ChatAuthMiddleware` (session cookie, or `Authorization: Token <key>` for scripts; never
  a token in the query string, so tokens stay out of access logs). See docs/chat.md.
* `TrustedProxyHeaders` (outermost) removes forwarded headers that did not come from a `TRUSTED_PROXIES`
  peer; `WebSocketTlsRequired` closes a chat WebSocket that did not arrive over TLS with code 4426 when
  `WEBSOCKET_REQUIRE_TLS` (DEBUG off); see `core.proxy`.
* `BackgroundDuties` starts the process's sweeper, checkpointer, purge and AI Ops queue worker with the
  first connection (or at lifespan start-up); `python -m config.serve` (the shipped units) starts them
  at process start instead, see `agent.runtime.supervisor`.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

django_asgi_app = get_asgi_application()

# Imports that need the app registry loaded.
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from agent.runtime.supervisor import BackgroundDuties  # noqa: E402
from config.routing import websocket_urlpatterns  # noqa: E402
from core.proxy import TrustedProxyHeaders, WebSocketTlsRequired  # noqa: E402
from surfaces.chat.auth import ChatAuthMiddleware, ChatOriginValidatorFromSettings  # noqa: E402

http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.DEBUG else django_asgi_app

application = TrustedProxyHeaders(
    BackgroundDuties(
        ProtocolTypeRouter(
            {
                "http": http_app,
                "websocket": WebSocketTlsRequired(
                    ChatOriginValidatorFromSettings(ChatAuthMiddleware(URLRouter(websocket_urlpatterns)))
                ),
            }
        )
    )
)
