from django.apps import AppConfig


class SurfacesConfig(AppConfig):
    """What people and programs use: the admin console (every page hangs off the run admin), the chat
    (page, SSE, WebSocket), the REST APIs of runs and AI Ops, the health probe and the management commands.
    No models: it reads through selectors and writes through services and the runtime."""

    name = "surfaces"
    verbose_name = "Console"
