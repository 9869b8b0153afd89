"""C2SP signed notes, checkpoints and cosignatures (https://c2sp.org/signed-note,
https://c2sp.org/tlog-checkpoint, https://c2sp.org/tlog-cosignature): the standard formats of the log's
checkpoints since issue 35.

No Django: the offline verifier (`python -m audit.verify_bundle`) uses this module with `cryptography`.
Notes, vkeys, checkpoint bodies (with this log's `signed-at` and `previous` extension lines) and
witnesses' cosignature/v1 lines are parsed, made and verified here, and nowhere else.
Details: docs/audit-integrity.md, *Checkpoint format*.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ED25519 = 0x01
COSIGNATURE_V1 = 0x04
DASH = "\u2014"
MAX_SIGNATURES = 64
SIGNED_AT = "signed-at"
PREVIOUS = "previous"


class SignedNoteError(ValueError):
    """A note, checkpoint, key or signature that cannot be read or does not verify."""


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _b64decode(text: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SignedNoteError(f"{what} is not base64") from exc
    if base64.b64encode(raw).decode("ascii") != text:
        raise SignedNoteError(f"{what} is not in canonical base64")
    return raw


def check_name(name: str) -> str:
    if not name or any(c.isspace() or c == "+" for c in name) or any(ord(c) < 0x20 for c in name):
        raise SignedNoteError("a key name is non-empty, without spaces or '+'")
    return name


def key_id(name: str, key_type: int, public: Ed25519PublicKey) -> bytes:
    """The 4-byte key id of (name, type, key): SHA-256(name || 0x0A || type || public key)[:4]."""
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([key_type]) + _raw(public)).digest()[:4]


@dataclass(frozen=True, slots=True)
class Verifier:
    """A trusted key: its name, type (0x01 note signer, 0x04 cosigner), public key and key id."""

    name: str
    key_type: int
    public: Ed25519PublicKey

    @property
    def key_id(self) -> bytes:
        return key_id(self.name, self.key_type, self.public)

    @property
    def vkey(self) -> str:
        material = base64.b64encode(bytes([self.key_type]) + _raw(self.public)).decode("ascii")
        return f"{self.name}+{self.key_id.hex()}+{material}"


def parse_vkey(text: str) -> Verifier:
    """A verifier key `<name>+<hex key id>+<base64(type || public key)>` (Ed25519 types 0x01 and 0x04);
    SignedNoteError unless its key id is the one its name and key imply."""
    parts = text.strip().split("+", 2)  # the name and the hex id hold no "+", base64 may
    if len(parts) != 3:
        raise SignedNoteError("a vkey is <name>+<hex key id>+<base64 key>")
    name, hex_id, material = parts
    check_name(name)
    try:
        stated = bytes.fromhex(hex_id)
    except ValueError as exc:
        raise SignedNoteError("vkey key id is not hex") from exc
    raw = _b64decode(material, "vkey key")
    if len(stated) != 4 or len(raw) != 33 or raw[0] not in (ED25519, COSIGNATURE_V1):
        raise SignedNoteError("vkey is not an Ed25519 (0x01) or Ed25519 cosignature (0x04) key")
    verifier = Verifier(name, raw[0], Ed25519PublicKey.from_public_bytes(raw[1:]))
    if verifier.key_id != stated:
        raise SignedNoteError(f"vkey {name}: key id {hex_id} is not the one its name and key imply")
    return verifier


# --------------------------------------------------------------------------------------------------
# Notes
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Signature:
    name: str
    key_id: bytes
    signature: bytes  # what follows the key id

    @property
    def line(self) -> str:
        return f"{DASH} {self.name} {base64.b64encode(self.key_id + self.signature).decode('ascii')}\n"


def parse_signature_line(line: str) -> Signature:
    """One signature line (with or without its final newline)."""
    line = line.removesuffix("\n")
    prefix = DASH + " "
    if not line.startswith(prefix):
        raise SignedNoteError("a signature line starts with an em dash and a space")
    parts = line[len(prefix) :].split(" ")
    if len(parts) != 2:
        raise SignedNoteError("a signature line is '— <name> <base64>'")
    name, value = parts
    check_name(name)
    raw = _b64decode(value, "signature")
    if len(raw) < 5:
        raise SignedNoteError("a signature has a key id and at least one byte")
    return Signature(name, raw[:4], raw[4:])


def split_note(text: str) -> tuple[str, list[Signature]]:
    """(note text, signatures) of a signed note; the text ends in a newline and is separated from the
    signature lines by the last blank line."""
    if not text.endswith("\n"):
        raise SignedNoteError("a signed note ends with a newline")
    if any(ord(c) < 0x20 and c != "\n" for c in text):
        raise SignedNoteError("a signed note has no control characters but newlines")
    cut = text.rfind("\n\n")
    if cut < 0:
        raise SignedNoteError("a signed note has a blank line before its signatures")
    body, block = text[: cut + 1], text[cut + 2 :]
    lines = block.split("\n")[:-1]
    if not lines:
        raise SignedNoteError("a signed note has at least one signature")
    if len(lines) > MAX_SIGNATURES:
        raise SignedNoteError(f"a signed note has more than {MAX_SIGNATURES} signatures")
    return body, [parse_signature_line(line) for line in lines]


def join_note(body: str, signatures: list[Signature]) -> str:
    return body + "\n" + "".join(s.line for s in signatures)


def sign_line(body: str, name: str, private: Ed25519PrivateKey) -> Signature:
    """The Ed25519 (0x01) note signature of `body` by `private` under `name`."""
    check_name(name)
    return Signature(name, key_id(name, ED25519, private.public_key()), private.sign(body.encode("utf-8")))


def verify_signature(body: str, signature: Signature, verifier: Verifier) -> None:
    """SignedNoteError unless `signature` is `verifier`'s valid note signature (type 0x01) of `body`."""
    if verifier.key_type != ED25519 or (signature.name, signature.key_id) != (verifier.name, verifier.key_id):
        raise SignedNoteError(f"the signature is not by key {verifier.name}+{verifier.key_id.hex()}")
    if len(signature.signature) != 64:
        raise SignedNoteError("an Ed25519 signature is 64 bytes")
    try:
        verifier.public.verify(signature.signature, body.encode("utf-8"))
    except InvalidSignature as exc:
        raise SignedNoteError(f"signature by {verifier.name} does not verify") from exc


