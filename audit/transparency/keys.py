"""The log's Ed25519 signing keys, from settings, and the public keys checkpoints are verified with.

`AUDIT_SIGNING_KEYS` lists private keys, newest first: the newest signs, every listed key's public key
verifies, and `AUDIT_VERIFY_KEYS` adds the public keys of retired keys so old checkpoints stay
verifiable. Private keys live in the environment (or, in development only, a generated file), never in
the database. With DEBUG off and no keys, the check `audit.E001` stops the server and signing raises
`SigningKeysMissing`.
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
    key_id: str
    private: Ed25519PrivateKey
    public: Ed25519PublicKey

    @property
    def public_text(self) -> str:
        return note.public_text(self.public)


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
        loaded.append(SigningKey(key_id=note.key_id(public), private=private, public=public))
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
        found.setdefault(note.key_id(public), public)
    return found


def published_keys() -> list[dict[str, object]]:
    """The public keys as the API publishes them: id, algorithm, base64 key, and whether it signs now."""
    signing = ""
    with contextlib.suppress(SigningKeysMissing):
        signing = current_key().key_id
    return [
        {
            "keyId": kid,
            "algorithm": "Ed25519",
            "publicKey": note.public_text(public),
            "signing": kid == signing,
        }
        for kid, public in verification_keys().items()
    ]
