"""The evidence bundle of one run, and its verification without Django, settings or a database.

A bundle (`diagnosis-audit-evidence/v1`, built by `audit.transparency.evidence`) is one JSON object: the
run's whole chain, the digests of its rows, its anchor in the log and its tail leaves; no reasoning or
assistant text, not even encrypted. `verify(bundle, public_keys)` checks every field and names where
each change is; it passes only when all of it holds and the run is anchored.
Details: docs/audit-integrity.md, *The evidence bundle (`audit/transparency/bundle.py`)*.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from audit.payloads import canonical_json, sha256_hex
from audit.transparency import leafdata, merkle, note, signednote
from audit.verify import chain_digests
from audit.verify.hash_chain import EVENT_FIELDS, GENESIS_HASH, chain_hash

FORMAT = "diagnosis-audit-evidence/v1"
TOP_KEYS = {"format", "runId", "sessionId", "events", "rows", "anchor"}
OPTIONAL_TOP_KEYS = {"tails"}
TAIL_KEYS = {"leafIndex", "leafData", "leafHash", "inclusionProof"}
EVENT_KEYS = {*EVENT_FIELDS, "prevHash", "hash"}
ROW_KEYS = {"digest", "form"}
REASONING_KEYS = {"stepIndex", "agentName", "digest"}
ANCHOR_KEYS = {"leafIndex", "leafData", "leafHash", "treeSize", "inclusionProof", "checkpoint"}


@dataclass(slots=True)
class Report:
    """`passed` lines say what held; `failures` what did not, each starting with where."""

    passed: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


class _Event:
    """A bundle event with the attributes `audit.verify.chain_digests` and `audit.transparency.leafdata`
    read."""

    __slots__ = ("created_at", "details", "event_type", "hash", "sequence_no", "status")

    def __init__(self, item: Mapping[str, Any]) -> None:
        self.sequence_no = item["sequenceNo"]
        self.event_type = item["eventType"]
        self.status = item["status"]
        self.details = item["details"]
        self.hash = item["hash"]
        self.created_at = item["createdAt"]


def _keys(value: Any, wanted: set[str], where: str, report: Report) -> bool:
    if not isinstance(value, dict):
        report.failures.append(f"{where}: not an object")
        return False
    if set(value) != wanted:
        said = []
        if wanted - set(value):
            said.append("missing " + ", ".join(sorted(wanted - set(value))))
        if set(value) - wanted:
            said.append("unexpected " + ", ".join(sorted(set(value) - wanted)))
        report.failures.append(f"{where}: {'; '.join(said)}")
        return False
    return True


def _digest(document: Any) -> str:
    return sha256_hex(canonical_json(document))


def verify(bundle: Any, public_keys: Sequence[Any], policy: signednote.Policy | None = None) -> Report:
    """Verify a parsed bundle against trusted Ed25519 public keys and, when given, a witness policy (N of
    M witness keys must have cosigned its checkpoint; see the module docstring)."""
    report = Report()
    wanted = TOP_KEYS | (OPTIONAL_TOP_KEYS & set(bundle)) if isinstance(bundle, dict) else TOP_KEYS
    if not _keys(bundle, wanted, "bundle", report):
        return report
    if bundle["format"] != FORMAT:
        report.failures.append(f"bundle: format is not {FORMAT}")
        return report
    run_id, session_id = bundle["runId"], bundle["sessionId"]
    events = _verify_chain(bundle["events"], run_id, session_id, report)
    if events is None:
        return report
    bindings = chain_digests.collect(events)
    _verify_rows(bundle["rows"], run_id, bindings, report)
    body = _verify_anchor(bundle["anchor"], run_id, session_id, events, public_keys, policy, report)
    _verify_tails(bundle.get("tails", []), bundle["anchor"], run_id, session_id, events, body, report)
    return report


def _verify_tails(
    tails: Any,
    anchor: Any,
    run_id: str,
    session_id: str,
    events: list[_Event],
    body: note.Body | note.NoteBody | None,
    report: Report,
) -> None:
    """Each run-tail leaf against the chain and the anchor's (already verified) checkpoint."""
    if not isinstance(tails, list):
        report.failures.append("tails: not a list")
        return
    try:
        newest = leafdata.decode(anchor["leafData"])["lastSequenceNo"] if anchor else 0
    except (ValueError, TypeError, KeyError, AttributeError):
        newest = 0
    by_seq = {e.sequence_no: e for e in events}
    before = len(report.failures)
    for i, tail in enumerate(tails):
        where = f"tails[{i}]"
        if not _keys(tail, TAIL_KEYS, where, report):
            continue
        try:
            fields = leafdata.decode_any(tail["leafData"])
        except (ValueError, TypeError, AttributeError):
            report.failures.append(f"{where}.leafData: not a leaf")
            continue
        if fields["kind"] != leafdata.KIND_RUN_TAIL or (fields["runId"], fields["sessionId"]) != (
            run_id,
            session_id,
        ):
            report.failures.append(f"{where}.leafData: not a tail of this run")
            continue
        seq = fields["lastSequenceNo"]
        if seq <= newest:
            report.failures.append(f"{where}: anchors sequence {seq}, not after the head anchored before")
        head = by_seq.get(seq)
        if head is None or head.hash != fields["chainHead"]:
            report.failures.append(f"{where}.leafData: differs from the chain at sequence {seq} (chainHead)")
        newest = max(newest, seq)
        leaf_hash = merkle.leaf_hash(tail["leafData"].encode("utf-8"))
        if leaf_hash.hex() != tail["leafHash"]:
            report.failures.append(f"{where}.leafHash: not the RFC 9162 hash of the leaf data")
        if body is None:
            report.failures.append(f"{where}: no verified checkpoint to prove it against")
            continue
        _included(leaf_hash, tail["leafIndex"], tail["inclusionProof"], body, where, report)
    if tails and len(report.failures) == before:
        report.passed.append(f"tails: {len(tails)} later head(s) anchored, up to sequence {newest}")
    later = [e.sequence_no for e in events if e.sequence_no > newest]
    if later and anchor is not None:
        report.notes.append(
            f"events {later[0]}–{later[-1]} were appended after the newest anchored head; "
            "the next checkpoint anchors them"
        )


