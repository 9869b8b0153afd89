"""`EncryptedTextField`: a LONGTEXT column whose values are Fernet tokens (see `reasoning.crypto`).

Writes encrypt with the newest configured key; reads decrypt with whichever configured key the stored
value names. The column type is the one of `TextField` (LONGTEXT on MariaDB/MySQL, text on SQLite), so
the seed's table shape is unchanged and every ORM write path (the recorder's `save`, `update`,
`bulk_update`) encrypts without knowing it.

Two values are passed through unchanged on write, never re-encrypted:
* `None` (NULL: no content, or purged);
* a `Ciphertext`: an already-encrypted stored value. Reads return one when no configured key decrypts
  the stored value (its key was removed), so that loading and saving such a row never destroys it and
  never raises in list views; `rotate_reasoning_keys` writes its re-encrypted tokens through it.

Equality lookups on this field compare ciphertexts and never match plaintext (encryption is randomised);
only `isnull` is meaningful in queries.
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
