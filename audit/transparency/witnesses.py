"""Witness cosigning: each new checkpoint is submitted, with its consistency proof, to the configured
witnesses over the C2SP `tlog-witness` protocol, and their cosignatures are stored beside it.

`submit_all` (after every checkpoint run commits) brings each witness of `settings.AUDIT_WITNESSES` up to
the newest checkpoint; every attempt is recorded and exported on `/metrics`, and a refusal is logged,
never raised. `check_sizes` (for `verify_audit`) asks each witness live which size it cosigned, trusting
no stored row. Details: docs/audit-integrity.md, *Witnesses*.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from dataclasses import dataclass

import httpx
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from audit.models import Checkpoint, CheckpointCosignature, WitnessAttempt, WitnessOutcome
from audit.transparency import note, signednote, store

logger = logging.getLogger(__name__)

SIZE_CONTENT_TYPE = "text/x.tlog.size"
MAX_RESPONSE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Witness:
    url: str  # the submission prefix
    verifier: signednote.Verifier

    @property
    def name(self) -> str:
        return self.verifier.name


def parse_witness(text: str) -> Witness:
    """One `AUDIT_WITNESSES` entry: `<URL> <cosigner vkey>`."""
    parts = text.split()
    if len(parts) != 2 or not parts[0].startswith(("http://", "https://")):
        raise ValueError("an AUDIT_WITNESSES entry is '<http(s) URL> <vkey>'")
    verifier = signednote.parse_vkey(parts[1])
    if verifier.key_type != signednote.COSIGNATURE_V1:
        raise ValueError(f"witness {verifier.name}: its vkey is not a cosigner key (type 0x04)")
    return Witness(parts[0].rstrip("/"), verifier)


def configured() -> list[Witness]:
    found = []
    for position, text in enumerate(settings.AUDIT_WITNESSES, start=1):
        if not text.strip():
            continue
        try:
            found.append(parse_witness(text))
        except ValueError as exc:
            raise ImproperlyConfigured(f"AUDIT_WITNESSES entry {position}: {exc}") from exc
    return found


def policy() -> signednote.Policy | None:
    """The witness policy of this deployment (`AUDIT_WITNESS_POLICY` vkeys, `AUDIT_WITNESS_QUORUM` of
    them, 0 meaning all), None without one."""
    quorum = int(settings.AUDIT_WITNESS_QUORUM or 0) or None
    try:
        return signednote.make_policy(list(settings.AUDIT_WITNESS_POLICY), quorum)
    except signednote.SignedNoteError as exc:
        raise ImproperlyConfigured(f"AUDIT_WITNESS_POLICY: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Outcome:
    witness: str
    outcome: str
    status: int = 0
    detail: str = ""


def submit_all(*, client: httpx.Client | None = None) -> list[Outcome]:
    """Submit the newest checkpoint to each configured witness that has not cosigned it (see the module
    docstring); returns each attempt's outcome."""
    witnesses = configured()
    if not witnesses:
        return []
    newest = Checkpoint.objects.order_by("-tree_size").first()
    if newest is None or note.is_legacy(newest.body):
        return []
    own = client or new_client()
    outcomes = []
    try:
        for witness in witnesses:
            if newest.cosignatures.filter(
                witness=witness.name, key_id=witness.verifier.key_id.hex()
            ).exists():
                continue
            try:
                outcomes.append(submit(witness, newest, own))
            except Exception as exc:  # never raised into the checkpointer: recorded and retried
                logger.exception("witness submission failed witness=%s", witness.name)
                outcomes.append(
                    _record(witness, newest, 0, WitnessOutcome.SERVER_ERROR, 0, type(exc).__name__)
                )
    finally:
        if client is None:
            own.close()
    return outcomes


def last_cosigned_size(witness: Witness) -> int:
    return (
        CheckpointCosignature.objects.filter(
            witness=witness.name, key_id=witness.verifier.key_id.hex()
        ).aggregate(size=Max("checkpoint__tree_size"))["size"]
        or 0
    )