def _verify_chain(items: Any, run_id: str, session_id: str, report: Report) -> list[_Event] | None:
    if not isinstance(items, list):
        report.failures.append("events: not a list")
        return None
    events: list[_Event] = []
    prev = GENESIS_HASH
    failed = False
    for i, item in enumerate(items):
        seq = item.get("sequenceNo") if isinstance(item, dict) else None
        where = f"events[{i}] (sequence {seq})"
        if not _keys(item, EVENT_KEYS, where, report):
            return None
        if seq != i + 1:
            report.failures.append(f"{where}: expected sequence {i + 1}")
            failed = True
        if item["runId"] != run_id or item["sessionId"] != session_id:
            report.failures.append(f"{where}: belongs to another run or session")
            failed = True
        if item["prevHash"] != prev:
            report.failures.append(f"{where}: prevHash is not the previous event's hash")
            failed = True
        payload = {k: item[k] for k in EVENT_FIELDS}
        if chain_hash(item["prevHash"], payload) != item["hash"]:
            report.failures.append(f"{where}: hash does not match the event's content")
            failed = True
        prev = item["hash"]
        events.append(_Event(item))
    if not failed:
        report.passed.append(
            f"chain: {len(events)} event(s), sequence 1..{len(events)}, every hash recomputed"
        )
    return events


def _row_check(
    entry: Any,
    where: str,
    form_name: str,
    run_id: str,
    binding: chain_digests.Bound | None,
    report: Report,
) -> bool:
    if not _keys(entry, ROW_KEYS, where, report):
        return False
    form = entry["form"]
    if not isinstance(form, dict) or form.get("form") != form_name or not isinstance(form.get("row"), dict):
        report.failures.append(f"{where}: not a {form_name} record")
        return False
    ok = True
    if _digest(form) != entry["digest"]:
        report.failures.append(f"{where}: the record does not match its digest")
        ok = False
    row_run = form["row"].get("run_id")
    if row_run is not None and row_run != run_id:
        report.failures.append(f"{where}: the record belongs to another run")
        ok = False
    if binding is None:
        report.failures.append(f"{where}: not recorded in the chain")
        return False
    if binding.digest is None:
        report.notes.append(f"{where}: recorded before row digests (not bound)")
        return ok
    if binding.digest != entry["digest"]:
        report.failures.append(
            f"{where}: digest differs from the one bound at sequence {binding.sequence_no}"
        )
        return False
    return ok


