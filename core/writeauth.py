"""Write authentication: the tag that says a chain link was written by this service, and the write keys.

Every link the service writes (each event of a run's chain, through `audit.write.chain_writer`, and of
the governance chain) carries a tag beside its hash: an HMAC-SHA-256 with a server write key that never
enters the database (`settings.AUDIT_WRITE_KEYS`, newest first: the newest tags, every listed one
verifies). A valid tag on an event authenticates its whole chain up to it. The MAC (`mac`, `key_id_of`,
`Verifier`) imports no Django; it lives in `core` because the identity layer tags the runs it creates.
Details: docs/audit-integrity.md, *Write authentication*.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import hashlib
import hmac
import os
from collections.abc import Iterable
from dataclasses import dataclass

from core.settings_cache import built_from_settings

RUN = "run"
GOVERNANCE = "governance"
# A run row as the service created it (`diagnosis.services.create_run`): its identity, before it executes.
RUN_CREATED = "run-created"
DOMAINS = frozenset({RUN, GOVERNANCE, RUN_CREATED})
KEY_BYTES = 32
KEY_ID_CHARS = 8
TAG_CHARS = KEY_ID_CHARS + 1 + 64  # "<key id>:<64 hex digits>", the stored column's form
_TAG_PREFIX = b"diagnosis-audit/write-tag/v1\n"
_KEY_ID_PREFIX = b"diagnosis-audit/write-key-id/v1\n"


class WriteKeyError(ValueError):
    """A write key that cannot be used (not base64 of 32 bytes); the message never holds the key."""


def parse_key(text: str) -> bytes:
    """The 32 bytes of a configured write key (base64); WriteKeyError otherwise."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise WriteKeyError("a write key is base64 of 32 random bytes") from exc
    if len(raw) != KEY_BYTES:
        raise WriteKeyError("a write key is base64 of 32 random bytes")
    return raw


def key_id_of(key: bytes) -> str:
    """The key's id: 8 hex digits of SHA-256 over a fixed prefix and the key (reveals nothing of it)."""
    return hashlib.sha256(_KEY_ID_PREFIX + key).hexdigest()[:KEY_ID_CHARS]


def _message_prefix(key_id: str, domain: str) -> bytes:
    """What a tag's message holds before the link hash: the tag prefix, the domain and the key id."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown tag domain {domain!r}")
    return b"".join((_TAG_PREFIX, domain.encode("ascii"), b"\n", key_id.encode("ascii"), b"\n"))


def mac(key: bytes, key_id: str, domain: str, link_hash: str) -> str:
    """The 64 hex digits of HMAC-SHA-256 over the domain, the key id and the link hash."""
    return _mac(key, _message_prefix(key_id, domain), link_hash)


def _mac(key: bytes, prefix: bytes, link_hash: str) -> str:
    return hmac.digest(key, prefix + link_hash.encode("ascii"), "sha256").hex()


class _KeyedMac:
    """`_mac` with one key, its HMAC-SHA-256 inner and outer hash states keyed once (RFC 2104), copied
    for each link: OpenSSL's one-shot HMAC looks the digest up and keys a new context on every call
    (about 2.5× the cost of the two copies). The same MAC (`tests/audit/test_recorder_fast_paths.py`)."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        block = hashlib.sha256().block_size
        if len(key) > block:
            key = hashlib.sha256(key).digest()
        key = key.ljust(block, b"\0")
        self._inner = hashlib.sha256(key.translate(hmac.trans_36))
        self._outer = hashlib.sha256(key.translate(hmac.trans_5C))

    def __call__(self, prefix: bytes, link_hash: str) -> str:
        inner = self._inner.copy()
        inner.update(prefix + link_hash.encode("ascii"))
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest()


