from django.apps import AppConfig


class AccessConfig(AppConfig):
    """Who may get in and how: hashed expiring API tokens, lockout of guessing (django-axes), the TOTP
    step-up for reasoning (django-otp), the governance log's signal receivers and the access review."""

    name = "access"
    verbose_name = "Access governance"

    def ready(self) -> None:
        # OpenAPI extension; the role groups after migrate; governance receivers.
        from access import groups, schema, signals  # noqa: F401