def verify_note(text: str, verifiers: list[Verifier]) -> tuple[str, list[Verifier]]:
    """(note text, the verifiers whose signatures verified), per the signed-note rules: signatures from
    unknown keys are ignored, one from a known key that fails rejects the note, and so does a note with
    no verified signature from a known key."""
    body, signatures = split_note(text)
    known = {(v.name, v.key_id): v for v in verifiers if v.key_type == ED25519}
    good = []
    for signature in signatures:
        verifier = known.get((signature.name, signature.key_id))
        if verifier is not None:
            verify_signature(body, signature, verifier)
            good.append(verifier)
    if not good:
        raise SignedNoteError("the note has no signature by a known key")
    return body, good


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Checkpoint:
    origin: str
    tree_size: int
    root_hash: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        lines = [self.origin, str(self.tree_size), base64.b64encode(self.root_hash).decode("ascii")]
        return "\n".join([*lines, *self.extensions]) + "\n"


def parse_checkpoint(body: str) -> Checkpoint:
    """A tlog-checkpoint body: origin, decimal size (no leading zeros), base64 32-byte root, extension
    lines (non-empty)."""
    if not body.endswith("\n"):
        raise SignedNoteError("a checkpoint ends with a newline")
    lines = body[:-1].split("\n")
    if len(lines) < 3:
        raise SignedNoteError("a checkpoint has an origin, a size and a root hash line")
    origin, size, root = lines[:3]
    if not origin:
        raise SignedNoteError("checkpoint origin is empty")
    if not size.isascii() or not size.isdigit() or (size != "0" and size.startswith("0")):
        raise SignedNoteError("checkpoint size is not a decimal without leading zeros")
    root_hash = _b64decode(root, "checkpoint root hash")
    if len(root_hash) != 32:
        raise SignedNoteError("checkpoint root hash is not 32 bytes")
    extensions = tuple(lines[3:])
    if any(not line for line in extensions):
        raise SignedNoteError("checkpoint extension lines are not empty")
    return Checkpoint(origin, int(size), root_hash, extensions)


