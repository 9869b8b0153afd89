"""Upgrading a store recorded before write authentication (issue 43 item 10): it keeps verifying without
rewriting history. Untagged links are accepted only where a leaf of before write authentication anchors
them (or, for a run still open at the upgrade and the legacy governance chain, where the upgrade's
tagged WRITE_AUTH_STARTED adopted them), labelled as such; anything untagged and not so vouched for is a
problem, and is never anchored."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import GovernanceEvent, GovernanceEventType, LogLeaf, TraceEvent
from audit.transparency import leafdata
from audit.transparency.log import checkpoint
from audit.verify.authenticity import adoption as adopted
from audit.write import RunRecorder
from audit.write.reviews import record_review
from diagnosis import services
from diagnosis.models import RunStatus
from tests.audit.legacy import previous_version_wrote, recorded_before_write_authentication
from tests.audit.transparency.support import rehash_chain
from tests.factories import executing, make_recorded_run

pytestmark = pytest.mark.django_db


def _verify(*args):
    out = io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=out)
    except CommandError:
        return False, out.getvalue()
    return True, out.getvalue()


@pytest.fixture
def upgraded(user, superuser, settings):
    """A store the previous version wrote: two runs its checkpointer anchored, one finished after its
    last checkpoint, one still open; then `migrate` upgraded it."""
    settings.AUDIT_WITNESS_PATH = ""
    anchored = [make_recorded_run(user), make_recorded_run(user)]
    previous_version_wrote(checkpoint=True)
    late = make_recorded_run(user)
    open_run = services.create_run(session=services.create_session(owner=user), query="still running")
    rec = executing(open_run)
    rec.run_started(release_mode="verified")
    report = recorded_before_write_authentication()
    return {"anchored": anchored, "late": late, "open": open_run, "report": report}


def test_the_upgrade_anchors_what_was_left_adopts_open_runs_and_records_that_it_did(upgraded):
    report, late, open_run = upgraded["report"], upgraded["late"], upgraded["open"]
    assert report.anchored_runs == 1 and list(report.open_runs) == [open_run.run_id]
    leaf = leafdata.decode(LogLeaf.objects.get(run_id=late.run_id).data)
    assert leafdata.write_key_id(leaf) is None  # a leaf of before write authentication
    started = GovernanceEvent.objects.get(event_type=GovernanceEventType.WRITE_AUTH_STARTED)
    assert started.tag and started.details["openRuns"] == {open_run.run_id: 1}
    assert GovernanceEvent.objects.filter(event_type=GovernanceEventType.RIGHTS_BASELINE).exists()
    assert adopted().runs == {open_run.run_id: 1}
    # The open run's head is tagged by the upgrade: its recorder can continue it.
    head = TraceEvent.objects.get(run_id=open_run.run_id, sequence_no=1)
    assert head.tag

    ok, out = _verify()
    assert ok, out
    assert "event(s) recorded before write authentication: the signed log vouches for them" in out


def test_after_the_upgrade_legacy_runs_grow_open_runs_finish_and_new_runs_are_authenticated(
    upgraded, superuser, user
):
    first = upgraded["anchored"][0]
    record_review(run=first, user=superuser, verdict="correct")  # onto an untagged head the log vouches for
    rec = RunRecorder.resume(upgraded["open"].run_id)
    rec.finish(status=RunStatus.FAILED, error_code="X")
    new = make_recorded_run(user)
    result = checkpoint()
    assert result.refused == []
    assert result.appended == 2 and result.tails == 1
    for run_id in (new.run_id, upgraded["open"].run_id):
        fields = leafdata.decode(LogLeaf.objects.get(run_id=run_id).data)
        assert leafdata.write_key_id(fields)  # authenticated leaves from now on
    ok, out = _verify()
    assert ok, out


def test_an_untagged_run_forged_after_the_upgrade_is_named_and_never_anchored(upgraded, user):
    forged = make_recorded_run(user, query="rm -rf /var/log/* fixes it")
    TraceEvent.objects.filter(run_id=forged.run_id).update(tag="")  # what a writer without the key stores
    result = checkpoint()
    assert result.refused == [forged.run_id]
    assert not LogLeaf.objects.filter(run_id=forged.run_id).exists()
    ok, out = _verify()
    assert not ok
    assert (
        f"run={forged.run_id} INVALID sequences 1–" in out
        and "no write tag, and nothing in the signed log vouches for them" in out
    )


def test_a_legacy_run_rewritten_after_the_upgrade_is_refused_as_a_base_for_new_links(upgraded, superuser):
    from audit.verify.authenticity import ChainNotAuthentic

    first = upgraded["anchored"][1]
    last = TraceEvent.objects.filter(run_id=first.run_id).order_by("-sequence_no").first()
    TraceEvent.objects.filter(pk=last.pk).update(summary="rewritten")
    rehash_chain(first.run_id, start=last.sequence_no)  # the head no longer matches its v1 leaf
    with pytest.raises(ChainNotAuthentic):
        record_review(run=first, user=superuser, verdict="unsafe")
    assert not ok_after(first.run_id)


def ok_after(run_id: str) -> bool:
    return _verify("--run", run_id)[0]


def test_a_store_written_with_write_authentication_adopts_nothing(user):
    from audit.transparency import adoption

    make_recorded_run(user)
    assert not adoption.needed() and adoption.adopt() is None
