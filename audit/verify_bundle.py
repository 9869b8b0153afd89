"""`python -m audit.verify_bundle FILE --public-key KEY`: verify a run's evidence bundle offline.

Needs only the standard library and `cryptography`: no Django, no settings, no database (this module
and what it imports — `audit.transparency.bundle`, `merkle`, `note`, `leafdata`, `audit.bound`,
`audit.integrity`, `audit.payloads` — import no Django). KEY is a trusted Ed25519 public key: its base64
text (as `GET /api/audit/checkpoints/` and `manage.py audit_keys` publish it) or a file holding that text
or a PEM public key; give `--public-key` once per key you trust (e.g. after a rotation).

Prints what held (`OK …`), notes and every failure with where it is (`FAIL events[3] (sequence 4): …`),
then `VERIFIED` or `NOT VERIFIED`. Exit status: 0 only when every digest, the chain, the leaf, the
inclusion proof and the checkpoint's signature hold; 1 when any does not (or the run is not anchored);
2 when the file or a key cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from audit.transparency import bundle, note


def _load_key(value: str):
    path = Path(value)
    try:
        text = path.read_text(encoding="ascii") if path.is_file() else value
    except (OSError, UnicodeError) as exc:
        raise note.NoteError(f"cannot read the key file {value}") from exc
    return note.load_public(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m audit.verify_bundle", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("file", help="the evidence bundle (JSON)")
    parser.add_argument(
        "--public-key",
        action="append",
        required=True,
        metavar="KEY",
        help="a trusted Ed25519 public key (base64 text, or a file with it or a PEM key); repeatable",
    )
    args = parser.parse_args(argv)
    try:
        keys = [_load_key(k) for k in args.public_key]
    except note.NoteError as exc:
        print(f"verify_bundle: bad --public-key: {exc}", file=sys.stderr)
        return 2
    try:
        raw = Path(args.file).read_bytes()
    except OSError as exc:
        print(f"verify_bundle: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        print(f"FAIL bundle: not UTF-8 (byte {exc.start})")
        print("NOT VERIFIED")
        return 1
    except json.JSONDecodeError as exc:
        print(f"FAIL bundle: not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})")
        print("NOT VERIFIED")
        return 1
    report = bundle.verify(data, keys)
    for line in report.passed:
        print(f"OK {line}")
    for line in report.notes:
        print(f"NOTE {line}")
    for line in report.failures:
        print(f"FAIL {line}")
    who = f"run {data.get('runId')}" if isinstance(data, dict) else "bundle"
    if report.ok:
        print(f"VERIFIED {who}: bundle sha256 {bundle.bundle_hash(raw)}")
        return 0
    print(f"NOT VERIFIED {who}: {len(report.failures)} problem(s)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