def generate_key_text() -> str:
    """A new write key in its configured form."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")


@dataclass(frozen=True, slots=True)
class WriteKey:
    key_id: str
    secret: bytes

    def __repr__(self) -> str:  # never the secret, whatever prints it
        return f"WriteKey({self.key_id})"


class Verifier:
    """Tags made with and checked against a set of write keys (the first one tags)."""

    def __init__(self, keys: Iterable[bytes]) -> None:
        self.keys = tuple(WriteKey(key_id_of(k), k) for k in keys)
        if not self.keys:
            raise WriteKeyError("no write key")
        self._by_id = {}
        for key in self.keys:
            self._by_id.setdefault(key.key_id, key)
        # Each key's message prefix per domain, built once (a trace read checks hundreds of tags), and
        # its keyed MAC (the first key by its id: the one `_by_id` names).
        self._prefixes = {(k.key_id, d): _message_prefix(k.key_id, d) for k in self.keys for d in DOMAINS}
        self._macs = {id(k): _KeyedMac(k.secret) for k in self.keys}

    @property
    def current(self) -> WriteKey:
        return self.keys[0]

    def tag(self, domain: str, link_hash: str) -> str:
        """The stored tag of a link: `<key id>:<mac>` by the newest key."""
        key = self.keys[0]
        prefix = self._prefixes.get((key.key_id, domain)) or _message_prefix(key.key_id, domain)
        return f"{key.key_id}:{self._macs[id(key)](prefix, link_hash)}"

    def problem(self, domain: str, link_hash: str, tag: str) -> str | None:
        """Why `tag` does not authenticate the link (None: it does). An empty tag is "untagged" (the
        caller decides whether the log vouches for it instead)."""
        if not tag:
            return "untagged"
        key_id, sep, given = tag.partition(":")
        key = self._by_id.get(key_id) if sep else None
        if key is None:
            return f"tagged by an unknown write key {key_id[:KEY_ID_CHARS] if sep else '?'}"
        prefix = self._prefixes.get((key.key_id, domain)) or _message_prefix(key.key_id, domain)
        if not hmac.compare_digest(given, self._macs[id(key)](prefix, link_hash)):
            return f"tag by write key {key.key_id} does not verify"
        return None

    def valid(self, domain: str, link_hash: str, tag: str) -> bool:
        return self.problem(domain, link_hash, tag) is None


def key_id_of_tag(tag: str) -> str:
    """The key id a stored tag names ("" for an untagged link)."""
    key_id, sep, _ = (tag or "").partition(":")
    return key_id if sep else ""


# --------------------------------------------------------------------------------------------------
# The configured keys (Django settings)
# --------------------------------------------------------------------------------------------------
class WriteKeysMissing(Exception):
    """No write key is configured and no development key file is allowed (DEBUG off)."""


@functools.lru_cache(maxsize=4)
def _dev_key(path: str) -> str:
    from core.devkeys import read_or_create

    return read_or_create(path, generate=generate_key_text, validate=parse_key, what="a write key")


def configured_key_texts() -> list[str]:
    """The write keys in effect, newest first: the configured ones, else the development key file's."""
    from django.conf import settings

    keys = [k.strip() for k in settings.AUDIT_WRITE_KEYS if k.strip()]
    if keys:
        return keys
    dev_file = settings.AUDIT_DEV_WRITE_KEY_FILE
    if dev_file:
        return [_dev_key(str(dev_file))]
    raise WriteKeysMissing(
        "AUDIT_WRITE_KEYS is empty: nothing the service writes to the audit record can be authenticated. "
        'Generate a key with `python -c "import base64, os; '
        'print(base64.b64encode(os.urandom(32)).decode())"`.'
    )


def _verifier(texts: tuple[str, ...]) -> Verifier:
    keys = []
    for position, text in enumerate(texts, start=1):
        try:
            keys.append(parse_key(text))
        except WriteKeyError as exc:
            raise WriteKeyError(f"AUDIT_WRITE_KEYS entry {position} is not base64 of 32 bytes") from exc
    return Verifier(keys)


@built_from_settings("AUDIT_WRITE_KEYS", "AUDIT_DEV_WRITE_KEY_FILE")
def verifier() -> Verifier:
    """The configured write keys, built once and again after a setting they come from changed
    (`core.settings_cache`). Every chained write asks for it; reading and parsing the settings each
    time was ≈ 3 µs of a writer's CPU."""
    return _verifier(tuple(configured_key_texts()))


def tag(domain: str, link_hash: str) -> str:
    """The tag of a link the service writes now (the one path every writer takes)."""
    return verifier().tag(domain, link_hash)


def key_ids() -> list[str]:
    """The ids of the configured write keys, newest first (empty when none is configured)."""
    with contextlib.suppress(WriteKeysMissing):
        return [k.key_id for k in verifier().keys]
    return []
