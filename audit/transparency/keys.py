"""The log's Ed25519 signing keys, from settings, and the public keys checkpoints are verified with.

`AUDIT_SIGNING_KEYS` lists private keys, newest first: the newest signs, every listed key's public key
verifies, and `AUDIT_VERIFY_KEYS` adds the public keys of retired keys so old checkpoints stay
verifiable. Private keys live in the environment (or, in development only, a generated file), never in
the database. With DEBUG off and no keys, the check `audit.E001` stops the server and signing raises
`SigningKeysMissing`. A key is named everywhere by its C2SP signed-note key id (`key_id`).
Details: docs/audit-integrity.md, *Keys*.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from audit.transparency import note
from core.devkeys import read_or_create


class SigningKeysMissing(ImproperlyConfigured):
    """No signing key is configured and no development key file is allowed (DEBUG off)."""


@dataclass(frozen=True, slots=True)
class SigningKey:
    key_id: str  # the C2SP signed-note key id under AUDIT_LOG_ORIGIN (8 hex), as checkpoints name it
    private: Ed25519PrivateKey
    public: Ed25519PublicKey

    @property
    def public_text(self) -> str:
        return note.public_text(self.public)

    @property
    def vkey(self) -> str:
        return note.log_vkey(settings.AUDIT_LOG_ORIGIN, self.public)


def key_id(public: Ed25519PublicKey) -> str:
    """The one key id this deployment shows for a log key (API, keys page, `audit_keys`, checkpoints'
    `keyId`): its C2SP signed-note key id under `AUDIT_LOG_ORIGIN`, 8 hex digits. The 16-hex id of the
    JSON checkpoints of before issue 35 (`note.key_id`) is published only as `legacyKeyId`."""
    return note.note_key_id(settings.AUDIT_LOG_ORIGIN, public)


def generate_key_text() -> str:
    """A new signing key in its configured form (base64 of a random 32-byte seed)."""
    return base64.b64encode(os.urandom(32)).decode("ascii")


def validate_private(text: str) -> None:
    """ValueError unless `text` is a usable signing key (`note.NoteError` is a ValueError)."""
    note.load_private(text)


def validate_public(text: str) -> None:
    note.load_public(text)


@functools.lru_cache(maxsize=4)
def _dev_key(path: str) -> str:
    return read_or_create(path, generate=generate_key_text, validate=validate_private, what="an Ed25519 key")


def configured_private_keys() -> list[str]:
    """The signing keys in effect, newest first: the configured ones, else the development key file's."""
    keys = [k.strip() for k in settings.AUDIT_SIGNING_KEYS if k.strip()]
    if keys:
        return keys
    dev_file = settings.AUDIT_DEV_SIGNING_KEY_FILE
    if dev_file:
        return [_dev_key(str(dev_file))]
    raise SigningKeysMissing(
        "AUDIT_SIGNING_KEYS is empty: checkpoints cannot be signed. Generate a key with "
        '`python -c "import base64, os; print(base64.b64encode(os.urandom(32)).decode())"`.'
    )


@functools.lru_cache(maxsize=8)
def _load(keys: tuple[str, ...]) -> tuple[SigningKey, ...]:
    loaded = []
    for position, text in enumerate(keys, start=1):
        try:
            private = note.load_private(text)
        except ValueError as exc:  # never the key itself in the message
            raise ImproperlyConfigured(f"AUDIT_SIGNING_KEYS entry {position} is not an Ed25519 key") from exc
        public = private.public_key()
        loaded.append(SigningKey(key_id=key_id(public), private=private, public=public))
    return tuple(loaded)


def signing_keys() -> tuple[SigningKey, ...]:
    """Every configured signing key, newest first (cached per key set, so settings overrides apply)."""
    return _load(tuple(configured_private_keys()))


def current_key() -> SigningKey:
    return signing_keys()[0]


def verification_keys() -> dict[str, Ed25519PublicKey]:
    """key id → public key of every key a checkpoint may be signed with: the signing keys and the retired
    public keys of `AUDIT_VERIFY_KEYS`. Empty when no key is configured (nothing verifies then)."""
    found: dict[str, Ed25519PublicKey] = {}
    with contextlib.suppress(SigningKeysMissing):
        for key in signing_keys():
            found[key.key_id] = key.public
    for position, text in enumerate(settings.AUDIT_VERIFY_KEYS, start=1):
        if not text.strip():
            continue
        try:
            public = note.load_public(text)
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"AUDIT_VERIFY_KEYS entry {position} is not an Ed25519 public key"
            ) from exc
        found.setdefault(key_id(public), public)
    return found


def published_keys() -> list[dict[str, object]]:
    """The public keys as the API publishes them: the signed-note key id (as checkpoints name it), the
    key's signed-note vkey (what witnesses and note verifiers are configured with), algorithm, base64
    key, whether it signs now, and the 16-hex id of the JSON checkpoints of before issue 35."""
    signing = ""
    with contextlib.suppress(SigningKeysMissing):
        signing = current_key().key_id
    return [
        {
            "keyId": kid,
            "vkey": note.log_vkey(settings.AUDIT_LOG_ORIGIN, public),
            "algorithm": "Ed25519",
            "publicKey": note.public_text(public),
            "signing": kid == signing,
            "legacyKeyId": note.key_id(public),
        }
        for kid, public in verification_keys().items()
    ]
