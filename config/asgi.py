"""ASGI entry point served by daphne: HTTP through Django, WebSocket chat through channels.

HTTP goes to Django (static files too while DEBUG is on); the WebSocket `ws/chat/` passes
`ChatOriginValidator` and `ChatAuthMiddleware` (`surfaces.chat.auth`). `TrustedProxyHeaders` drops
forwarded headers from untrusted peers, `WebSocketTlsRequired` closes a chat socket not over TLS
(`core.proxy`); `/mcp` is the record's MCP endpoint when enabled (`surfaces.mcp.asgi`); `BackgroundDuties`
starts the duties (and refuses requests while draining); `LoopLagMonitor` samples the loop's lag. The
start-up heap is settled out of the cyclic collector's passes (`supervisor.settle`). Details:
docs/deployment.md, *Background duties*; docs/security.md, *Proxies and TLS*; docs/performance.md.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

django_asgi_app = get_asgi_application()

# Imports that need the app registry loaded.
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.urls import get_resolver  # noqa: E402

from agent.runtime.supervisor import BackgroundDuties, settle  # noqa: E402
from config.routing import websocket_urlpatterns  # noqa: E402
from core.proxy import TrustedProxyHeaders, WebSocketTlsRequired  # noqa: E402
from surfaces.chat.auth import ChatAuthMiddleware, ChatOriginValidatorFromSettings  # noqa: E402
from telemetry import loop_lag  # noqa: E402


class LoopLagMonitor:
    """ASGI wrapper: the first call on the serving loop starts its lag sampling (`telemetry.loop_lag`)."""

    def __init__(self, app) -> None:
        self.app = app
        self.started = False

    async def __call__(self, scope, receive, send):
        if not self.started:
            self.started = True
            loop_lag.start(float(settings.LOOP_LAG_SAMPLE_MS))
        return await self.app(scope, receive, send)


http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.DEBUG else django_asgi_app
if settings.MCP_SERVER_ENABLED:
    from surfaces.mcp.asgi import McpMount

    http_app = McpMount(http_app)

application = LoopLagMonitor(
    TrustedProxyHeaders(
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
)

# The URLconf and its reverse map, built here and frozen with the rest, not by the first request on the
# serving loop (the views' imports took 10-30 ms of it, docs/performance.md).
get_resolver().reverse_dict  # noqa: B018  (the property imports the URLconf and builds the map)

# Everything above lives as long as the process: out of the cyclic collector's full passes (see above).
settle()