def _verify_identity(identity: Any, run_id: str, b: chain_digests.Bindings, report: Report) -> int:
    """The run's identity and its session's against RUN_STARTED's digests; returns how many were
    checked. A chain that binds none (a run started before identity digests) must carry none."""
    if not _keys(identity, {"start", "session"}, "rows.identity", report):
        return 0
    document = b.configuration
    if (
        b.config_fingerprint
        and isinstance(document, dict)
        and not document.get("truncated")
        and sha256_hex(canonical_json(document)) != b.config_fingerprint
    ):
        report.failures.append("RUN_STARTED: the chained configuration does not hash to its fingerprint")
    checked = 0
    for name, binding, what in (
        ("start", b.started, "the run's question, flow, session and creation"),
        ("session", b.session, "its session's owner and creation"),
    ):
        entry, where = identity[name], f"rows.identity.{name} ({what})"
        if binding is None or binding.digest is None:
            if entry is not None:
                report.failures.append(f"{where}: the chain binds no such record")
            continue
        if entry is None:
            report.failures.append(f"{where}: bound at sequence {binding.sequence_no}, missing")
            continue
        _row_check(entry, where, binding.form or "", run_id, binding, report)
        checked += 1
    return checked


def _verify_rows(rows: Any, run_id: str, b: chain_digests.Bindings, report: Report) -> None:
    # `reviews` (the run's review rows) is in every bundle built since reviews exist, `identity` (the
    # run's question, flow and session, its session's owner) since RUN_STARTED binds them; older
    # bundles have neither, and those events are checked with the chain only.
    with_reviews = isinstance(rows, dict) and "reviews" in rows
    with_identity = isinstance(rows, dict) and "identity" in rows
    wanted = {"steps", "tools", "reasoning", "run"} | ({"reviews"} if with_reviews else set())
    wanted |= {"identity"} if with_identity else set()
    if not _keys(rows, wanted, "rows", report):
        return
    before = len(report.failures)
    steps, tools = dict(b.steps), dict(b.tools)
    reasoning = dict(b.reasoning)
    checked = 0
    for name, entries, label in (
        ("steps", rows["steps"], "model step"),
        ("tools", rows["tools"], "tool call"),
    ):
        if not isinstance(entries, list):
            report.failures.append(f"rows.{name}: not a list")
            continue
        for i, entry in enumerate(entries):
            row = entry.get("form", {}).get("row", {}) if isinstance(entry, dict) else {}
            row = row if isinstance(row, dict) else {}
            if name == "steps":
                key = chain_digests.step_key(row.get("step_index"), row.get("agent_name"))
                where = f"rows.{name}[{i}] ({chain_digests.step_label(key)})"
                binding = steps.pop(key, None)
                form_name = "step"
            else:
                key = row.get("tool_call_id")
                where = f"rows.{name}[{i}] ({label} {key})"
                binding = tools.pop(key, None)
                form_name = (binding.form if binding is not None else None) or "tool"
            _row_check(entry, where, form_name, run_id, binding, report)
            checked += 1
    entries = rows["reasoning"]
    if not isinstance(entries, list):
        report.failures.append("rows.reasoning: not a list")
        entries = []
    for i, entry in enumerate(entries):
        key = (entry.get("stepIndex"), entry.get("agentName")) if isinstance(entry, dict) else (None, None)
        where = f"rows.reasoning[{i}] (step {key[0]} ({key[1]}))"
        if not _keys(entry, REASONING_KEYS, where, report):
            continue
        binding = reasoning.pop(key, None)
        checked += 1
        if binding is None:
            report.failures.append(f"{where}: not recorded in the chain")
        elif binding.digest is None:
            report.notes.append(f"{where}: recorded before row digests (not bound)")
        elif binding.digest != entry["digest"]:
            report.failures.append(
                f"{where}: digest differs from the one bound at sequence {binding.sequence_no}"
            )
        elif binding.purged:
            report.notes.append(f"{where}: content purged by governance (sequence {binding.sequence_no})")
    if with_reviews:
        reviews = dict(b.reviews)
        entries = rows["reviews"] if isinstance(rows["reviews"], list) else []
        if not isinstance(rows["reviews"], list):
            report.failures.append("rows.reviews: not a list")
        for i, entry in enumerate(entries):
            row = entry.get("form", {}).get("row", {}) if isinstance(entry, dict) else {}
            key = str(row.get("review_id")) if isinstance(row, dict) else "None"
            _row_check(
                entry, f"rows.reviews[{i}] (review {key})", "review", run_id, reviews.pop(key, None), report
            )
            checked += 1
        for key, binding in reviews.items():
            report.failures.append(f"rows: review {key} bound at sequence {binding.sequence_no} is missing")
    if with_identity:
        checked += _verify_identity(rows["identity"], run_id, b, report)
    run_entry = rows["run"]
    if b.finished is not None:
        seq, digest, _, form_name = b.finished
        if run_entry is None:
            if digest is not None:
                report.failures.append(f"rows.run: the terminal summary bound at sequence {seq} is missing")
        else:
            where = "rows.run (terminal summary)"
            _row_check(run_entry, where, form_name or "run", run_id, chain_digests.Bound(seq, digest), report)
            checked += 1
    elif run_entry is not None:
        report.failures.append("rows.run: the chain records no RUN_FINISHED to bind it")
    for what, binding in chain_digests.unclaimed(steps, tools, reasoning):
        report.failures.append(f"rows: {what} bound at sequence {binding.sequence_no} is missing")
    if len(report.failures) == before:
        report.passed.append(f"rows: {checked} record(s) match the digests their chain binds")


