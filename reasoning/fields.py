"""`EncryptedTextField`: a LONGTEXT column whose values are Fernet tokens (see `reasoning.crypto`).

Writes encrypt with the newest configured key and reads decrypt with the key the value names, on every
ORM write path, with `TextField`'s column type (the table's shape is unchanged). `None` and a
`Ciphertext` (a stored value no configured key decrypts, as reads return it) pass through unchanged, so
loading and saving such a row never destroys it. Lookups compare ciphertexts and never match plaintext:
only `isnull` is meaningful in queries.
Details: docs/api.md, *Encryption at rest*.
"""

from __future__ import annotations

import logging

from django.db import models

from reasoning import crypto

logger = logging.getLogger(__name__)


class Ciphertext:
    """A stored (encrypted) value carried as is. `str()` never reveals the token."""

    __slots__ = ("token",)

    def __init__(self, token: str) -> None:
        self.token = token

    def __repr__(self) -> str:
        return f"<Ciphertext key={crypto.stored_key_id(self.token)}>"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ciphertext) and other.token == self.token

    def __hash__(self) -> int:
        return hash(self.token)


class EncryptedTextField(models.TextField):
    description = "Text encrypted at rest (Fernet, newest configured key)"

    def from_db_value(self, value, expression, connection):
        if value is None or not crypto.is_encrypted(value):
            return value
        try:
            return crypto.keyring().decrypt(value)
        except crypto.Undecryptable:
            logger.warning(
                "reasoning value undecryptable field=%s key=%s: no configured key decrypts it",
                self.name,
                crypto.stored_key_id(value),
            )
            return Ciphertext(value)

    def to_python(self, value):
        if value is None or isinstance(value, Ciphertext):
            return value
        return super().to_python(value)

    def get_prep_value(self, value):
        if value is None:
            return None
        if isinstance(value, Ciphertext):
            return value.token
        return crypto.keyring().encrypt(str(super().get_prep_value(value)))