def new_client() -> httpx.Client:
    """An HTTP client for the witnesses: `AUDIT_WITNESS_TIMEOUT_SECONDS` per request, no redirects."""
    timeout = float(settings.AUDIT_WITNESS_TIMEOUT_SECONDS)
    return httpx.Client(timeout=timeout, follow_redirects=False)


def post(client: httpx.Client, witness: Witness, body: bytes) -> tuple[int, str]:
    """POST an add-checkpoint request to the witness: (status, at most the first `MAX_RESPONSE_BYTES` of
    the answer, decoded; a longer answer is not read further). Raises `httpx.HTTPError` when the witness
    cannot be reached or does not answer in time."""
    headers = {"Content-Type": "text/plain; charset=utf-8"}
    with client.stream("POST", f"{witness.url}/add-checkpoint", content=body, headers=headers) as response:
        data = bytearray()
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) >= MAX_RESPONSE_BYTES:
                break
    return response.status_code, bytes(data[:MAX_RESPONSE_BYTES]).decode("utf-8", "replace")


def request_body(cp: Checkpoint, old: int) -> bytes:
    """The add-checkpoint request: `old <size>`, the consistency proof lines, a blank line, the note."""
    proof = store.consistency_proof(old, cp.tree_size).hashes if 0 < old < cp.tree_size else []
    origin = note.parse_note_body(cp.body).origin
    lines = [f"old {old}\n"] + [base64.b64encode(h).decode("ascii") + "\n" for h in proof]
    return ("".join(lines) + "\n" + note.signed_note(cp.body, origin, cp.signature)).encode("utf-8")


def submit(witness: Witness, cp: Checkpoint, client: httpx.Client) -> Outcome:
    old = last_cosigned_size(witness)
    if old > cp.tree_size:
        old = 0  # cannot be: ask the witness where it stands (409)
    retried = ""
    for _ in range(2):
        try:
            status, text = post(client, witness, request_body(cp, old))
        except httpx.HTTPError as exc:
            return _record(witness, cp, old, WitnessOutcome.UNREACHABLE, 0, type(exc).__name__)
        if status == 409:
            size = _size(text)
            if size is None:
                return _record(witness, cp, old, WitnessOutcome.BAD_RESPONSE, 409, "409 without a tree size")
            if size != old and size <= cp.tree_size and Checkpoint.objects.filter(tree_size=size).exists():
                retried = f" (after a 409: the witness was at size {size})"
                old = size  # submit again, proving consistency from the witness's size
                continue
            return _record(
                witness,
                cp,
                old,
                WitnessOutcome.CONFLICT,
                409,
                f"the witness is at size {size}, which this log cannot prove consistent with {cp.tree_size}",
            )
        return _answer(witness, cp, old, status, text, retried)
    return _record(witness, cp, old, WitnessOutcome.CONFLICT, 409, "the witness moved while we retried")


def _size(text: str) -> int | None:
    line = text.strip()
    return int(line) if line.isascii() and line.isdigit() else None


REFUSALS = {
    403: (WitnessOutcome.FORBIDDEN, "no signature by a key the witness trusts for this origin"),
    404: (WitnessOutcome.UNKNOWN_LOG, "the witness does not know this log's origin"),
    422: (WitnessOutcome.BAD_PROOF, "the consistency proof (or the same-size root) does not verify"),
}


def _answer(witness: Witness, cp: Checkpoint, old: int, status: int, text: str, retried: str) -> Outcome:
    if status in REFUSALS:
        outcome, why = REFUSALS[status]
        return _record(witness, cp, old, outcome, status, why + retried)
    if status >= 500:
        return _record(witness, cp, old, WitnessOutcome.SERVER_ERROR, status, text.strip()[:200])
    if status != 200:
        return _record(witness, cp, old, WitnessOutcome.BAD_REQUEST, status, text.strip()[:200])
    try:
        found = cosignature_in(witness, cp, text)
    except signednote.SignedNoteError as exc:
        return _record(witness, cp, old, WitnessOutcome.BAD_RESPONSE, status, str(exc))
    if found is None:
        return _record(
            witness, cp, old, WitnessOutcome.BAD_RESPONSE, status, "no cosignature by the configured key"
        )
    _store(witness, cp, *found)
    return _record(witness, cp, old, WitnessOutcome.COSIGNED, status, retried.strip(" ()"))


