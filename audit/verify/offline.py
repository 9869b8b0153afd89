"""The offline verifier of a run's evidence bundle (`python -m audit.verify_bundle FILE --public-key KEY`,
or the installed command `diagnosis-verify-bundle`, from any directory).

Needs only the standard library and `cryptography`: no Django, no settings, no database. It checks every
digest, the chain, the leaf, the inclusion proof, the checkpoint's signature against the keys trusted
(`--public-key`, repeatable) and the witness policy (`--witness-key`, `--witness-quorum`); prints what
held, notes and every failure with where it is, then `VERIFIED` or `NOT VERIFIED`. Exit status 0 only
when all hold, 1 when any does not (or the run is not anchored), 2 when the file or a key cannot be read.
Details: docs/audit-integrity.md, *Commands* (the offline verifier).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from audit.transparency import bundle, note, signednote


def _read(value: str) -> str:
    path = Path(value)
    try:
        return path.read_text(encoding="ascii").strip() if path.is_file() else value
    except (OSError, UnicodeError) as exc:
        raise note.NoteError(f"cannot read the key file {value}") from exc


def _load_key(value: str):
    text = _read(value)
    try:
        return note.load_public(text)
    except note.NoteError:
        if text.count("+") < 2:  # not a signed-note vkey either
            raise
    try:
        verifier = signednote.parse_vkey(text)
    except signednote.SignedNoteError as exc:
        raise note.NoteError(str(exc)) from exc
    if verifier.key_type != signednote.ED25519:
        raise note.NoteError("the log's vkey is an Ed25519 note key (type 0x01)")
    return verifier.public


def main(argv: list[str] | None = None) -> int:
    # Named as it was started: the installed command (`diagnosis-verify-bundle`, pyproject.toml) or the
    # module, so the usage line is what to type again.
    command = Path(sys.argv[0]).name
    prog = command if command.startswith("diagnosis-verify-bundle") else "python -m audit.verify_bundle"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="the evidence bundle (JSON)")
    parser.add_argument(
        "--public-key",
        action="append",
        required=True,
        metavar="KEY",
        help="a trusted Ed25519 public key (base64 text, or a file with it or a PEM key); repeatable",
    )
    parser.add_argument(
        "--witness-key",
        action="append",
        default=[],
        metavar="VKEY",
        help="a witness's cosigner vkey (<name>+<key id>+<base64(0x04 || key)>, or a file with it); "
        "repeatable: the bundle's checkpoint must carry valid cosignatures of --witness-quorum of them",
    )
    parser.add_argument(
        "--witness-quorum",
        type=int,
        metavar="N",
        help="how many of the --witness-key witnesses must have cosigned (default: all of them)",
    )
    args = parser.parse_args(argv)
    try:
        keys = [_load_key(k) for k in args.public_key]
    except note.NoteError as exc:
        print(f"verify_bundle: bad --public-key: {exc}", file=sys.stderr)
        return 2
    try:
        policy = signednote.make_policy([_read(k) for k in args.witness_key], args.witness_quorum)
    except (note.NoteError, signednote.SignedNoteError) as exc:
        print(f"verify_bundle: bad witness policy: {exc}", file=sys.stderr)
        return 2
    if policy is None and args.witness_quorum is not None:
        print("verify_bundle: --witness-quorum needs --witness-key", file=sys.stderr)
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
    report = bundle.verify(data, keys, policy)
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
