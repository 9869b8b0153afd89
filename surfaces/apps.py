from django.apps import AppConfig

from core.product import PRODUCT_NAME


class SurfacesConfig(AppConfig):
    """What people and programs use: the admin console (every page hangs off the run admin), the chat
    (page, SSE, WebSocket), the REST APIs of runs and AI Ops, the health probe and the management commands.
    No models: it reads through selectors and writes through services and the runtime."""

    name = "surfaces"
    verbose_name = "Console"

    def ready(self) -> None:
        from django.contrib import admin

        from surfaces.api import auth_schema  # noqa: F401  (the token authentication's OpenAPI extension)
        from surfaces.mcp.metrics import RequestCounter
        from telemetry.metrics import register_process_collector

        register_process_collector(RequestCounter())  # the record's MCP endpoint's requests

        # The product's name on the login page and every console page, not "Django administration".
        admin.site.site_header = PRODUCT_NAME
        admin.site.site_title = PRODUCT_NAME
        admin.site.index_title = "Console"
