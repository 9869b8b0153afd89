"""System checks of the diagnosis runtime's configuration.

`diagnosis.E001` (an error: `runserver`, `migrate` and `check --deploy` refuse to start): `CHAT_RELEASE`
is neither `verified` nor `draft`. A typo must not silently pick a release policy.
"""

from django.conf import settings
from django.core.checks import Error, register

from diagnosis.models import ReleaseMode


@register()
def check_release_mode(app_configs=None, **kwargs) -> list[Error]:
    value = str(getattr(settings, "CHAT_RELEASE", ReleaseMode.VERIFIED)).strip().lower()
    if value in ReleaseMode.values:
        return []
    return [
        Error(
            f"CHAT_RELEASE={value!r} is not a release policy.",
            hint="Use `verified` (default: no answer text before the guards decide) or `draft` "
            "(unverified drafts are streamed and recorded as delivered).",
            id="diagnosis.E001",
        )
    ]