def cosignature_in(witness: Witness, cp: Checkpoint, text: str) -> tuple[signednote.Signature, int] | None:
    """The configured key's cosignature of `cp` in a 200's body of signature lines, with its signed time;
    None when there is none (lines by other keys are ignored, as the client MUST); raises
    `signednote.SignedNoteError` when it does not verify."""
    for line in text.splitlines():
        try:
            signature = signednote.parse_signature_line(line)
        except signednote.SignedNoteError:
            continue
        if (signature.name, signature.key_id) != (witness.name, witness.verifier.key_id):
            continue
        return signature, signednote.verify_cosignature(cp.body, signature, witness.verifier)
    return None


def _store(witness: Witness, cp: Checkpoint, signature: signednote.Signature, stamp: int) -> None:
    value = base64.b64encode(signature.key_id + signature.signature).decode("ascii")
    try:
        with transaction.atomic():
            CheckpointCosignature.objects.create(
                checkpoint=cp,
                witness=witness.name,
                key_id=signature.key_id.hex(),
                cosigned_at=dt.datetime.fromtimestamp(stamp, tz=dt.UTC),
                signature=value,
                received_at=timezone.now(),
            )
    except IntegrityError:
        pass  # another process stored this witness's cosignature of the checkpoint first


def _record(witness: Witness, cp: Checkpoint, old: int, outcome: str, status: int, detail: str) -> Outcome:
    WitnessAttempt.objects.create(
        witness=witness.name,
        url=witness.url[:500],
        tree_size=cp.tree_size,
        old_size=old,
        outcome=outcome,
        status=status,
        detail=detail[:500],
        attempted_at=timezone.now(),
    )
    if outcome != WitnessOutcome.COSIGNED:
        logger.warning(
            "witness refused witness=%s outcome=%s status=%s tree_size=%s old=%s detail=%s",
            witness.name,
            outcome,
            status,
            cp.tree_size,
            old,
            detail,
        )
    return Outcome(witness.name, str(outcome), status, detail)


# --------------------------------------------------------------------------------------------------
# Asking the witnesses for their size (`verify_audit`): a log cut back below what they cosigned
# --------------------------------------------------------------------------------------------------
NO_NOTE = "the log has no checkpoint in the signed-note format to submit"


@dataclass(frozen=True, slots=True)
class WitnessSize:
    """A witness's live answer to the log's newest checkpoint submitted at its own size: `size`, the tree
    size it has cosigned for the log's origin (None when it could not be asked: `failure` says why, by
    status or exception class, never by content); `other_root` when it cosigned another tree of that
    very size (422)."""

    witness: Witness
    size: int | None = None
    other_root: bool = False
    failure: str = ""


def ask_sizes(newest: Checkpoint | None, *, client: httpx.Client | None = None) -> list[WitnessSize]:
    """Ask each configured witness which tree size it has cosigned for this log's origin, by the protocol
    itself: `newest` (the log's newest checkpoint) submitted with `old` = its own size and no proof, a
    conforming add-checkpoint. A witness at that size with that root answers 200 and its cosignature
    (verified with the configured key, not stored); at another size 409 and its size; at that size with
    another root 422. Reads and writes nothing in the database: only the witnesses' live answers count."""
    found = configured()
    if not found:
        return []
    try:
        if newest is None or note.is_legacy(newest.body):
            raise note.NoteError(NO_NOTE)
        body = request_body(newest, newest.tree_size)
    except note.NoteError:
        return [WitnessSize(w, failure=NO_NOTE) for w in found]
    own = client or new_client()
    try:
        return [ask_size(w, newest, body, own) for w in found]
    finally:
        if client is None:
            own.close()


