"""The one definition of an API token's text and its digest (used by services, authentication and the
DRF-token migration alike)."""

from __future__ import annotations

import hashlib
import secrets

from access.models import PREFIX_CHARS

SECRET_BYTES = 32


def new_token() -> str:
    """`<8-character prefix>.<secret>`: 8 + 1 + 43 URL-safe characters, 256 random bits in the secret."""
    return f"{secrets.token_hex(PREFIX_CHARS // 2)}.{secrets.token_urlsafe(SECRET_BYTES)}"


def prefix_of(token: str) -> str:
    return token[:PREFIX_CHARS]


def digest_of(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
