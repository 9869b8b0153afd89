"""A stored checkpoint on its own — its body, columns, key and signature — and the witness file's
copies of checkpoints (one `{"body", "signature"[, "link", "linkSignature"]}` JSON object per line,
`AUDIT_WITNESS_PATH`). Used by
the log's verification (`audit.transparency.verify`) and by every writer that must know a leaf is
signed before it trusts it (`audit.verify.authenticity`). Messages name sizes and key ids, never content."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from audit.models import Checkpoint, CheckpointCosignature
from audit.transparency import note, signednote
from audit.transparency.cosignatures import check_cosignatures
from audit.verify.hash_chain import timestamp


@dataclass(frozen=True, slots=True)
class WitnessEntry:
    line: int
    body: str
    signature: str
    link: str = ""
    link_signature: str = ""


def read_witness(path: str) -> list[WitnessEntry]:
    """The checkpoints of a witness file (one `{"body", "signature"}` JSON object per line)."""
    entries = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                entries.append(
                    WitnessEntry(
                        number,
                        str(item["body"]),
                        str(item["signature"]),
                        str(item.get("link", "")),
                        str(item.get("linkSignature", "")),
                    )
                )
            except (ValueError, KeyError, TypeError):
                entries.append(WitnessEntry(number, "", ""))
    return entries


def check_checkpoint(cp: Any, known: dict[str, Any]) -> list[str]:
    """The problems of one stored checkpoint on its own (body, columns, key, signature), in either
    format (`audit.transparency.note.parse_any`); a plain one with its signed link."""
    where = f"checkpoint tree_size={cp.tree_size}"
    try:
        body = note.parse_any(cp.body, cp.link)
    except note.NoteError as exc:
        return [f"{where}: {exc}"]
    problems = []
    signer = note.signer_key_id(body, cp.signature)
    columns = (cp.tree_size, cp.root_hash, cp.previous_hash, cp.key_id, timestamp(cp.signed_at))
    if columns != (body.tree_size, body.root_hash, body.previous, signer, body.signed_at):
        problems.append(f"{where}: stored columns differ from its signed body")
    if note.statement_hash(cp.body, cp.link) != cp.checkpoint_hash:
        problems.append(f"{where}: stored hash is not the hash of its {'link' if cp.link else 'body'}")
    problems.extend(
        f"{where}{p}" for p in _signature_problems(cp.body, body, cp.signature, known, cp.link_signature)
    )
    return problems


def _signature_problems(
    text: str, body, signature: str, known: dict[str, Any], link_signature: str = ""
) -> list[str]:
    """Problems (each starting with ": " or " (…)") of a checkpoint's signature (and its link's) by a
    known key."""
    signer = note.signer_key_id(body, signature)
    public = note.find_signer(body, signature, list(known.values()))
    if public is None:
        return [f": signed by unknown key {signer or '?'}"]
    try:
        note.verify_checkpoint(text, body, signature, public, link_signature)
    except note.NoteError as exc:
        return [f": {exc} (key {signer})"]
    return []


def witness_problems(entries: Sequence[WitnessEntry], known: dict[str, Any]) -> tuple[list[str], list]:
    problems, bodies = [], []
    for entry in entries:
        where = f"witness line {entry.line}"
        try:
            body = note.parse_any(entry.body, entry.link)
        except note.NoteError as exc:
            problems.append(f"{where}: {exc}")
            continue
        found = _signature_problems(entry.body, body, entry.signature, known, entry.link_signature)
        if found:
            problems.extend(f"{where} (tree_size={body.tree_size}){p}" for p in found)
            continue
        bodies.append((entry, body))
    return problems, bodies


def checkpoint_targets(
    invalid: list[str],
    checkpoints: list[Checkpoint],
    known: Any,
    cosigners: list[signednote.Verifier],
    witness: Sequence[WitnessEntry],
    *,
    previous: str = "",
) -> dict[int, list[tuple[str, str]]]:
    """Check the checkpoints on their own (signatures, cosignatures) and their chain, and the witnessed
    ones against them (problems appended to `invalid`); returns the roots the leaves must produce, by
    tree size (label, root). For `audit.transparency.verify.verify_log`; `previous`: the hash the first
    checkpoint must name ("" from the log's first, else that of the verified checkpoint it continues)."""
    targets: dict[int, list[tuple[str, str]]] = {}
    cosignatures: dict[int, list[CheckpointCosignature]] = {}
    if cosigners:  # one query for all of them, and none without a witness key to check them with
        for c in CheckpointCosignature.objects.order_by("id"):
            cosignatures.setdefault(c.checkpoint_id, []).append(c)
    for cp in checkpoints:
        invalid.extend(check_checkpoint(cp, known))
        invalid.extend(check_cosignatures(cp, cosigners, cosignatures.get(cp.pk, [])))
        if cp.previous_hash != previous:
            invalid.append(f"checkpoint tree_size={cp.tree_size}: does not name the previous checkpoint")
        previous = cp.checkpoint_hash
        targets.setdefault(cp.tree_size, []).append((f"checkpoint tree_size={cp.tree_size}", cp.root_hash))
    from_witness, witnessed = witness_problems(witness, known)
    invalid.extend(from_witness)
    by_size = {cp.tree_size: cp for cp in checkpoints}
    for entry, body in witnessed:
        stored = by_size.get(body.tree_size)
        if stored is not None and (stored.body, stored.link) != (entry.body, entry.link):
            invalid.append(
                f"witness line {entry.line}: checkpoint tree_size={body.tree_size} in the database differs "
                "from the witnessed one"
            )
        elif stored is None:
            invalid.append(
                f"witness line {entry.line}: checkpoint tree_size={body.tree_size} (signed {body.signed_at}) "
                "is missing from the database"
            )
        targets.setdefault(body.tree_size, []).append(
            (f"witnessed tree_size={body.tree_size}", body.root_hash)
        )
    return targets
