"""What the real recorder stores is the pinned format (issue 43 item 11): a run recorded through the
service (`diagnosis.services.create_run`, the claimed `RunRecorder`) under the vectors' write keys, read
back from the database, has every link hash, write tag and bound row digest equal to the independent
computation of `vectors/reference.py` from the stored values, over the vectors' column lists."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from audit.models import AgentStep, ToolInvocation, TraceEvent
from audit.verify import row_digests
from core import writeauth
from diagnosis.models import ChatSession, DiagnosisRun
from reasoning.fields import Ciphertext
from reasoning.models import AgentReasoningAudit
from tests.audit.vectors import reference as ref
from tests.factories import make_recorded_run

pytestmark = pytest.mark.django_db

VECTORS = json.loads((Path(__file__).parent / "vectors" / "format-v1.json").read_text(encoding="utf-8"))
KEYS = [bytes.fromhex(k) for k in VECTORS["writeTags"]["keysHex"]]


class _NoRaw:
    """Stored values are never the recorder's raw JSON text."""


def _digest(form: str, values: dict, *, stored: bool = True) -> str:
    document = ref.row_document(
        form, VECTORS["forms"][form], values, stored=stored, cipher_type=Ciphertext, raw_type=_NoRaw
    )
    return ref.row_digest(document)


def _columns(instance, form: str) -> dict:
    """A stored row's values by the vectors' column names (a foreign key by its stored id)."""
    return {c: getattr(instance, f"{c}_id" if c in ("owner",) else c) for c, _ in VECTORS["forms"][form]}


def test_a_recorded_run_is_stored_in_the_pinned_format(user, settings):
    # The vectors' keys, newest first, and the test database's own (its migrations' governance events).
    settings.AUDIT_WRITE_KEYS = [
        *(base64.b64encode(k).decode("ascii") for k in KEYS),
        *writeauth.configured_key_texts(),
    ]
    run = make_recorded_run(user, query="为什么主从复制延迟？ 🐢")
    events = list(TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"))
    assert [e.sequence_no for e in events] == list(range(1, len(events) + 1)) and len(events) > 10

    prev = ref.GENESIS
    for e in events:
        fields = {
            "runId": e.run_id,
            "sessionId": e.session_id,
            "sequenceNo": e.sequence_no,
            "phase": e.phase,
            "eventType": e.event_type,
            "status": e.status,
            "summary": e.summary,
            "details": e.details,
            "createdAt": e.created_at,
        }
        assert e.prev_hash == prev
        assert e.hash == ref.link_hash(prev, fields), e.event_type
        assert e.tag == ref.write_tag(KEYS[0], "run", e.hash), e.event_type
        prev = e.hash

    stored = DiagnosisRun.objects.get(pk=run.pk)
    assert stored.created_tag.startswith(VECTORS["writeTags"]["keyIds"][0] + ":")
    by_type: dict[str, list] = {}
    for e in events:
        by_type.setdefault(e.event_type, []).append(e.details)

    (started,) = by_type["RUN_STARTED"]
    assert started["startDigest"] == _digest(started["startForm"], _columns(stored, started["startForm"]))
    session = ChatSession.objects.get(session_id=run.session_id)
    values = {
        "session_id": session.session_id,
        "owner_id": session.owner_id,
        "created_at": session.created_at,
    }
    assert started["sessionDigest"] == _digest(started["sessionForm"], values)

    steps = {(s.agent_name, s.step_index): s for s in AgentStep.objects.filter(run_id=run.run_id)}
    reasoning = {
        (r["agent_name"], r["step_index"]): r for r in row_digests.stored_reasoning_rows(run_id=run.run_id)
    }
    assert any(r["reasoning_content"] for r in reasoning.values())  # ciphertext, as stored
    assert all(
        r["reasoning_content"].startswith("fernet:") for r in reasoning.values() if r["reasoning_content"]
    )
    # The run's compiled query (built at import) gives what the general query gives, built again now.
    fresh = row_digests._ReasoningOfRun()
    rows = [dict(zip(fresh.names(), r, strict=True)) for r in fresh.rows(run_id=run.run_id)]
    assert rows == row_digests.stored_reasoning_rows(run_id=run.run_id, step_index__gte=-(10**6))
    assert rows == row_digests.stored_reasoning_rows(run_id=run.run_id) and len(rows) == len(reasoning)
    assert fresh.rows(run_id="another run") == []
    # Rows of several runs: by run, then step index, then insertion (a guard's negative step last).
    other = make_recorded_run(user)
    AgentReasoningAudit.objects.create(  # inserted last, ordered first: a router's row written late
        session_id=other.session_id, run_id=other.run_id, step_index=-5, agent_name="router",
        reasoning_available=False, content_bytes=0, created_at=other.created_at,
    )  # fmt: skip
    both = row_digests.stored_reasoning_rows(run_id__in=[run.run_id, other.run_id])
    order = [(r["run_id"], r["step_index"], r["id"]) for r in both]
    assert order == sorted(order) and {r["run_id"] for r in both} == {run.run_id, other.run_id}
    assert [r["step_index"] for r in row_digests.stored_reasoning_rows(run_id=other.run_id)] == [-5, 1, 2]
    for details in by_type["AGENT_MODEL_STEP"]:
        key = (details["agentName"], details["stepIndex"])
        assert details["stepDigest"] == _digest("step", _columns(steps[key], "step"))
        assert details["reasoningDigest"] == _digest("reasoning", reasoning[key])
    for details in [*by_type["ROUTING_ATTEMPT"], *by_type["SEMANTIC_GUARD_DECISION"]]:
        if "reasoningDigest" not in details:  # a call without a reasoning row
            continue
        rows = [r for r in reasoning.values() if r["step_index"] == details["reasoningStepIndex"]]
        assert details["reasoningDigest"] in {_digest("reasoning", r) for r in rows}

    tools = {t.tool_call_id: t for t in ToolInvocation.objects.filter(run_id=run.run_id)}
    terminal = {d["toolCallId"]: d for d in by_type["TOOL_INVOCATION"] if d.get("status") != "RUNNING"}
    assert terminal and set(terminal) == set(tools)
    for call_id, details in terminal.items():
        assert details["rowDigest"] == _digest(
            details["rowForm"], _columns(tools[call_id], details["rowForm"])
        )

    (finished,) = by_type["RUN_FINISHED"]
    assert finished["runDigest"] == _digest(finished["runForm"], _columns(stored, finished["runForm"]))
