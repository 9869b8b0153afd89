"""System checks of the transparency log: signing keys must exist in production and be valid.

`audit.E001` (an error, so `manage.py check --deploy`, `migrate` and `runserver` refuse to start): DEBUG is
off and `AUDIT_SIGNING_KEYS` is empty. `audit.E002`: a configured signing key is not an Ed25519 key;
`audit.E003`: an `AUDIT_VERIFY_KEYS` entry is not an Ed25519 public key. Messages never contain a key.
"""

from django.conf import settings
from django.core.checks import Error, Tags, register

from audit.transparency.keys import validate_private, validate_public

KEY_HINT = (
    "Set AUDIT_SIGNING_KEYS to one or more comma-separated Ed25519 keys, newest first: base64 of a "
    '32-byte seed (generate one with `python -c "import base64, os; '
    'print(base64.b64encode(os.urandom(32)).decode())"`).'
)


@register(Tags.security)
def check_signing_keys(app_configs=None, **kwargs) -> list[Error]:
    keys = [k for k in getattr(settings, "AUDIT_SIGNING_KEYS", []) if k.strip()]
    errors = []
    if not keys and not settings.DEBUG:
        errors.append(
            Error(
                "AUDIT_SIGNING_KEYS is empty while DEBUG is off: transparency log checkpoints cannot be "
                "signed.",
                hint=KEY_HINT,
                id="audit.E001",
            )
        )
    for position, key in enumerate(keys, start=1):
        try:
            validate_private(key)
        except ValueError:
            errors.append(
                Error(
                    f"AUDIT_SIGNING_KEYS entry {position} is not an Ed25519 key.",
                    hint=KEY_HINT,
                    id="audit.E002",
                )
            )
    for position, key in enumerate(getattr(settings, "AUDIT_VERIFY_KEYS", []), start=1):
        if not key.strip():
            continue
        try:
            validate_public(key)
        except ValueError:
            errors.append(
                Error(
                    f"AUDIT_VERIFY_KEYS entry {position} is not an Ed25519 public key "
                    "(base64 of its 32 raw bytes).",
                    id="audit.E003",
                )
            )
    return errors
