"""Write a golden vector file from the inputs below and the project's code: only for a deliberate format
version change (docs/audit-hash_chain.md, "The pinned format"). Usage, from the repository root:

    DEBUG=true .venv/bin/python -m tests.audit.vectors.generate > /tmp/format-vN.json

then review every changed output against `reference.py` (the tests do it too) and commit the file under
a new version; the vectors of a version already handed out are never rewritten.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import sys
from typing import Any

FORMAT_VERSION = 1
T0 = "2026-03-01T12:00:00.000001+00:00"
RUN = "run_0f3c2a9e"
SESSION = "sess_77b1"
# RFC 8032 §7.1 TEST 1: a published Ed25519 key, so the vectors' public key can be checked against the RFC.
ED25519_SEED = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"
ED25519_PUBLIC = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
WITNESS_SEED = "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb"  # RFC 8032 TEST 2
WRITE_KEYS = [bytes(range(32)), bytes(range(32, 64))]  # two key ids: a rotation
GENESIS = "0" * 64


def _dt(text: str) -> dict:
    return {"$dt": text}


def _event(seq: int, **changes: Any) -> dict[str, Any]:
    event = {
        "runId": RUN,
        "sessionId": SESSION,
        "sequenceNo": seq,
        "phase": "ROUTING",
        "eventType": "ROUTING_DECISION",
        "status": "OK",
        "summary": f"event {seq}",
        "details": {"n": seq},
        "createdAt": _dt(f"2026-03-01T12:00:{seq % 60:02d}.000000+00:00"),
    }
    event.update(changes)
    return event


LINK_CASES = [
    ("plain", "0" * 64, _event(1)),
    ("chained after another link", "a" * 64, _event(2, phase="AGENT", eventType="AGENT_MODEL_STEP")),
    ("empty summary and details", "0" * 64, _event(1, summary="", details={})),
    ("None vs empty string in details", "0" * 64, _event(1, details={"a": None, "b": "", "c": [None, ""]})),
    (
        "unicode: CJK, emoji, combining, RTL",
        "0" * 64,
        _event(1, summary="复制延迟 🚨 é ש", details={"问题": "主从延迟", "emoji": "👩‍💻", "k": "a\u0301"}),
    ),
    ("escapes: quote, backslash, newline, control", "0" * 64, _event(1, summary='a"b\\c\nd\te\u0001')),
    ("lone surrogate kept as UTF-8 bytes", "0" * 64, _event(1, summary="x\ud800y")),
    (
        "large and negative integers, floats, booleans",
        "0" * 64,
        _event(3, details={"big": 2**64 + 1, "neg": -(10**30), "f": 0.1, "e": 1e300, "t": True, "z": 0}),
    ),
    (
        "nested objects: keys sorted at every depth, lists keep order",
        "0" * 64,
        _event(1, details={"z": {"b": 1, "a": {"y": 2, "x": 1}}, "a": [3, 1, 2], "B": 0, "é": 1, "Z": 0}),
    ),
    ("str subclass values hash as plain text", "0" * 64, _event(1, summary={"$strsub": "subclassed"})),
    (
        "a time in another zone is converted to UTC",
        "0" * 64,
        _event(1, createdAt=_dt("2026-03-01T21:00:00.5+09:00")),
    ),
    (
        "a time without microseconds gets six digits",
        "0" * 64,
        _event(1, createdAt=_dt("2026-03-01T12:00:00+00:00")),
    ),
    ("a large sequence number", "0" * 64, _event(2**40)),
]


def link_vectors() -> list[dict]:
    from audit.payloads import canonical_json
    from audit.verify import hash_chain
    from tests.audit.vectors.reference import typed

    out = []
    for name, prev, event in LINK_CASES:
        e = typed(event)
        payload = hash_chain.event_payload(
            run_id=e["runId"],
            session_id=e["sessionId"],
            sequence_no=e["sequenceNo"],
            phase=e["phase"],
            event_type=e["eventType"],
            status=e["status"],
            summary=e["summary"],
            details=e["details"],
            created_at=e["createdAt"],
        )
        text = canonical_json(payload)
        out.append(
            {
                "name": name,
                "prevHash": prev,
                "event": event,
                "payloadJson": text,
                "hash": hash_chain.chain_hash(prev, payload),
            }
        )
    return out


# --------------------------------------------------------------------------------------------------
# Chains and the verdicts of the chain check
# --------------------------------------------------------------------------------------------------
def _chain(n: int) -> list[dict]:
    from tests.audit.vectors.reference import link_hash, typed

    events, prev = [], GENESIS
    for seq in range(1, n + 1):
        event = _event(seq)
        event["prevHash"] = prev
        event["hash"] = prev = link_hash(prev, typed(event))
        events.append(event)
    return events


def chain_cases() -> list[tuple[str, list[dict]]]:
    full = _chain(9)
    tampered = copy.deepcopy(full[:3])
    tampered[1]["summary"] = "changed"
    relinked = copy.deepcopy(full[:3])
    relinked[2]["prevHash"] = "f" * 64
    spelled = copy.deepcopy(full[:2])
    spelled[0]["detailsText"] = '{"n": 1}'  # another spelling of the same details: the decoded check
    stored = copy.deepcopy(full[:2])
    stored[0]["detailsText"] = '{"n":1}'  # the canonical text as stored
    wrong_text = copy.deepcopy(full[:2])
    wrong_text[0]["detailsText"] = '{"n":2}'  # the text is not what was hashed, the decoded details are
    both_wrong = copy.deepcopy(spelled)
    both_wrong[0]["summary"] = "changed"  # neither the stored text nor the decoded details match
    return [
        ("empty", []),
        ("one event", full[:1]),
        ("intact", full[:5]),
        ("first event missing", full[1:3]),
        ("first two events missing", full[2:4]),
        ("one event missing", [full[0], *full[2:4]]),
        ("a range missing", [full[0], *full[4:6]]),
        ("two gaps", [full[0], full[2], full[5], full[6]]),
        ("repeated", [*full[:3], full[2]]),
        ("out of order", [full[0], full[2], full[1]]),
        ("content changed", tampered),
        ("prev hash changed", relinked),
        ("details stored in another spelling", spelled),
        ("details stored as hashed", stored),
        ("details text differs from the details", wrong_text),
        ("details in another spelling, summary changed", both_wrong),
        ("the last two missing, the rest intact", full[:7]),
    ]


def chain_vectors() -> list[dict]:
    from audit.verify import hash_chain
    from tests.audit.vectors.reference import typed

    out = []
    for name, events in chain_cases():
        links = [_Link(typed(e)) for e in events]
        verdict = hash_chain.verify_chain(links)
        out.append(
            {
                "name": name,
                "events": events,
                "verdict": {
                    "events": verdict.events,
                    "valid": verdict.valid,
                    "missingSequences": verdict.missing_sequences,
                    "problems": verdict.problems,
                },
            }
        )
    return out


class _Link:
    """A stored chain link from a vector's event (the attributes of `audit.verify.hash_chain.ChainLink`)."""

    def __init__(self, e: dict[str, Any]) -> None:
        self.run_id, self.session_id, self.sequence_no = e["runId"], e["sessionId"], e["sequenceNo"]
        self.phase, self.event_type, self.status = e["phase"], e["eventType"], e["status"]
        self.summary, self.details, self.created_at = e["summary"], e["details"], e["createdAt"]
        self.prev_hash, self.hash = e["prevHash"], e["hash"]
        if "detailsText" in e:
            self.details_text = e["detailsText"]


