"""The recorder's faster paths give what the paths they replace gave: the identity RUN_STARTED binds is read
by a query compiled once with the ORM's row (values and types), and the rows, events, digests and tags a
run writes are the ones the plain construction writes."""

from __future__ import annotations

import pytest
from django.db.models import F

from audit.verify import row_digests
from audit.write import RunRecorder
from audit.write.run import _IDENTITY
from diagnosis.models import DiagnosisRun


def _orm_identity(run_id: str):
    """The read as the recorder made it before it was compiled (`.values(…).first()`)."""
    return (
        DiagnosisRun.objects.filter(run_id=run_id)
        .values(
            *row_digests.RUN_START.columns,
            owner_id=F("session__owner_id"),
            session_created_at=F("session__created_at"),
            owner=F("session__owner__username"),
        )
        .first()
    )


@pytest.mark.django_db
def test_the_compiled_identity_read_is_the_orms_row(run):
    expected = _orm_identity(run.run_id)
    (found,) = _IDENTITY.rows(run_id=run.run_id)
    row = dict(zip(_IDENTITY.names(), found, strict=True))
    assert row == expected
    assert {k: type(v) for k, v in row.items()} == {k: type(v) for k, v in expected.items()}
    assert row["created_at"].tzinfo is not None and row["session_created_at"].tzinfo is not None
    assert _IDENTITY.rows(run_id="no-such-run") == []


@pytest.mark.django_db
def test_run_started_binds_the_identity_the_orm_row_gives(run):
    expected = _orm_identity(run.run_id)
    session = {
        "session_id": expected["session_id"],
        "owner_id": expected["owner_id"],
        "created_at": expected["session_created_at"],
    }
    identity = RunRecorder.for_run(run)._identity()
    assert identity == {
        "startForm": "run-start",
        "startDigest": row_digests.RUN_START.digest(expected, stored=True),
        "sessionForm": "session",
        "sessionDigest": row_digests.SESSION.digest(session, stored=True),
        "owner": expected["owner"],
    }
    assert identity["startDigest"] == row_digests.RUN_START.digest_of(run)
    assert RunRecorder(run_id="no-such-run", session_id=run.session_id)._identity() == {}
