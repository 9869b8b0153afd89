"""The signed checkpoint: its exact text, its hash, Ed25519 keys and signature verification. No Django.

Checkpoints are C2SP signed notes (`NoteBody`): since issue 50 a plain tlog-checkpoint (no extension
lines) whose signing time and predecessor are in its *link* (`Link`), a second note by the same key that
no checkpoint parser can read as a checkpoint; issues 35 to 49 signed them as extension lines, and
checkpoints before issue 35 are canonical JSON (`Body`). `parse_any` reads all three and
`verify_checkpoint` verifies any; each names its predecessor's hash (`statement_hash`): a chain.
Details: docs/audit-integrity.md, *Checkpoint format*.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from audit.transparency import signednote

FORMAT = "diagnosis-audit-checkpoint/v1"
KEY_ID_CHARS = 16
_BODY_KEYS = {"format", "origin", "treeSize", "rootHash", "signedAt", "previous", "keyId"}


class NoteError(ValueError):
    """A checkpoint or key that cannot be read or does not verify (the message names the field)."""


def canonical(value: Any) -> str:
    """The canonical JSON of the audit (the same rule as `audit.payloads.canonical_json`)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Body:
    origin: str
    tree_size: int
    root_hash: str
    signed_at: str
    previous: str
    key_id: str

    def text(self) -> str:
        return canonical(
            {
                "format": FORMAT,
                "origin": self.origin,
                "treeSize": self.tree_size,
                "rootHash": self.root_hash,
                "signedAt": self.signed_at,
                "previous": self.previous,
                "keyId": self.key_id,
            }
        )


