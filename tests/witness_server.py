"""A minimal but complete C2SP tlog-witness (https://c2sp.org/tlog-witness), for the tests only.

Why a fixture and not a real witness: the reference witnesses (litewitness from filippo.io/torchwood,
transparency-dev/witness) are Go programs, and this machine has no Go module proxy and Go 1.19 only, so
none can be built here (docs/audit-integrity.md, *Witnesses*). This one is written from the
specifications alone and imports nothing of this project (only the standard library and
`cryptography`): its signed-note parsing, its RFC 9162 consistency-proof check and its cosignature/v1
signing are its own, so that the log's client is tested against a second implementation.

`POST /add-checkpoint`: the body is `old <size>`, consistency proof lines (base64), a blank line and a
signed checkpoint note. The witness

* answers 400 to a malformed request or an old size above the checkpoint's, and to a checkpoint with
  extension lines unless the log is trusted with `extension_lines` (standard witnesses refuse them by
  default: tlog-checkpoint calls them NOT RECOMMENDED);
* 404 when it does not know the origin, 403 when no signature by a key it trusts for that origin
  verifies (and when a trusted key's signature fails);
* 409 with its size (`text/x.tlog.size`) when `old` is not the size it last cosigned;
* 422 when the proof does not prove the checkpoint consistent with its stored root (or, at the same size,
  the roots differ), or a non-empty proof comes with old 0;
* else stores (size, root) in its state file — checked and written under one lock — and answers 200 with
  its cosignature/v1 line.

Its state (a JSON file: origin → {size, root}) survives a restart of the server on the same file.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _key_id(name: str, kind: int, key: Ed25519PublicKey) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + bytes([kind]) + _raw(key)).digest()[:4]


def _hash_children(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def verify_consistency(old: int, new: int, old_root: bytes, new_root: bytes, proof: list[bytes]) -> bool:
    """RFC 9162, 2.1.4.2 (verifying a consistency proof), transcribed."""
    if old == new:
        return not proof and old_root == new_root
    if old == 0 or old > new or not proof:
        return False
    if old & (old - 1) == 0:  # a power of two: the old root is the first node
        proof = [old_root, *proof]
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = proof[0]
    for c in proof[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = _hash_children(c, fr)
            sr = _hash_children(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = _hash_children(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root


class Refused(Exception):
    def __init__(self, status: int, text: str, content_type: str = "text/plain") -> None:
        super().__init__(text)
        self.status, self.text, self.content_type = status, text, content_type


class Witness:
    """The witness's keys, trusted logs and state (the HTTP server calls `add_checkpoint`)."""

    def __init__(
        self,
        name: str,
        state: Path,
        logs: dict[str, list[Ed25519PublicKey]],
        *,
        extension_lines: bool = False,
    ) -> None:
        self.name = name
        self.extension_lines = extension_lines
        self.private = Ed25519PrivateKey.generate()
        self.state = state
        self.logs = logs  # origin → the log keys trusted for it (their key name is the origin)
        self.lock = threading.Lock()
        self.requests: list[tuple[int, int]] = []  # (old size, status) of each request

    @property
    def vkey(self) -> str:
        public = self.private.public_key()
        material = base64.b64encode(b"\x04" + _raw(public)).decode()
        return f"{self.name}+{_key_id(self.name, 4, public).hex()}+{material}"

    def _load(self) -> dict:
        return json.loads(self.state.read_text()) if self.state.exists() else {}

    def add_checkpoint(self, body: bytes) -> str:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Refused(400, "not UTF-8") from exc
        head, sep, note = text.partition("\n\n")
        lines = head.split("\n")
        if not sep or not lines[0].startswith("old ") or not lines[0][4:].isdigit():
            raise Refused(400, "no old size line")
        old = int(lines[0][4:])
        try:
            proof = [base64.b64decode(line, validate=True) for line in lines[1:]]
        except ValueError as exc:
            raise Refused(400, "a proof line is not base64") from exc
        if len(proof) > 63 or any(len(h) != 32 for h in proof):
            raise Refused(400, "bad proof lines")
        # The note: its text ends at the last blank line.
        cut = note.rfind("\n\n")
        if cut < 0 or not note.endswith("\n"):
            raise Refused(400, "not a signed note")
        checkpoint, signatures = note[: cut + 1], note[cut + 2 : -1].split("\n")
        fields = checkpoint[:-1].split("\n")
        if len(fields) < 3 or not fields[1].isdigit():
            raise Refused(400, "not a checkpoint")
        origin, size = fields[0], int(fields[1])
        root = base64.b64decode(fields[2])
        if origin not in self.logs:
            raise Refused(404, "unknown log")
        if len(fields) > 3 and not self.extension_lines:
            raise Refused(400, "extension lines are not allowed for this log")
        trusted = {_key_id(origin, 1, k): k for k in self.logs[origin]}
        verified = False
        for line in signatures:
            parts = line.split(" ")
            if len(parts) != 3 or parts[0] != "\u2014" or parts[1] != origin:
                continue
            raw = base64.b64decode(parts[2])
            key = trusted.get(raw[:4])
            if key is None:
                continue  # MUST ignore signatures from unknown keys
            try:
                key.verify(raw[4:], checkpoint.encode())
            except InvalidSignature as exc:
                raise Refused(403, "a signature by a trusted key does not verify") from exc
            verified = True
        if not verified:
            raise Refused(403, "no signature by a trusted key")
        if old > size:
            raise Refused(400, "old size above the checkpoint's")
        with self.lock:  # check and persist atomically
            state = self._load()
            mine = state.get(origin, {"size": 0, "root": ""})
            if old != mine["size"]:
                self.requests.append((old, 409))
                raise Refused(409, f"{mine['size']}\n", "text/x.tlog.size")
            if old == 0:
                if proof:
                    raise Refused(422, "a proof from size 0")
            elif not verify_consistency(old, size, base64.b64decode(mine["root"]), root, proof):
                self.requests.append((old, 422))
                raise Refused(422, "inconsistent")
            state[origin] = {"size": size, "root": fields[2]}
            self.state.write_text(json.dumps(state))
            self.requests.append((old, 200))
        stamp = int(time.time())
        message = f"cosignature/v1\ntime {stamp}\n".encode() + checkpoint.encode()
        signature = struct.pack(">Q", stamp) + self.private.sign(message)
        kid = _key_id(self.name, 4, self.private.public_key())
        return f"\u2014 {self.name} {base64.b64encode(kid + signature).decode()}\n"


class WitnessServer:
    """The witness served on 127.0.0.1 (a free port) in a thread: `url`, `stop()`."""

    def __init__(self, witness: Witness) -> None:
        self.witness = witness
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != "/add-checkpoint":
                    self._send(404, "not found", "text/plain")
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    answer = owner.witness.add_checkpoint(body)
                except Refused as refusal:
                    self._send(refusal.status, refusal.text, refusal.content_type)
                    return
                self._send(200, answer, "text/plain; charset=utf-8")

            def _send(self, status: int, text: str, content_type: str) -> None:
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
