"""Encryption at rest of reasoning and assistant text: Fernet keys, newest first, and the stored form.

Keys come from `REASONING_ENCRYPTION_KEYS`: the newest encrypts, every one decrypts; in development only
(`REASONING_DEV_KEY_FILE`) one key is generated once into a git-ignored file. Without keys it is
fail-closed: the check `reasoning.E001` stops the server and any encryption or decryption raises
`EncryptionKeysMissing`, so nothing is ever stored in plaintext for want of a key. A value is stored as
``fernet:<kid>:<token>`` (`<kid>`: a fingerprint of the key, never the key); a value without the prefix
is legacy plaintext, read as it is until `rotate_reasoning_keys` encrypts it.
Details: docs/api.md, *Encryption at rest*.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from core.devkeys import read_or_create
from core.settings_cache import built_from_settings

PREFIX = "fernet:"
KID_CHARS = 8


class EncryptionKeysMissing(ImproperlyConfigured):
    """No key is configured and no development key file is allowed (DEBUG off)."""


class Undecryptable(Exception):
    """A stored value that no configured key decrypts (its key was removed, or it was altered)."""


def key_id(key: str) -> str:
    """The public fingerprint of a key as it appears in stored values."""
    return hashlib.sha256(key.strip().encode("ascii")).hexdigest()[:KID_CHARS]


def is_encrypted(stored: str) -> bool:
    return stored.startswith(PREFIX)


def stored_key_id(stored: str) -> str | None:
    """The key id of a stored value, or None for legacy plaintext."""
    if not is_encrypted(stored):
        return None
    kid, sep, _ = stored[len(PREFIX) :].partition(":")
    return kid if sep else None


@dataclass(frozen=True, slots=True)
class Keyring:
    """The configured keys, newest first, with their fingerprints."""

    kids: tuple[str, ...]
    fernets: tuple[Fernet, ...]

    @property
    def current_kid(self) -> str:
        return self.kids[0]

    @property
    def current_prefix(self) -> str:
        """Every value encrypted under the newest key starts with this."""
        return f"{PREFIX}{self.current_kid}:"

    def encrypt(self, text: str) -> str:
        token = self.fernets[0].encrypt(text.encode("utf-8")).decode("ascii")
        return f"{self.current_prefix}{token}"

    def decrypt(self, stored: str) -> str:
        """Plaintext of a stored value (legacy plaintext is returned as it is)."""
        if not is_encrypted(stored):
            return stored
        kid = stored_key_id(stored)
        if kid is None or kid not in self.kids:
            raise Undecryptable(f"no configured key has id {kid}")
        fernet = self.fernets[self.kids.index(kid)]
        token = stored[len(PREFIX) + len(kid) + 1 :]
        try:
            return fernet.decrypt(token.encode("ascii")).decode("utf-8")
        except (InvalidToken, UnicodeError) as exc:
            raise Undecryptable(f"value under key {kid} does not authenticate") from exc

    def is_current(self, stored: str) -> bool:
        return stored.startswith(self.current_prefix)


def validate_key(key: str) -> None:
    """Raise ValueError unless `key` is a usable Fernet key (32 url-safe base64-encoded bytes)."""
    Fernet(key.strip().encode("ascii"))


def _keyring(keys: tuple[str, ...]) -> Keyring:
    cleaned = tuple(k.strip() for k in keys if k.strip())
    try:
        fernets = tuple(Fernet(k.encode("ascii")) for k in cleaned)
    except (ValueError, UnicodeError) as exc:
        # Never the key itself in the message.
        raise ImproperlyConfigured(
            "REASONING_ENCRYPTION_KEYS holds a value that is not a Fernet key"
        ) from exc
    return Keyring(kids=tuple(key_id(k) for k in cleaned), fernets=fernets)


@functools.lru_cache(maxsize=4)
def _dev_key(path: str) -> str:
    """Read the development key, creating it atomically (first process wins) if it does not exist."""
    return read_or_create(
        path,
        generate=lambda: Fernet.generate_key().decode("ascii"),
        validate=validate_key,
        what="a Fernet key",
    )


def configured_keys() -> list[str]:
    """The keys in effect, newest first: the configured ones, else the development key file's."""
    keys = [k.strip() for k in settings.REASONING_ENCRYPTION_KEYS if k.strip()]
    if keys:
        return keys
    dev_file = settings.REASONING_DEV_KEY_FILE
    if dev_file:
        return [_dev_key(str(dev_file))]
    raise EncryptionKeysMissing(
        "REASONING_ENCRYPTION_KEYS is empty: reasoning content cannot be encrypted. "
        "Generate a key with `python -c 'from cryptography.fernet import Fernet; "
        "print(Fernet.generate_key().decode())'`."
    )


@built_from_settings("REASONING_ENCRYPTION_KEYS", "REASONING_DEV_KEY_FILE")
def keyring() -> Keyring:
    """The keyring of the keys in effect, built once and again after a setting they come from changed
    (`core.settings_cache`)."""
    return _keyring(tuple(configured_keys()))