# --------------------------------------------------------------------------------------------------
# Row digests
# --------------------------------------------------------------------------------------------------
def _step(**changes: Any) -> dict[str, Any]:
    row = {
        "run_id": RUN,
        "session_id": SESSION,
        "step_index": 1,
        "agent_name": "diagnosis_agent",
        "model": "agent-m",
        "model_input": [{"role": "user", "chars": 27}],
        "model_output": {"finish": "tool_calls", "toolCalls": 2},
        "tool_call_ids": ["call_0", "call_1"],
        "has_tool_call": True,
        "finish_reason": "tool_calls",
        "attempts": [{"attempt": 1, "ok": True}],
        "started_at": _dt(T0),
        "finished_at": _dt("2026-03-01T12:00:00.900001+00:00"),
        "duration_ms": 900,
        "usage_available": True,
        "prompt_tokens": 800,
        "completion_tokens": 60,
        "reasoning_tokens": 40,
        "cached_tokens": None,
        "total_tokens": 860,
        "reasoning_available": True,
        "reasoning_bytes": 61,
        "assistant_bytes": 0,
        "content_source": "reasoning_content",
        "created_at": _dt(T0),
    }
    row.update(changes)
    return row


def _tool(**changes: Any) -> dict[str, Any]:
    row = {
        "run_id": RUN,
        "session_id": SESSION,
        "step_id": None,
        "step_index": 1,
        "tool_call_id": "call_0",
        "provider_tool_call_id": "",
        "tool_name": "lookup_knowledge",
        "status": "RUNNING",
        "input_params": {"query": "replication lag"},
        "output_preview": "",
        "output_length": None,
        "output_sha256": "",
        "is_truncated": False,
        "retrieval_layer": "",
        "l0_match_count": None,
        "l1_match_count": None,
        "retrieval_details": {},
        "started_at": _dt(T0),
        "finished_at": None,
        "duration_ms": None,
        "error_code": "",
        "error_message": "",
        "created_at": _dt(T0),
        "updated_at": _dt(T0),
        "agent_name": "diagnosis_agent",
    }
    row.update(changes)
    return row


