"""`audit.write.append_to_finished_run`: the one write to a run's chain by others than its recorder.
It writes under the run's current lease epoch (read under the run row's lock), so it lands on runs whose
lease was claimed once or taken over since; it refuses a run not finished (unless told otherwise) and a
call outside a transaction; concurrent appenders to the same run land one after the other."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import transaction
from django.utils import timezone

from agent.runtime.sweeper import sweep_expired_runs
from audit.models import EventType, Phase, TraceEvent
from audit.verify.hash_chain import verify_chain
from audit.verify.runs import verify_run
from audit.write import ChainEvent, RunNotFinished, append_to_finished_run
from audit.write.reasoning_changes import purge_reasoning
from diagnosis.models import DiagnosisRun, RunStatus
from tests.audit.support import in_threads, join_threads
from tests.factories import LEASE_OWNER, executing, make_recorded_run


def _rekey_event(note: str) -> ChainEvent:
    """An event appended to a finished run, binding no row and needing no governance record: a reader's
    vote (a key rotation's would have to name its REASONING_KEYS_ROTATED record, audit.verify.authority)."""
    details = {"reader": "r", "rating": "up", "commentChars": 0, "commentSha256": ""}
    return ChainEvent(Phase.RUN, EventType.FEEDBACK_RECORDED, "UP", note, details)


def _chain(run_id: str) -> list[TraceEvent]:
    return list(TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no"))


@pytest.mark.django_db
def test_factory_runs_look_executed(user):
    """The factories claim through the real claim and finish through the recorder, as the executor."""
    run = make_recorded_run(user)
    assert run.lease_epoch == 1 and run.lease_owner == "" and run.lease_expires_at is None
    started = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_STARTED)
    assert started.details["leaseOwner"] == LEASE_OWNER


@pytest.mark.django_db
def test_an_append_lands_under_the_epoch_of_the_last_claim(run):
    """A run claimed (epoch 1) and taken over by the sweeper (epoch 2) before it finished: the append
    writes under epoch 2, is not fenced, and the run verifies with the event at its head."""
    rec = executing(run)
    rec.run_started(details={"leaseOwner": LEASE_OWNER})
    assert sweep_expired_runs(now=timezone.now() + dt.timedelta(hours=1)) == [run.run_id]
    swept = DiagnosisRun.objects.get(pk=run.pk)
    assert (swept.status, swept.lease_epoch) == (RunStatus.FAILED, 2)
    head = _chain(run.run_id)[-1].sequence_no

    with transaction.atomic():
        seq = append_to_finished_run(run_id=run.run_id, events=[_rekey_event("after the takeover")])

    chain = _chain(run.run_id)
    assert seq == head + 1 == chain[-1].sequence_no and chain[-1].summary == "after the takeover"
    assert verify_chain(chain).valid
    assert DiagnosisRun.objects.get(pk=run.pk).fenced_writes == 0
    result = verify_run(run.run_id)
    assert result.ok, (result.invalid, result.incomplete, result.facts)


@pytest.mark.django_db
def test_a_purge_of_a_run_the_sweeper_took_over(user, run):
    """The old bug: the purge's recorder was built with epoch 0, so it was fenced on every claimed run."""
    rec = executing(run)
    rec.run_started(details={"leaseOwner": LEASE_OWNER})
    sweep_expired_runs(now=timezone.now() + dt.timedelta(hours=1))
    recorded = make_recorded_run(user)
    assert DiagnosisRun.objects.get(pk=run.pk).lease_epoch == 2 and recorded.lease_epoch == 1
    assert purge_reasoning(older_than_days=0) == 2  # the recorded run's two rows; the swept run has none
    purged = _chain(recorded.run_id)[-1]
    assert purged.event_type == EventType.REASONING_PURGED and len(purged.details["rows"]) == 2
    result = verify_run(recorded.run_id)
    assert result.ok, (result.invalid, result.incomplete, result.facts)


@pytest.mark.django_db
def test_refusals_write_nothing(run):
    rec = executing(run)
    rec.run_started()
    before = len(_chain(run.run_id))
    with pytest.raises(RunNotFinished), transaction.atomic():
        append_to_finished_run(run_id=run.run_id, events=[_rekey_event("still running")])
    with pytest.raises(ValueError), transaction.atomic():
        append_to_finished_run(run_id=run.run_id)
    assert len(_chain(run.run_id)) == before
    # A reasoning change may reach a run still executing: its recorder reloads the head it lost.
    with transaction.atomic():
        seq = append_to_finished_run(
            run_id=run.run_id, events=[_rekey_event("while running")], finished_only=False
        )
    assert seq == before + 1
    rec.finish(status=RunStatus.SUCCESS, content="done")
    assert verify_chain(_chain(run.run_id)).valid and _chain(run.run_id)[-1].sequence_no == before + 2


@pytest.mark.django_db(transaction=True)
def test_an_append_outside_a_transaction_is_refused(user):
    """The event must commit with the change it describes: there is no transaction to join here."""
    run = make_recorded_run(user)
    before = len(_chain(run.run_id))
    with pytest.raises(RuntimeError):
        append_to_finished_run(run_id=run.run_id, events=[_rekey_event("no transaction")])
    assert len(_chain(run.run_id)) == before


@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_two_appenders_to_one_finished_run_land_one_after_the_other(user):
    """The first appender holds the run row's lock until it commits; the second waits for it, then
    appends after its event: consecutive sequence numbers, one valid chain."""
    run = make_recorded_run(user)
    head = _chain(run.run_id)[-1].sequence_no
    appended, results, order = threading.Event(), {}, []

    def first():
        with transaction.atomic():
            results["first"] = append_to_finished_run(run_id=run.run_id, events=[_rekey_event("first")])
            appended.set()
            # Hold the lock long enough for the second appender to queue behind it.
            threading.Event().wait(0.5)
            order.append("first committed")

    def second():
        assert appended.wait(20)
        with transaction.atomic():
            results["second"] = append_to_finished_run(run_id=run.run_id, events=[_rekey_event("second")])
            order.append("second appended")

    join_threads(*in_threads([first, second]))
    assert results == {"first": head + 1, "second": head + 2}
    assert order == ["first committed", "second appended"]
    chain = _chain(run.run_id)
    assert [e.summary for e in chain[-2:]] == ["first", "second"] and verify_chain(chain).valid