# --------------------------------------------------------------------------------------------------
# Cosignatures (tlog-cosignature, cosignature/v1, Ed25519)
# --------------------------------------------------------------------------------------------------
def cosigned_message(body: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n".encode() + body.encode("utf-8")


def cosign(body: str, name: str, private: Ed25519PrivateKey, timestamp: int) -> Signature:
    """A cosignature/v1 of the checkpoint `body` (witnesses make these; tests and fixtures use it)."""
    check_name(name)
    signed = private.sign(cosigned_message(body, timestamp))
    return Signature(
        name, key_id(name, COSIGNATURE_V1, private.public_key()), struct.pack(">Q", timestamp) + signed
    )


def verify_cosignature(body: str, signature: Signature, verifier: Verifier) -> int:
    """The timestamp of `verifier`'s valid cosignature/v1 of the checkpoint `body`; SignedNoteError else."""
    if verifier.key_type != COSIGNATURE_V1 or (signature.name, signature.key_id) != (
        verifier.name,
        verifier.key_id,
    ):
        raise SignedNoteError(
            f"the cosignature is not by witness key {verifier.name}+{verifier.key_id.hex()}"
        )
    if len(signature.signature) != 8 + 64:
        raise SignedNoteError("a cosignature/v1 is an 8-byte timestamp and a 64-byte signature")
    (timestamp,) = struct.unpack(">Q", signature.signature[:8])
    if timestamp == 0 or timestamp >= 1 << 63:
        raise SignedNoteError("a cosignature's timestamp is between 1 and 2^63 - 1")
    try:
        verifier.public.verify(signature.signature[8:], cosigned_message(body, timestamp))
    except InvalidSignature as exc:
        raise SignedNoteError(f"cosignature by {verifier.name} does not verify") from exc
    return timestamp


@dataclass(frozen=True, slots=True)
class Policy:
    """N of M: at least `quorum` of the `witnesses` (cosigner vkeys, type 0x04) must have cosigned."""

    quorum: int
    witnesses: tuple[Verifier, ...]

    def __post_init__(self) -> None:
        if any(w.key_type != COSIGNATURE_V1 for w in self.witnesses):
            raise SignedNoteError("a witness policy names cosigner keys (vkey type 0x04)")
        if not 1 <= self.quorum <= len(self.witnesses):
            raise SignedNoteError(
                f"a witness policy needs between 1 and {len(self.witnesses)} cosignatures, not {self.quorum}"
            )

    def describe(self) -> str:
        return (
            f"{self.quorum} of {len(self.witnesses)} witness(es) ("
            + ", ".join(w.name for w in self.witnesses)
            + ")"
        )


def make_policy(vkeys: list[str], quorum: int | None = None) -> Policy | None:
    """The policy of these vkeys (None when there are none); `quorum` None means all of them."""
    witnesses = tuple(parse_vkey(v) for v in vkeys if v.strip())
    if not witnesses:
        return None
    if len({(w.name, w.key_id) for w in witnesses}) != len(witnesses):
        raise SignedNoteError("a witness policy names each witness key once")
    return Policy(len(witnesses) if quorum is None else quorum, witnesses)


def check_policy(body: str, signatures: list[Signature], policy: Policy) -> tuple[list[str], list[str]]:
    """(names of the policy's witnesses whose cosignature verified, problems): problems name each
    cosignature by a policy key that does not verify, and a quorum not reached."""
    verified, problems = [], []
    for witness in policy.witnesses:
        mine = [s for s in signatures if (s.name, s.key_id) == (witness.name, witness.key_id)]
        for signature in mine:
            try:
                verify_cosignature(body, signature, witness)
            except SignedNoteError as exc:
                problems.append(str(exc))
                continue
            verified.append(witness.name)
            break
    if len(verified) < policy.quorum:
        missing = [w.name for w in policy.witnesses if w.name not in verified]
        problems.append(
            f"cosigned by {len(verified)} of the {policy.describe()}, {policy.quorum} required "
            f"(no valid cosignature by {', '.join(missing)})"
        )
    return verified, problems
