"""System checks of reasoning governance: encryption keys must exist in production and be valid.

`reasoning.E001` (an error, so `manage.py check --deploy`, `migrate` and `runserver` refuse to start):
DEBUG is off and `REASONING_ENCRYPTION_KEYS` is empty. `reasoning.E002`: a configured value is not a
Fernet key. Messages never contain a key.
"""

from django.conf import settings
from django.core.checks import Error, Tags, register

from reasoning.crypto import validate_key


@register(Tags.security)
def check_encryption_keys(app_configs=None, **kwargs) -> list[Error]:
    keys = [k for k in settings.REASONING_ENCRYPTION_KEYS if k.strip()]
    errors = []
    if not keys and not settings.DEBUG:
        errors.append(
            Error(
                "REASONING_ENCRYPTION_KEYS is empty while DEBUG is off: reasoning content cannot be "
                "encrypted at rest.",
                hint="Set REASONING_ENCRYPTION_KEYS to one or more comma-separated Fernet keys, newest "
                "first (generate one with `python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())'`).",
                id="reasoning.E001",
            )
        )
    for position, key in enumerate(keys, start=1):
        try:
            validate_key(key)
        except ValueError:
            errors.append(
                Error(
                    f"REASONING_ENCRYPTION_KEYS entry {position} is not a Fernet key "
                    "(32 url-safe base64-encoded bytes).",
                    id="reasoning.E002",
                )
            )
    return errors