def ask_size(witness: Witness, cp: Checkpoint, body: bytes, client: httpx.Client) -> WitnessSize:
    """One witness's answer to `body`, the request submitting `cp` at its own size (`ask_sizes`)."""
    try:
        status, text = post(client, witness, body)
    except httpx.HTTPError as exc:
        return WitnessSize(witness, failure=f"unreachable ({type(exc).__name__})")
    if status == 409:
        size = _size(text)
        if size is None or size == cp.tree_size:
            return WitnessSize(witness, failure="HTTP 409 without another tree size")
        return WitnessSize(witness, size)
    if status == 422:
        return WitnessSize(witness, cp.tree_size, other_root=True)
    if status != 200:
        why = REFUSALS[status][1] if status in REFUSALS else ""
        return WitnessSize(witness, failure=f"HTTP {status}" + (f" ({why})" if why else ""))
    try:
        if cosignature_in(witness, cp, text) is not None:
            return WitnessSize(witness, cp.tree_size)
    except signednote.SignedNoteError:
        pass
    return WitnessSize(witness, failure="HTTP 200 without a valid cosignature by the configured key")


def size_findings(
    answers: list[WitnessSize], newest: int, stored: set[int], policy: signednote.Policy | None
) -> tuple[list[str], list[str]]:
    """(problems, notes) of the witnesses' answers against `newest`, the size of the log's newest
    checkpoint as verified; `stored`: those of the witnesses' sizes that are sizes of checkpoints stored
    now (read after asking). A witness ahead of the log is a problem (rolled back) unless a checkpoint of
    its size was signed meanwhile (a note: verify again); behind it, a note when the log has a checkpoint
    of its size (the checkpointer catches it up), else a problem (cut back and grown again); another root
    at the log's size, a problem. One that could not be asked is a note, or a problem when it belongs to
    the policy and fewer than the policy's quorum of its witnesses answered (fail closed)."""
    members = {(w.name, w.key_id) for w in policy.witnesses} if policy else set()
    answered = sum(1 for a in answers if a.size is not None and _key(a.witness) in members)
    short = policy is not None and answered < policy.quorum
    problems: list[str] = []
    notes: list[str] = []
    for a in answers:
        name, size = a.witness.name, a.size
        said = f"witness {name} has cosigned tree size {size}; the log's newest checkpoint is {newest}"
        if size is None:
            line = f"witness {name} could not be asked for its size: {a.failure}"
            (problems if short and _key(a.witness) in members else notes).append(line)
        elif a.other_root:
            problems.append(
                f"witness {name} has cosigned tree size {size} with another root than the log's newest "
                "checkpoint (the log was rebuilt)"
            )
        elif size > newest and size in stored:
            notes.append(f"{said}, and a checkpoint of that size was signed meanwhile: verify again")
        elif size > newest:
            problems.append(f"{said} (the log was rolled back)")
        elif size < newest and (size == 0 or size in stored):
            notes.append(f"{said} (the witness is behind: the checkpointer's next submission catches it up)")
        elif size < newest:
            problems.append(
                f"witness {name} has cosigned tree size {size}, the size of no checkpoint of the log (newest "
                f"{newest}): the log was cut back and grew again, or was rebuilt"
            )
    return problems, notes


def _key(witness: Witness) -> tuple[str, bytes]:
    return witness.name, witness.verifier.key_id


@dataclass(frozen=True, slots=True)
class SizeCheck:
    problems: list[str]
    notes: list[str]
    asked: int  # configured witnesses asked
    at_size: int  # of them, at the log's newest size with its root


def check_sizes(
    newest: Checkpoint | None, policy: signednote.Policy | None, *, client: httpx.Client | None = None
) -> SizeCheck:
    """Ask the configured witnesses for their sizes (`ask_sizes`) and judge the answers against `newest`,
    the log's newest checkpoint as verified (`size_findings`)."""
    answers = ask_sizes(newest, client=client)
    sizes = {a.size for a in answers if a.size is not None}
    stored = set(Checkpoint.objects.filter(tree_size__in=sizes).values_list("tree_size", flat=True))
    size = newest.tree_size if newest is not None else 0
    problems, notes = size_findings(answers, size, stored, policy)
    at_size = sum(1 for a in answers if a.size == size and not a.other_root)
    return SizeCheck(problems, notes, len(answers), at_size)
