"""An independent implementation of the record's wire format, written from its documented byte layout
(docs/audit-integrity.md, the module docstrings of `audit.verify.hash_chain`, `audit.verify.row_digests`,
`core.writeauth`, `audit.transparency.*`) with the standard library and `cryptography` only: no import of
the project. The golden vectors are checked against the project's code *and* against this, so a vector
is never only what the writer happens to compute.

Typed inputs: JSON has no date-time, no str subclass and no stored ciphertext, so the vector file spells
them as one-key objects, decoded by `typed`:

* `{"$dt": "<ISO 8601 with offset>"}` an aware date-time; `{"$naive": "<ISO 8601>"}` a naive one;
* `{"$strsub": "<text>"}` an instance of a `str` subclass; `{"$cipher": "<token>"}` a stored encrypted
  value (`reasoning.fields.Ciphertext`, given by the caller); `{"$raw": "<json text>"}` JSON text the
  recorder serialised once (`audit.write.table.RawJSON`, given by the caller);
* `{"$tuple": [...]}` a tuple (JSON columns turn it into a list).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import struct
from typing import Any

GENESIS = "0" * 64


class Text(str):
    """A str subclass (Django's SafeString, a StrEnum member…): the format must not depend on the class."""


def typed(value: Any, *, cipher: Any = None, raw: Any = None) -> Any:
    """The Python value a typed JSON input stands for (recursively in lists and objects)."""
    if isinstance(value, dict):
        if len(value) == 1:
            ((key, inner),) = value.items()
            if key == "$dt":
                return dt.datetime.fromisoformat(inner)
            if key == "$naive":
                parsed = dt.datetime.fromisoformat(inner)
                assert parsed.tzinfo is None
                return parsed
            if key == "$strsub":
                return Text(inner)
            if key == "$cipher":
                return cipher(inner)
            if key == "$raw":
                return raw(inner)
            if key == "$tuple":
                return tuple(typed(v, cipher=cipher, raw=raw) for v in inner)
        return {k: typed(v, cipher=cipher, raw=raw) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v, cipher=cipher, raw=raw) for v in value]
    return value


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text: str) -> str:
    """SHA-256 of a text's UTF-8 bytes (a lone surrogate kept as its three bytes)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def utc_time(value: dt.datetime) -> str:
    """UTC, microseconds, `+00:00` (a naive time of a stored row is UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    value = value.astimezone(dt.UTC)
    return (
        f"{value.year:04d}-{value.month:02d}-{value.day:02d}T{value.hour:02d}:{value.minute:02d}:"
        f"{value.second:02d}.{value.microsecond:06d}+00:00"
    )


# --------------------------------------------------------------------------------------------------
# The chain
# --------------------------------------------------------------------------------------------------
def event_json(e: dict[str, Any]) -> str:
    """The canonical JSON an event's hash covers (keys in code point order, compact, UTF-8 kept)."""
    return canonical(
        {
            "createdAt": utc_time(e["createdAt"]),
            "details": e["details"],
            "eventType": str(e["eventType"]),
            "phase": str(e["phase"]),
            "runId": str(e["runId"]),
            "sequenceNo": int(e["sequenceNo"]),
            "sessionId": str(e["sessionId"]),
            "status": str(e["status"]),
            "summary": str(e["summary"]),
        }
    )


def link_hash(prev_hash: str, e: dict[str, Any]) -> str:
    return sha256_text(prev_hash + event_json(e))


# --------------------------------------------------------------------------------------------------
# Row digests
# --------------------------------------------------------------------------------------------------
def _column(kind: str, value: Any, *, stored: bool, cipher_type: type, raw_type: type) -> Any:
    if value is None:
        return None
    if kind == "text":
        return str(value)
    if kind == "int":
        return int(value)
    if kind == "bool":
        return bool(value)
    if kind == "datetime":
        return utc_time(value)
    if kind == "encrypted":
        return value.token if isinstance(value, cipher_type) else str(value)
    if kind == "json":
        if stored:
            return value
        if isinstance(value, raw_type):
            return json.loads(value.text)
        return json.loads(json.dumps(value))
    raise AssertionError(f"unknown column kind {kind}")


def row_document(
    form: str, columns: list[list[str]], values: dict[str, Any], *, stored: bool, cipher_type, raw_type
) -> dict[str, Any]:
    row = {
        name: _column(kind, values[name], stored=stored, cipher_type=cipher_type, raw_type=raw_type)
        for name, kind in columns
    }
    if form == "run" or form.startswith("run/"):
        row["content"] = sha256_text(row["content"] or "")
    return {"form": form, "row": row}


def row_digest(document: dict[str, Any]) -> str:
    return sha256_text(canonical(document))


# --------------------------------------------------------------------------------------------------
# Write tags
# --------------------------------------------------------------------------------------------------
def write_key_id(key: bytes) -> str:
    return hashlib.sha256(b"diagnosis-audit/write-key-id/v1\n" + key).hexdigest()[:8]


def write_mac(key: bytes, domain: str, link: str) -> str:
    message = f"diagnosis-audit/write-tag/v1\n{domain}\n{write_key_id(key)}\n{link}".encode("ascii")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def write_tag(key: bytes, domain: str, link: str) -> str:
    return f"{write_key_id(key)}:{write_mac(key, domain, link)}"


# --------------------------------------------------------------------------------------------------
# Merkle tree (RFC 9162 §2.1), recursively as the RFC defines it
# --------------------------------------------------------------------------------------------------
def leaf(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(hashes: list[bytes]) -> bytes:
    if not hashes:
        return hashlib.sha256(b"").digest()
    if len(hashes) == 1:
        return hashes[0]
    k = _k(len(hashes))
    return node(mth(hashes[:k]), mth(hashes[k:]))


def inclusion(m: int, hashes: list[bytes]) -> list[bytes]:
    if len(hashes) == 1:
        return []
    k = _k(len(hashes))
    if m < k:
        return [*inclusion(m, hashes[:k]), mth(hashes[k:])]
    return [*inclusion(m - k, hashes[k:]), mth(hashes[:k])]


def consistency(m: int, hashes: list[bytes], complete: bool = True) -> list[bytes]:
    n = len(hashes)
    if m == n:
        return [] if complete else [mth(hashes)]
    k = _k(n)
    if m <= k:
        return [*consistency(m, hashes[:k], complete), mth(hashes[k:])]
    return [*consistency(m - k, hashes[k:], False), mth(hashes[:k])]


# --------------------------------------------------------------------------------------------------
# Signed notes (C2SP signed-note, tlog-checkpoint, tlog-cosignature) and the legacy JSON checkpoint
# --------------------------------------------------------------------------------------------------
def note_key_id(name: str, key_type: int, public: bytes) -> bytes:
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([key_type]) + public).digest()[:4]


def vkey(name: str, key_type: int, public: bytes) -> str:
    material = base64.b64encode(bytes([key_type]) + public).decode("ascii")
    return f"{name}+{note_key_id(name, key_type, public).hex()}+{material}"


def checkpoint_body(origin: str, size: int, root_hex: str, signed_at: str, previous: str) -> str:
    lines = [origin, str(size), base64.b64encode(bytes.fromhex(root_hex)).decode("ascii")]
    lines.append(f"signed-at {signed_at}")
    if previous:
        lines.append(f"previous {previous}")
    return "\n".join(lines) + "\n"


def plain_checkpoint_body(origin: str, size: int, root_hex: str) -> str:
    """A tlog-checkpoint body without extension lines (issue 50)."""
    return f"{origin}\n{size}\n{base64.b64encode(bytes.fromhex(root_hex)).decode('ascii')}\n"


def checkpoint_link(size: int, body: str, signed_at: str, previous: str) -> str:
    """The link note's text of a plain checkpoint (issue 50, docs/audit-integrity.md)."""
    lines = [
        "diagnosis-audit-checkpoint-link/v1",
        f"tree-size {size}",
        f"checkpoint {hashlib.sha256(body.encode('utf-8')).hexdigest()}",
        f"signed-at {signed_at}",
    ]
    if previous:
        lines.append(f"previous {previous}")
    return "\n".join(lines) + "\n"


def signature_line(name: str, key_id: bytes, signature: bytes) -> str:
    return f"\u2014 {name} {base64.b64encode(key_id + signature).decode('ascii')}\n"


def cosigned_message(body: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n{body}".encode()


def cosignature_bytes(timestamp: int, signature: bytes) -> bytes:
    return struct.pack(">Q", timestamp) + signature


def legacy_body(fields: dict[str, Any]) -> str:
    return canonical({"format": "diagnosis-audit-checkpoint/v1", **fields})
