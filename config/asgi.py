"""ASGI entry point served by daphne: HTTP through Django, WebSocket chat through channels.

HTTP goes to Django (static files too while DEBUG is on); the WebSocket `ws/chat/` passes
`ChatOriginValidator` and `ChatAuthMiddleware` (`surfaces.chat.auth`). Outermost, `TrustedProxyHeaders`
drops forwarded headers from untrusted peers and `WebSocketTlsRequired` closes a chat socket that did
not arrive over TLS (`core.proxy`). With `MCP_SERVER_ENABLED`, `/mcp` is the record's MCP endpoint
(`surfaces.mcp.asgi`). `BackgroundDuties` starts the process's duties with the first
connection or at lifespan start-up, unless `python -m config.serve` already did at process start.
Details: docs/deployment.md, *Background duties*; docs/chat.md; docs/security.md, *Proxies and TLS*.
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
if settings.MCP_SERVER_ENABLED:
    from surfaces.mcp.asgi import McpMount

    http_app = McpMount(http_app)

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