def body_hash(text: str) -> str:
    """The checkpoint's hash: hex SHA-256 of its body bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _hex(value: Any, field: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (value == "" and not empty):
        raise NoteError(f"checkpoint {field} is not a hex hash")
    if value and (len(value) != 64 or any(c not in "0123456789abcdef" for c in value)):
        raise NoteError(f"checkpoint {field} is not a hex hash")
    return value


def parse_body(text: str) -> Body:
    """The fields of a checkpoint body; NoteError unless it is exactly a canonical v1 body."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise NoteError("checkpoint body is not JSON") from exc
    if not isinstance(data, dict) or set(data) != _BODY_KEYS:
        raise NoteError("checkpoint body does not have exactly the v1 fields")
    if data["format"] != FORMAT:
        raise NoteError(f"checkpoint format is not {FORMAT}")
    size = data["treeSize"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise NoteError("checkpoint treeSize is not a positive integer")
    for field in ("origin", "signedAt", "keyId"):
        if not isinstance(data[field], str) or not data[field]:
            raise NoteError(f"checkpoint {field} is not a string")
    body = Body(
        origin=data["origin"],
        tree_size=size,
        root_hash=_hex(data["rootHash"], "rootHash"),
        signed_at=data["signedAt"],
        previous=_hex(data["previous"], "previous", empty=True),
        key_id=data["keyId"],
    )
    if body.text() != text:
        raise NoteError("checkpoint body is not in canonical form")
    return body


# --------------------------------------------------------------------------------------------------
# Keys and signatures
# --------------------------------------------------------------------------------------------------
def raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(key: Ed25519PublicKey) -> str:
    return hashlib.sha256(raw_public(key)).hexdigest()[:KEY_ID_CHARS]


def public_text(key: Ed25519PublicKey) -> str:
    """The public key as it is published (API, `manage.py audit_keys`): base64 of its 32 raw bytes."""
    return base64.b64encode(raw_public(key)).decode("ascii")


def _b64(text: str) -> bytes:
    text = text.strip().replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise NoteError("not base64") from exc


def load_public(text: str) -> Ed25519PublicKey:
    """A public key from its published form (base64 of the 32 raw bytes) or a PEM SubjectPublicKeyInfo."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(text.encode("ascii"))
        except (ValueError, UnicodeError) as exc:
            raise NoteError("not a PEM public key") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise NoteError("not an Ed25519 public key")
        return key
    raw = _b64(text)
    if len(raw) != 32:
        raise NoteError("an Ed25519 public key is 32 bytes")
    return Ed25519PublicKey.from_public_bytes(raw)


def load_private(text: str) -> Ed25519PrivateKey:
    """A signing key from its configured form: base64 (standard or URL-safe) of the 32-byte seed."""
    raw = _b64(text)
    if len(raw) != 32:
        raise NoteError("an Ed25519 private key is a 32-byte seed")
    return Ed25519PrivateKey.from_private_bytes(raw)


def sign(text: str, key: Ed25519PrivateKey) -> str:
    return base64.b64encode(key.sign(text.encode("utf-8"))).decode("ascii")


def verify(text: str, signature: str, key: Ed25519PublicKey) -> None:
    """NoteError unless `signature` (base64) is `key`'s Ed25519 signature of the body `text`."""
    if not isinstance(signature, str):
        raise NoteError("checkpoint signature is not a string")
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise NoteError("checkpoint signature is not base64") from exc
    # Canonical base64 only: the last character before padding has unused bits, so another text can
    # decode to the same bytes; a signature is accepted only in the exact form it was issued.
    if base64.b64encode(raw).decode("ascii") != signature:
        raise NoteError("checkpoint signature is not in canonical base64")
    try:
        key.verify(raw, text.encode("utf-8"))
    except InvalidSignature as exc:
        raise NoteError("checkpoint signature does not verify") from exc


# --------------------------------------------------------------------------------------------------
# The C2SP format (issue 35)
# --------------------------------------------------------------------------------------------------
NOTE_FORMAT = "c2sp-signed-note/tlog-checkpoint"


@dataclass(frozen=True, slots=True)
class NoteBody:
    """A checkpoint body in the C2SP tlog-checkpoint format: plain (`extended` False, the default since
    issue 50: its time and predecessor are in its `link`) or with this log's two extension lines (as
    signed from issue 35 to 49, and with `AUDIT_CHECKPOINT_EXTENSION_LINES`)."""

    origin: str
    tree_size: int
    root_hash: str  # hex
    signed_at: str
    previous: str  # hex, "" for the first checkpoint
    extended: bool = True

    key_id = ""  # a note names its key in the signature line, not in the body
    format = NOTE_FORMAT

    def text(self) -> str:
        extensions = []
        if self.extended:
            extensions.append(f"{signednote.SIGNED_AT} {self.signed_at}")
            if self.previous:
                extensions.append(f"{signednote.PREVIOUS} {self.previous}")
        return signednote.Checkpoint(
            self.origin, self.tree_size, bytes.fromhex(self.root_hash), tuple(extensions)
        ).text()

    def link(self) -> Link | None:
        """The link note of a plain checkpoint (None for one with extension lines)."""
        if self.extended:
            return None
        return Link(self.tree_size, body_hash(self.text()), self.signed_at, self.previous)


LINK_FORMAT = "diagnosis-audit-checkpoint-link/v1"
_LINK_FIELDS = ("tree-size", "checkpoint", "signed-at", "previous")


@dataclass(frozen=True, slots=True)
class Link:
    """What the log states about a plain checkpoint beside it: the hash of its body, when it was signed
    and the hash of the checkpoint before (`statement_hash`, "" for the first). Signed as a note of its
    own by the checkpoint's key under the origin; its second line (`tree-size N`) is not a decimal, so
    no tlog-checkpoint parser (a witness's, a monitor's) can read it as a checkpoint."""

    tree_size: int
    checkpoint: str  # hex SHA-256 of the checkpoint body
    signed_at: str
    previous: str

    def text(self) -> str:
        lines = [
            LINK_FORMAT,
            f"tree-size {self.tree_size}",
            f"checkpoint {self.checkpoint}",
            f"signed-at {self.signed_at}",
        ]
        if self.previous:
            lines.append(f"previous {self.previous}")
        return "\n".join(lines) + "\n"


def parse_link(text: str) -> Link:
    """The fields of a link note's text; NoteError unless it is exactly one this log writes."""
    if not isinstance(text, str) or not text.startswith(LINK_FORMAT + "\n") or not text.endswith("\n"):
        raise NoteError(f"checkpoint link is not a {LINK_FORMAT} note")
    fields: dict[str, str] = {}
    for line in text[len(LINK_FORMAT) + 1 : -1].split("\n"):
        name, _, value = line.partition(" ")
        if name not in _LINK_FIELDS or name in fields or not value:
            raise NoteError("checkpoint link lines are not tree-size, checkpoint, signed-at and previous")
        fields[name] = value
    size = fields.get("tree-size", "")
    if not size.isascii() or not size.isdigit() or size.startswith("0") or "signed-at" not in fields:
        raise NoteError("checkpoint link has no tree size or no signed-at line")
    link = Link(
        tree_size=int(size),
        checkpoint=_hex(fields.get("checkpoint", ""), "link checkpoint"),
        signed_at=fields["signed-at"],
        previous=_hex(fields.get("previous", ""), "previous", empty=True),
    )
    if link.text() != text:
        raise NoteError("checkpoint link is not in canonical form")
    return link


def is_legacy(text: str) -> bool:
    """Whether a stored body is the JSON format of checkpoints signed before issue 35."""
    return isinstance(text, str) and text.startswith("{")


def parse_note_body(text: str, link: str | None = None) -> NoteBody:
    """The fields of a C2SP checkpoint body this log wrote; NoteError unless it is exactly one. A plain
    body takes its time and predecessor from its `link` text (which must name it); without one they
    are "" (only its origin, size and root are then known)."""
    try:
        cp = signednote.parse_checkpoint(text)
        signednote.check_name(cp.origin)
    except signednote.SignedNoteError as exc:
        raise NoteError(f"checkpoint {exc}") from exc
    if cp.tree_size < 1:
        raise NoteError("checkpoint tree size is not a positive integer")
    fields: dict[str, str] = {}
    for line in cp.extensions:
        name, _, value = line.partition(" ")
        if name not in (signednote.SIGNED_AT, signednote.PREVIOUS) or name in fields or not value:
            raise NoteError("checkpoint extension lines are not signed-at and previous")
        fields[name] = value
    if cp.extensions and signednote.SIGNED_AT not in fields:
        raise NoteError("checkpoint has no signed-at line")
    if cp.extensions and link is not None:
        raise NoteError("a checkpoint with extension lines has no link")
    if not cp.extensions and link is not None:
        stated = parse_link(link)
        if (stated.tree_size, stated.checkpoint) != (cp.tree_size, body_hash(text)):
            raise NoteError("checkpoint link names another checkpoint")
        fields = {signednote.SIGNED_AT: stated.signed_at, signednote.PREVIOUS: stated.previous}
    body = NoteBody(
        origin=cp.origin,
        tree_size=cp.tree_size,
        root_hash=cp.root_hash.hex(),
        signed_at=fields.get(signednote.SIGNED_AT, ""),
        previous=_hex(fields.get(signednote.PREVIOUS, ""), "previous", empty=True),
        extended=bool(cp.extensions),
    )
    if body.text() != text:
        raise NoteError("checkpoint body is not in canonical form")
    return body


def parse_any(text: str, link: str | None = None) -> Body | NoteBody:
    """A stored checkpoint body of any format (`link`: a plain checkpoint's link text)."""
    return parse_body(text) if is_legacy(text) else parse_note_body(text, link or None)


def statement_hash(text: str, link: str | None = None) -> str:
    """The hash the next checkpoint names as `previous` (and `checkpoint_hash`): of the link note for a
    plain checkpoint (it names the body's hash, the time and the predecessor), else of the body."""
    return body_hash(link or text)


def note_key_id(origin: str, key: Ed25519PublicKey) -> str:
    """The hex signed-note key id of the log's key under its origin (type 0x01)."""
    return signednote.key_id(origin, signednote.ED25519, key).hex()


def log_vkey(origin: str, key: Ed25519PublicKey) -> str:
    """The log key's signed-note verifier key (`<origin>+<key id>+<base64(0x01 || key)>`)."""
    return signednote.Verifier(origin, signednote.ED25519, key).vkey


def sign_note(body: NoteBody, key: Ed25519PrivateKey, text: str | None = None) -> str:
    """The stored signature of a C2SP checkpoint (or of `text`, its link, under its origin):
    base64(key id || Ed25519 signature)."""
    line = signednote.sign_line(body.text() if text is None else text, body.origin, key)
    return base64.b64encode(line.key_id + line.signature).decode("ascii")


def signature_line(origin: str, signature: str) -> signednote.Signature:
    """The note signature line a stored signature stands for (NoteError when it is not one)."""
    if not isinstance(signature, str):
        raise NoteError("checkpoint signature is not a string")
    try:
        return signednote.parse_signature_line(f"{signednote.DASH} {origin} {signature}")
    except signednote.SignedNoteError as exc:
        raise NoteError(f"checkpoint signature: {exc}") from exc


def signed_note(body_text: str, origin: str, signature: str, cosignatures: list[str] = ()) -> str:
    """The checkpoint as a signed note: its body, a blank line, the log's signature line, then the
    witnesses' cosignature lines (each given without its final newline)."""
    return body_text + "\n" + signature_line(origin, signature).line + "".join(c + "\n" for c in cosignatures)


def signer_key_id(body: Body | NoteBody, signature: str) -> str:
    """The key id a checkpoint names (in its JSON body, or in its note signature), "" when unreadable."""
    if isinstance(body, Body):
        return body.key_id
    try:
        return signature_line(body.origin, signature).key_id.hex()
    except NoteError:
        return ""


def find_signer(
    body: Body | NoteBody, signature: str, keys: list[Ed25519PublicKey]
) -> Ed25519PublicKey | None:
    """The key among `keys` the checkpoint names as its signer (by key id; by key name too for a note)."""
    wanted = signer_key_id(body, signature)
    for key in keys:
        kid = key_id(key) if isinstance(body, Body) else note_key_id(body.origin, key)
        if kid == wanted:
            return key
    return None


def verify_checkpoint(
    text: str, body: Body | NoteBody, signature: str, key: Ed25519PublicKey, link_signature: str = ""
) -> None:
    """NoteError unless `signature` is `key`'s signature of the checkpoint (any format) and, for a plain
    one, `link_signature` the same key's signature of its link."""
    if isinstance(body, Body):
        verify(text, signature, key)
        return
    verifier = signednote.Verifier(body.origin, signednote.ED25519, key)
    try:
        signednote.verify_signature(text, signature_line(body.origin, signature), verifier)
    except signednote.SignedNoteError as exc:
        raise NoteError("checkpoint signature does not verify") from exc
    link = body.link()
    if link is None:
        return
    if not body.signed_at:
        raise NoteError("checkpoint has no link (its signed time and predecessor)")
    try:
        signednote.verify_signature(link.text(), signature_line(body.origin, link_signature), verifier)
    except (signednote.SignedNoteError, NoteError) as exc:
        raise NoteError("checkpoint link signature does not verify") from exc