def _verify_anchor(
    anchor: Any,
    run_id: str,
    session_id: str,
    events: list[_Event],
    public_keys: Sequence[Any],
    policy: signednote.Policy | None,
    report: Report,
) -> None:
    """Verify the anchor; returns the checkpoint's body when its signature verified (else None)."""
    if anchor is None:
        report.failures.append("anchor: the run is not anchored in the transparency log yet")
        return None
    if not _keys(anchor, ANCHOR_KEYS, "anchor", report):
        return None
    before = len(report.failures)
    try:
        fields = leafdata.decode(anchor["leafData"])
    except (ValueError, TypeError, AttributeError):
        report.failures.append("anchor.leafData: not a run leaf")
        return None
    last = fields["lastSequenceNo"]
    prefix = leafdata.anchored_prefix(events, last) if isinstance(last, int) else []
    expected = leafdata.run_leaf(run_id=run_id, session_id=session_id, events=prefix)
    write_key = leafdata.write_key_id(fields)
    if write_key is not None:
        expected[leafdata.WRITE_KEY_ID] = write_key  # the service's to check: it holds the key
    if fields != expected:
        differing = ", ".join(k for k in leafdata.FIELDS if fields.get(k) != expected.get(k))
        report.failures.append(f"anchor.leafData: differs from the chain up to sequence {last} ({differing})")
    cut = last if isinstance(last, int) else 0
    not_governance = [
        e.sequence_no
        for e in events
        if e.sequence_no > cut and e.event_type not in chain_digests.GOVERNANCE_EVENTS
    ]
    if not_governance:
        report.failures.append(
            f"events after the anchored sequence {last} are not governance events: {not_governance[:5]}"
        )
    leaf_hash = merkle.leaf_hash(anchor["leafData"].encode("utf-8"))
    if leaf_hash.hex() != anchor["leafHash"]:
        report.failures.append("anchor.leafHash: not the RFC 9162 hash of the leaf data")
    body, signed = _verify_checkpoint(anchor["checkpoint"], public_keys, policy, report)
    if body is None:
        return None
    if anchor["treeSize"] != body.tree_size:
        report.failures.append("anchor.treeSize: not the checkpoint's tree size")
    _included(leaf_hash, anchor["leafIndex"], anchor["inclusionProof"], body, "anchor", report)
    if len(report.failures) == before:
        report.passed.append(
            f"anchor: leaf {anchor['leafIndex']} recomputed from the chain (sequence 1..{last}), included in "
            f"the checkpoint of tree size {body.tree_size} signed {body.signed_at} by key {signed}"
        )
        report.passed.append(
            f"write authentication: the signed leaf says the service verified write key {write_key}'s tag on "
            "the anchored head before anchoring it"
            if write_key
            else "write authentication: the run was anchored before write authentication (the signed log "
            "vouches for it)"
        )
    return body if signed else None


