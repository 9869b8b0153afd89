from django.apps import AppConfig


class AccessConfig(AppConfig):
    """Who may get in and how: hashed expiring API tokens, lockout of guessing (django-axes), the TOTP
    step-up for reasoning (django-otp), single sign-on (OpenID Connect) and the local password policy,
    the governance log's signal receivers and the access review."""

    name = "access"
    verbose_name = "Access governance"

    def ready(self) -> None:
        # The role groups after migrate; governance receivers; system checks; the single sign-on
        # receiver that clears the IdP's second factor at any other login. (The token authentication's
        # OpenAPI extension is the API's: `surfaces.api.auth_schema`.)
        from access import checks, groups, signals, sso  # noqa: F401
