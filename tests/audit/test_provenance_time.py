"""Time from the log (issue 43 item 4): an event a leaf anchors was written before the checkpoint that
signed the leaf, a run's times do not go back along its chain, and governance times never go backwards —
each beyond `AUDIT_CLOCK_TOLERANCE_SECONDS`, the skew allowed between the clocks of the processes that
write. A writer whose clock runs ahead, or behind, is named by the link it wrote."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from audit.models import GovernanceEvent, TraceEvent
from audit.transparency.log import checkpoint
from audit.verify.runs import verify_run
from audit.write import record_governance_event
from tests.factories import make_recorded_run

pytestmark = pytest.mark.django_db


def _clock(monkeypatch, module: str, offset: dt.timedelta) -> None:
    real = timezone.now
    monkeypatch.setattr(f"{module}.timezone.now", lambda: real() + offset)


def test_a_link_written_after_the_checkpoint_that_anchored_it_is_named(user, monkeypatch, settings):
    settings.AUDIT_CLOCK_TOLERANCE_SECONDS = 5
    _clock(monkeypatch, "audit.write.chain_writer", dt.timedelta(hours=1))  # the recorder's clock runs ahead
    run = make_recorded_run(user)
    monkeypatch.undo()
    checkpoint()
    result = verify_run(run.run_id)
    last = TraceEvent.objects.filter(run_id=run.run_id).order_by("-sequence_no").first()
    assert any(
        p.startswith(f"sequence {last.sequence_no}: written ")
        and "after the checkpoint that anchored it" in p
        for p in result.invalid
    ), result.invalid


def test_within_the_tolerance_a_skewed_clock_is_no_problem(user, monkeypatch, settings):
    settings.AUDIT_CLOCK_TOLERANCE_SECONDS = 5
    _clock(monkeypatch, "audit.write.chain_writer", dt.timedelta(seconds=2))
    run = make_recorded_run(user)
    monkeypatch.undo()
    checkpoint()
    assert verify_run(run.run_id).ok


def test_a_run_whose_times_go_back_along_its_chain_is_named(user, monkeypatch, settings):
    from audit.write import RunRecorder
    from diagnosis import services
    from tests.factories import executing

    settings.AUDIT_CLOCK_TOLERANCE_SECONDS = 5
    run = services.create_run(session=services.create_session(owner=user), query="q")
    rec = executing(run)
    rec.run_started(release_mode="verified")
    _clock(monkeypatch, "audit.write.chain_writer", dt.timedelta(minutes=-10))  # a takeover on a slow clock
    RunRecorder.resume(run.run_id).finish(status="FAILED", error_code="X")
    monkeypatch.undo()
    result = verify_run(run.run_id)
    assert any("written before the link it follows" in p for p in result.invalid), result.invalid


def test_governance_times_never_go_backwards_whatever_the_writers_clock(monkeypatch):
    first = record_governance_event(event_type="TOKEN_ISSUED", actor="a", subject_user="u")
    _clock(monkeypatch, "audit.write.governance", dt.timedelta(hours=-1))
    second = record_governance_event(event_type="TOKEN_REVOKED", actor="a", subject_user="u")
    assert second.created_at == first.created_at  # the later of the writer's clock and the head's
    stored = list(GovernanceEvent.objects.order_by("sequence_no").values_list("created_at", flat=True))
    assert stored == sorted(stored)