def _verify_checkpoint(
    checkpoint: Any, public_keys: Sequence[Any], policy: signednote.Policy | None, report: Report
) -> tuple[note.Body | note.NoteBody | None, str]:
    """(the checkpoint's body or None when unreadable, the id of the given key that signed it or "").

    Any format: `{"note": <C2SP signed note: checkpoint body, the log's signature line, the witnesses'
    cosignature lines>, "link": <its link, a signed note>}` (a plain checkpoint, since issue 50),
    `{"note"}` alone (a body with extension lines, issues 35 to 49), or `{"body", "signature"}` (the JSON
    checkpoints of before issue 35, which carry no cosignatures). With a witness `policy`, the checkpoint
    must carry a valid cosignature of at least its quorum of witness keys."""
    legacy = isinstance(checkpoint, dict) and "note" not in checkpoint
    linked = isinstance(checkpoint, dict) and "link" in checkpoint
    wanted = {"body", "signature"} if legacy else {"note", "link"} if linked else {"note"}
    if not _keys(checkpoint, wanted, "anchor.checkpoint", report):
        return None, ""
    link_signature, part = "", "body" if legacy else "note"
    try:
        if legacy:
            text, signature, cosignatures = checkpoint["body"], checkpoint["signature"], []
            body = note.parse_body(text)
        else:
            text, lines = signednote.split_note(checkpoint["note"])
            link_text = None
            if "link" in checkpoint:
                part = "link"
                link_text, link_lines = signednote.split_note(checkpoint["link"])
                part = "note"
            body = note.parse_note_body(text, link_text)
            own = [s for s in lines if s.name == body.origin]
            cosignatures = [s for s in lines if s.name != body.origin]
            signature = _own_signature(own, body, public_keys)
            if link_text is not None:
                part = "link"
                link_signature = _own_signature(
                    [s for s in link_lines if s.name == body.origin], body, public_keys
                )
    except (note.NoteError, signednote.SignedNoteError, TypeError, AttributeError) as exc:
        report.failures.append(f"anchor.checkpoint.{part}: {exc}")
        return None, ""
    signed = ""
    key = note.find_signer(body, signature, list(public_keys))
    if key is None:
        named = note.signer_key_id(body, signature) or "none"
        given = ", ".join(_given_ids(body, public_keys)) or "none"
        report.failures.append(f"anchor.checkpoint: signed by key {named}, not by a key given ({given})")
    else:
        try:
            note.verify_checkpoint(text, body, signature, key, link_signature)
            signed = note.signer_key_id(body, signature)
        except note.NoteError as exc:
            report.failures.append(f"anchor.checkpoint.signature: {exc}")
    if policy is not None:
        if legacy:
            report.failures.append(
                "anchor.checkpoint: witness policy: the checkpoint is in the JSON format of before witnesses "
                f"and carries no cosignatures ({policy.describe()} required); build the bundle again after "
                "the next witnessed checkpoint"
            )
        else:
            verified, problems = signednote.check_policy(text, cosignatures, policy)
            for problem in problems:
                report.failures.append(f"anchor.checkpoint: witness policy: {problem}")
            if not problems:
                report.passed.append(
                    f"witnesses: the checkpoint of tree size {body.tree_size} is cosigned by "
                    f"{', '.join(verified)} ({policy.describe()}, {policy.quorum} required)"
                )
    return body, signed


def _own_signature(lines: list[signednote.Signature], body: note.NoteBody, public_keys: Sequence[Any]) -> str:
    """The stored form (base64 of key id and signature) of the log's signature line by a given key, else
    of its first signature line under the origin (named as unknown), else ""."""
    wanted = {note.note_key_id(body.origin, k) for k in public_keys}
    chosen = next((s for s in lines if s.key_id.hex() in wanted), lines[0] if lines else None)
    if chosen is None:
        return ""
    return base64.b64encode(chosen.key_id + chosen.signature).decode("ascii")


def _given_ids(body: note.Body | note.NoteBody, public_keys: Sequence[Any]) -> list[str]:
    if isinstance(body, note.NoteBody):
        return [note.note_key_id(body.origin, k) for k in public_keys]
    return [note.key_id(k) for k in public_keys]


def _included(
    leaf_hash: bytes, index: Any, proof: Any, body: note.Body | note.NoteBody, where: str, report: Report
) -> None:
    """The leaf at `index` is in the tree `body` signs, by the RFC 9162 inclusion `proof` (hex hashes)."""
    try:
        hashes = [bytes.fromhex(h) for h in proof]
        if not isinstance(index, int) or isinstance(index, bool):
            raise merkle.ProofError("leafIndex is not an integer")
        merkle.verify_inclusion(leaf_hash, index, body.tree_size, hashes, bytes.fromhex(body.root_hash))
    except (merkle.ProofError, ValueError, TypeError) as exc:
        report.failures.append(f"{where}.inclusionProof: {exc}")


def bundle_hash(text: bytes) -> str:
    """SHA-256 of a bundle file, to name exactly what was verified."""
    return hashlib.sha256(text).hexdigest()
