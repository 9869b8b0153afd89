"""Creating a run (`diagnosis.services.create_run`, issue 49 item 5): the row is tagged before its one
INSERT, and is what the former INSERT, read-back of `created_at` and tag UPDATE stored — every column as
read back, the tag the HMAC over the identity as stored, the creation verified by `verify_run`."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.verify.runs import verify_run
from core import writeauth
from diagnosis import services
from diagnosis.models import DiagnosisRun, RunPurpose

REDACTION = {"replaced": [{"kind": "email", "count": 1, "placeholder": "[EMAIL_1]"}]}
# Set by the database's clock at the insert, not by the service (the rest is compared exactly).
PER_ROW = {"id", "run_id", "created_at", "updated_at", "created_tag"}


def _columns(run: DiagnosisRun) -> dict:
    return {f.attname: getattr(run, f.attname) for f in DiagnosisRun._meta.concrete_fields}


def _created_as_before(*, session, query: str, redaction) -> DiagnosisRun:
    """The former `create_run` body: INSERT, read `created_at` back, tag it, UPDATE the tag."""
    run = DiagnosisRun.objects.create(
        run_id=services.new_id("run"),
        session=session,
        query=query,
        agent_flow="DIAGNOSIS_AGENT",
        redaction=redaction,
        purpose=session.purpose,
    )
    run.refresh_from_db(fields=["created_at"])
    run.created_tag = writeauth.tag(writeauth.RUN_CREATED, services.identity_digest(run))
    DiagnosisRun.objects.filter(pk=run.pk).update(created_tag=run.created_tag)
    return DiagnosisRun.objects.get(pk=run.pk)


@pytest.mark.django_db
@pytest.mark.parametrize("purpose", [RunPurpose.PRODUCTION, RunPurpose.EXPERIMENT])
def test_a_run_is_created_in_one_insert_and_stored_as_before(user, purpose):
    session = services.create_session(owner=user, purpose=purpose)
    query = "Why is replication lagging? 诊断🚀 [EMAIL_1]"
    with CaptureQueriesContext(connection) as captured:
        run = services.create_run(session=session, query=query, redaction=REDACTION)
    writes = [q["sql"].split()[0].upper() for q in captured]
    # Before: INSERT, SELECT created_at, UPDATE created_tag, UPDATE the session.
    assert writes == ["INSERT", "UPDATE"], writes
    assert "created_tag" in captured[0]["sql"] and "chat_session" in captured[1]["sql"]

    stored = DiagnosisRun.objects.get(pk=run.pk)
    assert _columns(stored) == _columns(run)  # every column, created_at as stored and read back
    assert stored.created_at.microsecond == run.created_at.microsecond  # microseconds kept, not rounded
    assert stored.created_tag == writeauth.tag(writeauth.RUN_CREATED, services.identity_digest(stored))
    assert services.created_by_the_service(stored)

    before = _created_as_before(session=session, query=query, redaction=REDACTION)
    shared = {k: v for k, v in _columns(before).items() if k not in PER_ROW}
    assert shared == {k: v for k, v in _columns(stored).items() if k not in PER_ROW}
    assert services.created_by_the_service(before)


@pytest.mark.django_db
def test_the_created_run_verifies_and_a_changed_creation_time_does_not(user):
    run = services.create_run(session=services.create_session(owner=user), query="Nginx answers 502")
    assert verify_run(run.run_id).invalid == []
    moved = run.created_at + dt.timedelta(microseconds=1)
    DiagnosisRun.objects.filter(pk=run.pk).update(created_at=moved)
    assert not services.created_by_the_service(DiagnosisRun.objects.get(pk=run.pk))
    assert any("not created by the service" in p for p in verify_run(run.run_id).invalid)


def test_created_at_defaults_to_the_time_the_row_is_built():
    field = DiagnosisRun._meta.get_field("created_at")
    assert field.default is timezone.now and not field.auto_now_add and not field.editable