def _reasoning(**changes: Any) -> dict[str, Any]:
    row = {
        "session_id": SESSION,
        "run_id": RUN,
        "step_index": -1,
        "agent_name": "router",
        "reasoning_available": True,
        "reasoning_content": {"$cipher": "fernet:k1:gAAAAABnotarealtoken=="},
        "assistant_text": None,
        "content_source": None,
        "content_bytes": 61,
        "created_at": _dt(T0),
        "purged_at": None,
    }
    row.update(changes)
    return row


def _run(**changes: Any) -> dict[str, Any]:
    row = {
        "status": "SUCCESS",
        "release_decision": "PUBLISHED",
        "error_code": "",
        "content": "Replication lags because of a long transaction [kb:mysql-replication-lag#1].",
        "tokens_router": 140,
        "tokens_agent": 3310,
        "tokens_guard": 625,
        "tokens_total": 4075,
        "tokens_reasoning": 70,
        "tokens_cached_input": 128,
        "model_calls": 4,
        "usage_unavailable_calls": 0,
        "tokens_reconciled": True,
        "expected_events": 19,
        "expected_steps": 2,
        "expected_tools": 2,
        "release_mode": "verified",
        "draft_chars": None,
        "last_token_at": _dt("2026-03-01T12:00:03.250000+00:00"),
        "release_latency_ms": 12,
        "self_evaluation": None,
        "intent": "DIAGNOSIS",
        "error_message": "",
        "provider": "demo",
        "finished_at": _dt("2026-03-01T12:00:03.300000+00:00"),
    }
    row.update(changes)
    return row


