"""System checks of the transparency log: signing keys must exist in production and be valid.

`audit.E001` (an error, so `manage.py check --deploy`, `migrate` and `runserver` refuse to start): DEBUG is
off and `AUDIT_SIGNING_KEYS` is empty. `audit.E002`: a configured signing key is not an Ed25519 key;
`audit.E003`: an `AUDIT_VERIFY_KEYS` entry is not an Ed25519 public key; `audit.E004`: the witnesses, the
witness policy or the origin cannot be used; `audit.E005`: the write keys (`AUDIT_WRITE_KEYS`,
`core.writeauth`) are missing while DEBUG is off, one is not base64 of 32 bytes, or one is also a
signing key. Messages never contain a key.
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
    keys = [k for k in settings.AUDIT_SIGNING_KEYS if k.strip()]
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
    for position, key in enumerate(settings.AUDIT_VERIFY_KEYS, start=1):
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


@register(Tags.security)
def check_witnesses(app_configs=None, **kwargs) -> list[Error]:
    """`audit.E004`: `AUDIT_WITNESSES`, `AUDIT_WITNESS_POLICY` / `AUDIT_WITNESS_QUORUM` or the origin
    cannot be used (a witness entry is not `<URL> <cosigner vkey>`, a policy key is not a cosigner vkey,
    the quorum is out of range, the origin is not a signed-note key name)."""
    from django.core.exceptions import ImproperlyConfigured

    from audit.transparency import signednote, witnesses

    errors = []
    for read in (witnesses.configured, witnesses.policy):
        try:
            read()
        except ImproperlyConfigured as exc:
            errors.append(Error(str(exc), id="audit.E004"))
    try:
        signednote.check_name(settings.AUDIT_LOG_ORIGIN)
    except signednote.SignedNoteError as exc:
        errors.append(Error(f"AUDIT_LOG_ORIGIN: {exc}", id="audit.E004"))
    return errors


@register(Tags.security)
def check_write_keys(app_configs=None, **kwargs) -> list[Error]:
    """`audit.E005`: see the module docstring."""
    from core.writeauth import WriteKeyError, parse_key

    keys = [k.strip() for k in settings.AUDIT_WRITE_KEYS if k.strip()]
    hint = (
        "Set AUDIT_WRITE_KEYS to one or more comma-separated keys, newest first: base64 of 32 random bytes "
        '(`python -c "import base64, os; print(base64.b64encode(os.urandom(32)).decode())"`), kept like '
        "the signing keys and never equal to one."
    )
    errors = []
    if not keys and not settings.DEBUG:
        errors.append(
            Error(
                "AUDIT_WRITE_KEYS is empty while DEBUG is off: nothing the service writes to the audit "
                "record can be authenticated.",
                hint=hint,
                id="audit.E005",
            )
        )
    signing = {k.strip() for k in settings.AUDIT_SIGNING_KEYS if k.strip()}
    for position, key in enumerate(keys, start=1):
        try:
            parse_key(key)
        except WriteKeyError:
            errors.append(
                Error(
                    f"AUDIT_WRITE_KEYS entry {position} is not base64 of 32 bytes.",
                    hint=hint,
                    id="audit.E005",
                )
            )
        if key in signing:
            errors.append(
                Error(
                    f"AUDIT_WRITE_KEYS entry {position} is also a checkpoint signing key: keep them apart.",
                    hint=hint,
                    id="audit.E005",
                )
            )
    return errors
