"""The event-type registry (`audit.events`) is the one declaration every enumeration derives from, and
its first new entry, `FEEDBACK_RECORDED`, works as the recipe in docs/contributing.md promises: written
through `append_to_finished_run` on runs the real runtime executed, anchored by the next checkpoint,
verified, and a changed vote detected."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from audit import events
from audit.models import EventType, TailPending, TraceEvent
from audit.transparency import keys
from audit.verify import chain_digests
from audit.write.feedback import RunNotFinished, record_feedback
from diagnosis.models import RunFeedback, RunStatus
from surfaces.admin.audit_records import EventTypeFilter
from tests.agent.runtime.support import ask, script_reasoned_diagnosis

DOCS = Path(settings.BASE_DIR) / "docs"


def test_every_enumeration_is_the_registry():
    declared = [spec.type for spec in events.EVENTS]
    assert list(EventType.values) == declared
    assert EventType.REVIEW_RECORDED.label == events.BY_TYPE["REVIEW_RECORDED"].label
    assert {s.type for s in events.EVENTS if s.writer == events.APPENDED} == chain_digests.GOVERNANCE_EVENTS
    assert [value for value, _ in EventTypeFilter.lookups(None, None, None)] == declared


def test_the_openapi_enum_is_the_registry_with_each_types_meaning():
    schema = json.loads((Path(settings.BASE_DIR) / "tests/surfaces/api/data/openapi_schema.json").read_text())
    enum = schema["components"]["schemas"]["EventTypeEnum"]
    assert enum["enum"] == [spec.type for spec in events.EVENTS]
    for spec in events.EVENTS:
        assert f"`{spec.type}` - {spec.doc}" in enum["description"]


def test_the_documented_table_is_the_registry():
    """docs/architecture.md carries `python -m audit.events`' table exactly."""
    assert events.markdown_table() in (DOCS / "architecture.md").read_text()


def test_a_declaration_names_its_binding_whole():
    with pytest.raises(ValueError, match="writer"):
        events.EventSpec("X", "X", "someone", "doc")
    with pytest.raises(ValueError, match="neither"):
        events.EventSpec("X", "X", events.APPENDED, "doc", binds="`xDigest`")


# --------------------------------------------------------------------------------------------------
# FEEDBACK_RECORDED on runs the runtime executed
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def signing_key(settings):
    settings.AUDIT_SIGNING_KEYS = [keys.generate_key_text()]
    settings.AUDIT_VERIFY_KEYS = []


def _verify_audit() -> str:
    out = io.StringIO()
    call_command("verify_audit", stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "corpus", "signing_key")
def test_each_vote_is_chained_anchored_and_a_flipped_one_is_detected(llm, user, django_user_model):
    script_reasoned_diagnosis(llm)
    run, _, _ = ask(user, "Disk full on /var/log")
    assert run.status == RunStatus.SUCCESS and run.lease_epoch >= 1
    call_command("audit_checkpoint", stdout=io.StringIO())

    record_feedback(run=run, user=user, rating="down", comment="missed the rotated logs — 漏了")
    record_feedback(run=run, user=user, rating="up", comment="")
    # The row is the reader's current vote; the chain keeps both.
    assert RunFeedback.objects.get(run_id=run.run_id).rating == "up"
    votes = list(
        TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.FEEDBACK_RECORDED).order_by(
            "sequence_no"
        )
    )
    assert [(e.status, e.details["rating"], e.details["reader"]) for e in votes] == [
        ("DOWN", "down", user.get_username()),
        ("UP", "up", user.get_username()),
    ]
    assert votes[0].details["commentChars"] == len("missed the rotated logs — 漏了")
    assert "漏了" not in json.dumps(votes[0].details, ensure_ascii=False)  # the comment is never chained
    assert TailPending.objects.get(run_id=run.run_id).last_sequence_no == votes[-1].sequence_no

    # Anchored by the next checkpoint, and the whole store verifies.
    call_command("audit_checkpoint", stdout=io.StringIO())
    _verify_audit()

    # A database writer hides the complaint: the down-vote's event becomes an up-vote.
    flipped = {**votes[0].details, "rating": "up"}
    TraceEvent.objects.filter(pk=votes[0].pk).update(status="UP", details=flipped)
    with pytest.raises(CommandError):
        _verify_audit()


@pytest.mark.django_db
def test_feedback_on_an_unfinished_run_is_refused_and_writes_nothing(api_client, user, traced_run):
    from diagnosis.models import DiagnosisRun

    DiagnosisRun.objects.filter(run_id=traced_run.run_id).update(status=RunStatus.RUNNING)
    traced_run.refresh_from_db()
    with pytest.raises(RunNotFinished):
        record_feedback(run=traced_run, user=user, rating="down")
    assert not RunFeedback.objects.filter(run_id=traced_run.run_id).exists()

    api_client.force_authenticate(user)
    url = f"/api/diagnosis/{traced_run.session_id}/runs/{traced_run.run_id}/feedback"
    response = api_client.post(url, {"rating": "down"}, format="json")
    assert response.status_code == 409 and response.json()["error"]["code"] == "conflict"
    assert not RunFeedback.objects.filter(run_id=traced_run.run_id).exists()