ROW_CASES = [
    ("step", False, "a step as written", _step()),
    ("step", True, "the same step as stored", _step()),
    ("step", False, "written tuples become lists, nested keys sorted", _step(
        model_input={"$tuple": [{"z": 1, "a": {"d": 4, "c": 3}}]}, tool_call_ids={"$tuple": []})),
    ("step", False, "an int column given as text, a bool column given as int", _step(
        duration_ms="900", has_tool_call=1, usage_available=0, prompt_tokens=True)),
    ("step", False, "naive and non-UTC times", _step(
        started_at={"$naive": "2026-03-01T12:00:00"}, finished_at=_dt("2026-03-01T13:00:00.1+01:00"))),
    ("step", False, "a JSON column as the recorder's raw text", _step(
        model_output={"$raw": '{"b": 1, "a": [1, 2]}'})),
    ("step", False, "str subclass values and unicode", _step(
        agent_name={"$strsub": "diagnosis_agent"}, model="模型-🚀", finish_reason={"$strsub": ""})),
    ("step", False, "None and empty values", _step(
        model_input=[], model_output={}, attempts=None, finished_at=None, duration_ms=None, prompt_tokens=0,
        content_source="")),
    ("step", False, "large integers", _step(prompt_tokens=2**62, total_tokens=-(2**31), duration_ms=10**12)),
    ("tool", False, "a tool row of before per-agent steps (form tool)", _tool()),
    ("tool/2", False, "a RUNNING tool row", _tool()),
    ("tool/2", True, "a terminal tool row as stored", _tool(
        status="SUCCEEDED", output_preview="{\"items\": [\"x\"]}", output_length=1024,
        output_sha256="ab" * 32, is_truncated=True, retrieval_layer="L0+L1", l0_match_count=1,
        l1_match_count=3, retrieval_details={"l0": ["t"], "l1": {"k": None}},
        finished_at=_dt("2026-03-01T12:00:01.000000+00:00"), duration_ms=1000, step_id=2**40,
        updated_at=_dt("2026-03-01T12:00:01.000000+00:00"))),
    ("tool/2", False, "a failed tool call with unicode error text", _tool(
        status="FAILED", error_code="TimeoutError", error_message="超时 ⏱ after 30 s", input_params={})),
    ("reasoning", False, "reasoning as stored ciphertext", _reasoning()),
    ("reasoning", True, "reasoning read back as stored text", _reasoning(
        reasoning_content="fernet:k1:gAAAAABnotarealtoken==", assistant_text="fernet:k2:gAAAAABother==")),
    ("reasoning", True, "purged reasoning", _reasoning(
        reasoning_content=None, assistant_text=None, purged_at=_dt("2026-09-01T00:00:00.000000+00:00"))),
    ("reasoning", False, "a str subclass in an encrypted column", _reasoning(
        reasoning_content={"$strsub": "fernet:k1:gAAAAABnotarealtoken=="})),
    ("run", False, "run (form 1)", _run()),
    ("run", False, "run (form 1), empty content", _run(content="")),
    ("run", False, "run (form 1), NULL content: the digest of empty content", _run(content=None)),
    ("run/2", False, "run/2", _run()),
    ("run/3", False, "run/3 with an AI Ops self-evaluation", _run(
        self_evaluation={"score": 0.8, "reasons": ["复现 ✔", None], "a": {"z": 1, "b": 2}})),
    ("run/4", False, "run/4", _run()),
    ("run/4", True, "run/4 as stored", _run()),
    ("run/4", False, "run/4 failed, unicode content, no release", _run(
        status="FAILED", release_decision=None, error_code="PROVIDER_ERROR", content="部分答案 🙂",
        intent=None, error_message="upstream 503", tokens_reasoning=None, tokens_cached_input=None,
        tokens_reconciled=False, last_token_at=None, release_latency_ms=None, finished_at=None)),
    ("run-start", False, "the run as created", {
        "run_id": RUN, "session_id": SESSION, "query": "为什么主从复制延迟？ 🐢",
        "agent_flow": "diagnosis_agent", "created_at": _dt(T0)}),
    ("run-start", False, "the run as created, empty query, str subclasses", {
        "run_id": {"$strsub": RUN}, "session_id": SESSION, "query": "", "agent_flow": {"$strsub": "ai_ops"},
        "created_at": {"$naive": "2026-03-01T12:00:00.000001"}}),
    ("session", False, "a session", {"session_id": SESSION, "owner_id": 7, "created_at": _dt(T0)}),
    ("session", False, "a session with a large owner id given as text", {
        "session_id": SESSION, "owner_id": "9223372036854775807", "created_at": _dt(T0)}),
    ("review", False, "a review", {
        "review_id": "rev_1", "run_id": RUN, "session_id": SESSION, "verdict": "needs_follow_up",
        "note": "Prüfen: 重新检查", "reviewer_username": "auditor", "sequence_no": 20,
        "created_at": _dt(T0)}),
    ("reasoning-read", False, "a read of reasoning", {
        "username": "auditor", "session_id": SESSION, "run_id": RUN, "records_returned": 3,
        "channel": "admin", "client_address": "2001:db8::1", "user_agent": "", "accessed_at": _dt(T0)}),
    ("reasoning-read", True, "a read with no address", {
        "username": "auditor", "session_id": SESSION, "run_id": RUN, "records_returned": 0, "channel": "api",
        "client_address": None, "user_agent": "curl/8", "accessed_at": _dt(T0)}),
]  # fmt: skip


def _forms() -> dict[str, Any]:
    from django.db import models

    from audit.verify import row_digests
    from reasoning.fields import EncryptedTextField

    def kind(f):
        if isinstance(f, models.ForeignKey):
            return kind(f.target_field)
        if isinstance(f, EncryptedTextField):
            return "encrypted"
        if isinstance(f, models.JSONField):
            return "json"
        if isinstance(f, models.DateTimeField):
            return "datetime"
        if isinstance(f, models.BooleanField):
            return "bool"
        if isinstance(f, models.IntegerField | models.BigIntegerField):
            return "int"
        return "text"

    forms = [*row_digests._RUN_FORMS.values(), *row_digests._TOOL_FORMS.values()]
    forms += [
        row_digests.STEP,
        row_digests.REASONING,
        row_digests.RUN_START,
        row_digests.SESSION,
        row_digests.REVIEW,
    ]
    forms.append(row_digests.READ)
    return {f.name: [[c, kind(f.fields[c])] for c in f.columns] for f in forms}


