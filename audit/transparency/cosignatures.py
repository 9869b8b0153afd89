"""The witnesses' cosignatures of checkpoints, as verification reads them: each stored cosignature by a
known witness key must verify and repeat its signed time (`check_cosignatures`), and under a witness
policy (N of M witness keys, `AUDIT_WITNESS_POLICY`) the checkpoint that covers what is verified must be
cosigned by at least N of them, each missing witness named with its last recorded refusal
(`policy_problems`). Used by `audit.transparency.verify` (`verify_audit`); the offline bundle verifier
checks the same with `audit.transparency.signednote` alone."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from audit.models import Checkpoint, WitnessAttempt, WitnessOutcome
from audit.transparency import note, signednote


def cosignature_lines(cp: Checkpoint) -> list[signednote.Signature]:
    """The stored cosignatures of a checkpoint as note signature lines (unreadable ones left out: their
    witness then counts as not having cosigned)."""
    lines = []
    for c in cp.cosignatures.all():
        try:
            lines.append(signednote.parse_signature_line(f"{signednote.DASH} {c.witness} {c.signature}"))
        except signednote.SignedNoteError:
            continue
    return lines


def check_cosignatures(
    cp: Checkpoint, witnesses: Sequence[signednote.Verifier], rows: Iterable[Any] | None = None
) -> list[str]:
    """Every stored cosignature of `cp` (`rows`, default read from the database) by a known witness key
    verifies and its columns repeat it."""
    where = f"checkpoint tree_size={cp.tree_size}"
    known = {(w.name, w.key_id.hex()): w for w in witnesses}
    if not known:
        return []
    problems = []
    for c in cp.cosignatures.all() if rows is None else rows:
        witness = known.get((c.witness, c.key_id))
        if witness is None:
            continue
        try:
            line = signednote.parse_signature_line(f"{signednote.DASH} {c.witness} {c.signature}")
            stamp = signednote.verify_cosignature(cp.body, line, witness)
        except signednote.SignedNoteError as exc:
            problems.append(f"{where}: stored cosignature of {c.witness}: {exc}")
            continue
        if int(c.cosigned_at.timestamp()) != stamp or c.cosigned_at.microsecond:
            problems.append(
                f"{where}: stored cosignature of {c.witness}: its time differs from the signed one"
            )
    return problems


def policy_problems(cp: Checkpoint | None, policy: signednote.Policy) -> list[str]:
    """The problems of `cp` (the checkpoint covering what is verified) under the witness policy, each
    naming the missing witnesses' last recorded refusal."""
    if cp is None:
        return []
    where = f"checkpoint tree_size={cp.tree_size}: witness policy"
    if note.is_legacy(cp.body):
        return [
            f"{where}: in the JSON format of before witnesses, without cosignatures ({policy.describe()} "
            "required); the next checkpoint is a signed note the witnesses cosign"
        ]
    verified, problems = signednote.check_policy(cp.body, cosignature_lines(cp), policy)
    refusals = []
    for w in policy.witnesses:
        if w.name in verified:
            continue
        last = WitnessAttempt.objects.filter(witness=w.name).order_by("-attempted_at", "-id").first()
        if last is not None and last.outcome != WitnessOutcome.COSIGNED:
            refusals.append(
                f"{w.name} last {last.outcome} (HTTP {last.status}) at size {last.tree_size}: {last.detail}"
            )
    suffix = f"; {'; '.join(refusals)}" if refusals else ""
    return [f"{where}: {p}{suffix}" for p in problems]