def _forms_by_name() -> dict[str, Any]:
    from audit.verify import row_digests

    forms = {**row_digests._RUN_FORMS, **row_digests._TOOL_FORMS}
    for f in (
        row_digests.STEP,
        row_digests.REASONING,
        row_digests.RUN_START,
        row_digests.SESSION,
        row_digests.REVIEW,
    ):
        forms[f.name] = f
    forms[row_digests.READ.name] = row_digests.READ
    return forms


def row_vectors(forms: dict[str, Any]) -> list[dict]:
    from audit.payloads import canonical_json
    from audit.write.table import RawJSON
    from reasoning.fields import Ciphertext
    from tests.audit.vectors.reference import typed

    by_name = _forms_by_name()
    out = []
    for form_name, stored, name, values in ROW_CASES:
        row = {c: values[c] for c, _ in forms[form_name]}
        form = by_name[form_name]
        py = typed(row, cipher=Ciphertext, raw=RawJSON)
        document = form.document(py, stored=stored)
        out.append(
            {
                "name": name,
                "form": form_name,
                "stored": stored,
                "values": row,
                "document": canonical_json(document),
                "digest": form.digest(py, stored=stored),
            }
        )
    return out


# --------------------------------------------------------------------------------------------------
# Write tags
# --------------------------------------------------------------------------------------------------
def tag_vectors() -> dict[str, Any]:
    from core import writeauth

    verifier = writeauth.Verifier(WRITE_KEYS)
    links = ["0" * 64, "3f" * 32, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"]
    tags = []
    for domain in sorted(writeauth.DOMAINS):
        for link in links:
            for key in WRITE_KEYS:
                key_id = writeauth.key_id_of(key)
                tags.append(
                    {
                        "key": WRITE_KEYS.index(key),
                        "domain": domain,
                        "linkHash": link,
                        "tag": f"{key_id}:{writeauth.mac(key, key_id, domain, link)}",
                    }
                )
    return {
        # Hex, not the base64 text AUDIT_WRITE_KEYS takes: a committed base64 key of 32 bytes is what the
        # secret scan (tests/core/test_settings.py) refuses; the tests encode these synthetic keys.
        "keysHex": [k.hex() for k in WRITE_KEYS],
        "keyIds": [writeauth.key_id_of(k) for k in WRITE_KEYS],
        "currentTag": verifier.tag(writeauth.RUN, links[1]),
        "tags": tags,
    }


# --------------------------------------------------------------------------------------------------
# Merkle tree, leaves, checkpoints
# --------------------------------------------------------------------------------------------------
# The leaves of the Certificate Transparency / Trillian log verifier tests (RFC 6962 implementations).
MERKLE_LEAVES = [
    "",
    "00",
    "10",
    "2021",
    "3031",
    "40414243",
    "5051525354555657",
    "606162636465666768696a6b6c6d6e6f",
]


def merkle_vectors() -> dict[str, Any]:
    from audit.transparency import merkle

    hashes = [merkle.leaf_hash(bytes.fromhex(d)) for d in MERKLE_LEAVES]
    return {
        "source": "Certificate Transparency / Trillian log verifier test data (RFC 6962 implementations)",
        "emptyRoot": merkle.EMPTY_ROOT.hex(),
        "leaves": MERKLE_LEAVES,
        "leafHashes": [h.hex() for h in hashes],
        "roots": [merkle.mth(hashes[:n]).hex() for n in range(1, 9)],
        "inclusion": [
            {"index": m, "size": n, "proof": [h.hex() for h in merkle.path(m, hashes[:n])]}
            for n in range(1, 9)
            for m in range(n)
        ],
        "consistency": [
            {"old": m, "new": n, "proof": [h.hex() for h in merkle.subproof(m, hashes[:n])]}
            for n in range(1, 9)
            for m in range(1, n + 1)
        ],
    }


LEAF_CASES = [
    ("run", "a finished run", {"run_id": RUN, "session_id": SESSION, "head_hash": "ab" * 32,
     "head_sequence_no": 19, "finished_details": {"runDigest": "cd" * 32, "runForm": "run/4"},
     "finished_at": _dt(T0)}),
    ("run", "an authenticated run leaf", {"run_id": RUN, "session_id": SESSION, "head_hash": "ab" * 32,
     "head_sequence_no": 19, "finished_details": {"runDigest": "cd" * 32}, "finished_at": T0,
     "write_key_id": "1a2b3c4d"}),
    ("run", "a run with no events", {"run_id": "运行-1", "session_id": SESSION, "head_hash": None,
     "head_sequence_no": None, "finished_details": None, "finished_at": None}),
    ("run", "a run not finished", {"run_id": RUN, "session_id": SESSION, "head_hash": "ab" * 32,
     "head_sequence_no": 3, "finished_details": "not a dict", "finished_at": None}),
    ("tail", "a run tail", {"run_id": RUN, "session_id": SESSION, "head_hash": "ef" * 32,
     "head_sequence_no": 21}),
    ("tail", "an authenticated run tail", {"run_id": RUN, "session_id": SESSION, "head_hash": "ef" * 32,
     "head_sequence_no": 21, "write_key_id": "1a2b3c4d"}),
    ("governance", "a governance head", {"head_hash": "12" * 32, "head_sequence_no": 2**33,
     "created_at": _dt("2026-03-01T21:00:00+09:00")}),
    ("governance", "an authenticated governance head", {"head_hash": "12" * 32, "head_sequence_no": 5,
     "created_at": T0, "write_key_id": "1a2b3c4d"}),
]  # fmt: skip


def leaf_vectors() -> list[dict]:
    from audit.transparency import leafdata, merkle
    from tests.audit.vectors.reference import typed

    build = {
        "run": leafdata.leaf_fields,
        "tail": leafdata.tail_fields,
        "governance": leafdata.governance_fields,
    }
    out = []
    for kind, name, args in LEAF_CASES:
        data = leafdata.encode(build[kind](**typed(args)))
        out.append(
            {
                "name": name,
                "kind": kind,
                "args": args,
                "data": data.decode(),
                "leafHash": merkle.leaf_hash(data).hex(),
            }
        )
    return out


def note_vectors() -> dict[str, Any]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from audit.transparency import note, signednote

    private = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(ED25519_SEED))
    public = private.public_key()
    witness = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(WITNESS_SEED))
    origin = "diagnosis.example/audit-log"
    checkpoints = []
    for size, root, signed_at, previous in (
        (1, "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125", T0, ""),
        (8, "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328", T0, "9f" * 32),
    ):
        body = note.NoteBody(origin, size, root, signed_at, previous)
        text = body.text()
        signature = note.sign_note(body, private)
        line = signednote.Signature(origin, *_split(signature))
        cosig = signednote.cosign(text, "witness.example/w1", witness, 1772366400)
        checkpoints.append(
            {
                "treeSize": size,
                "rootHash": root,
                "signedAt": signed_at,
                "previous": previous,
                "body": text,
                "bodyHash": note.body_hash(text),
                "signature": signature,
                "note": signednote.join_note(text, [line]),
                "cosignature": {"timestamp": 1772366400, "line": cosig.line},
            }
        )
    legacy = note.Body(origin, 8, checkpoints[1]["rootHash"], T0, "", note.key_id(public))
    legacy_text = legacy.text()
    return {
        "rfc8032Seed": ED25519_SEED,
        "rfc8032Public": ED25519_PUBLIC,
        "witnessSeed": WITNESS_SEED,
        "origin": origin,
        "publicText": note.public_text(public),
        "noteKeyId": note.note_key_id(origin, public),
        "vkey": note.log_vkey(origin, public),
        "witnessVkey": signednote.Verifier(
            "witness.example/w1", signednote.COSIGNATURE_V1, witness.public_key()
        ).vkey,
        "checkpoints": checkpoints,
        "legacy": {
            "keyId": note.key_id(public),
            "body": legacy_text,
            "bodyHash": note.body_hash(legacy_text),
            "signature": note.sign(legacy_text, private),
        },
    }


def _split(signature: str) -> tuple[bytes, bytes]:
    raw = base64.b64decode(signature)
    return raw[:4], raw[4:]


def main() -> None:
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    forms = _forms()
    vectors = {
        "formatVersion": FORMAT_VERSION,
        "about": "Golden vectors of the audit record's wire format; see docs/audit-hash_chain.md, "
        "'The pinned format'. Typed inputs: tests/audit/vectors/reference.py.",
        "genesisHash": GENESIS,
        "linkHashes": link_vectors(),
        "chains": chain_vectors(),
        "forms": forms,
        "rowDigests": row_vectors(forms),
        "writeTags": tag_vectors(),
        "merkle": merkle_vectors(),
        "leaves": leaf_vectors(),
        "signedNotes": note_vectors(),
    }
    text = json.dumps(vectors, indent=1, ensure_ascii=False)
    # UTF-8 kept for reading, but a lone surrogate (a vector of its own) cannot be UTF-8: escape it.
    text = re.sub("[\ud800-\udfff]", lambda m: f"\\u{ord(m.group()):04x}", text)
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
