"""Reasoning purge (by age and by run), key rotation and reviews on runs the real runtime executed: the
executor claimed each run's lease (epoch 1 or more), the fake OpenAI-compatible server returned
reasoning for the router, agent and guard calls, and a checkpoint anchored the finished run. Each
operation appends its event after the run's anchored head under the run's current epoch, and
`verify_audit` over the whole store (runs, transparency log, governance chain) still passes."""

from __future__ import annotations

import io

import pytest
from cryptography.fernet import Fernet
from django.contrib.auth.models import Group
from django.core.management import call_command

from audit.models import EventType, TraceEvent
from audit.transparency import keys
from audit.write.reviews import record_review
from diagnosis.models import ReleaseDecision, RunStatus
from reasoning.models import AgentReasoningAudit
from reasoning.selectors import get_reasoning_records
from tests.agent.runtime.support import GUARD_THINKING, ROUTER_THINKING, ask, script_reasoned_diagnosis

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runtime_pools", "corpus", "signing_key"),
]

REASONING_ROWS = 4  # router, the agent's two steps, the semantic guard


@pytest.fixture
def signing_key(settings):
    settings.AUDIT_SIGNING_KEYS = [keys.generate_key_text()]
    settings.AUDIT_VERIFY_KEYS = []


def _execute(llm, user):
    """One diagnosis executed by the runtime to SUCCESS, its reasoning stored, then anchored."""
    script_reasoned_diagnosis(llm)
    run, outcome, _ = ask(user, "Disk full on /var/log")
    assert outcome.release_decision == ReleaseDecision.PUBLISHED
    # What the executor leaves on a finished run: the epoch of its claim, the lease released.
    assert run.status == RunStatus.SUCCESS and run.lease_epoch >= 1
    assert run.lease_owner == "" and run.lease_expires_at is None
    assert AgentReasoningAudit.objects.filter(run_id=run.run_id, reasoning_available=True).count() == 3
    call_command("audit_checkpoint", stdout=io.StringIO())
    return run


def _after_finish(run) -> list[TraceEvent]:
    """The events appended after the run's RUN_FINISHED, in order."""
    events = list(TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"))
    finished = next(i for i, e in enumerate(events) if e.event_type == EventType.RUN_FINISHED)
    assert finished == max(i for i, e in enumerate(events) if e.event_type == EventType.RUN_FINISHED)
    return events[finished + 1 :]


def _verify_audit(*args: str) -> str:
    """`verify_audit` passes (exit 0: the command raises CommandError, exit 1, on any problem)."""
    out = io.StringIO()
    call_command("verify_audit", *args, stdout=out)
    return out.getvalue()


def _command(name: str, *args: str) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


def test_purge_by_age_on_an_executed_run(llm, user):
    run = _execute(llm, user)
    assert "purged 4 reasoning row(s) older than 0 day(s)" in _command("purge_reasoning", "--older-than", "0")
    rows = AgentReasoningAudit.objects.filter(run_id=run.run_id)
    assert rows.count() == REASONING_ROWS
    assert all(r.purged_at and r.reasoning_content is None and r.assistant_text is None for r in rows)
    (purged,) = _after_finish(run)
    assert purged.event_type == EventType.REASONING_PURGED and len(purged.details["rows"]) == REASONING_ROWS
    _verify_audit()
    _verify_audit("--run", run.run_id)


def test_purge_of_one_executed_run(llm, user):
    target, other = _execute(llm, user), _execute(llm, user)
    out = _command("purge_reasoning", "--run", target.run_id)
    assert f"purged 4 reasoning row(s) of run {target.run_id}" in out
    assert [e.event_type for e in _after_finish(target)] == [EventType.REASONING_PURGED]
    assert _after_finish(other) == []
    assert not AgentReasoningAudit.objects.filter(run_id=other.run_id, purged_at__isnull=False).exists()
    assert get_reasoning_records(run_id=other.run_id)[0].reasoning_content == ROUTER_THINKING
    _verify_audit()
    _verify_audit("--run", target.run_id)


def test_key_rotation_of_an_executed_run(llm, user, settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.REASONING_ENCRYPTION_KEYS = [old]
    run = _execute(llm, user)
    settings.REASONING_ENCRYPTION_KEYS = [new, old]
    out = _command("rotate_reasoning_keys")
    assert "re-encrypted 4" in out and "unreadable 0" in out
    (rekeyed,) = _after_finish(run)
    assert rekeyed.event_type == EventType.REASONING_REKEYED
    assert len(rekeyed.details["rows"]) == REASONING_ROWS
    settings.REASONING_ENCRYPTION_KEYS = [new]  # the old key removed after rotating
    contents = [r.reasoning_content for r in get_reasoning_records(run_id=run.run_id)]
    assert contents[0] == ROUTER_THINKING and contents[-1] == GUARD_THINKING
    _verify_audit()
    _verify_audit("--run", run.run_id)


def test_a_review_then_a_purge_and_a_rotation_of_an_executed_run(llm, user, settings, django_user_model):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.REASONING_ENCRYPTION_KEYS = [old]
    run = _execute(llm, user)
    reviewer = django_user_model.objects.create_user("reviewer", password="pw-reviewer-1", is_staff=True)
    reviewer.groups.add(Group.objects.get(name="Reviewers"))

    review = record_review(run=run, user=reviewer, verdict="correct", note="Checked the runbook.")
    settings.REASONING_ENCRYPTION_KEYS = [new, old]
    _command("rotate_reasoning_keys")
    _command("purge_reasoning", "--run", run.run_id)

    tail = _after_finish(run)
    assert [e.event_type for e in tail] == [
        EventType.REVIEW_RECORDED,
        EventType.REASONING_REKEYED,
        EventType.REASONING_PURGED,
    ]
    first = tail[0].sequence_no
    assert [e.sequence_no for e in tail] == [first, first + 1, first + 2] and review.sequence_no == first
    _verify_audit()
    _verify_audit("--run", run.run_id)


def test_a_row_changed_in_the_database_is_neither_purged_nor_rekeyed_and_stays_named(llm, user):
    """Re-binding a tampered row would launder the change: a backdated reasoning row (moved into the
    purge's scope) is left as it is by the purge and by key rotation, and verify_audit still names it."""
    import datetime as dt

    from django.core.management import CommandError
    from django.utils import timezone

    from audit.write.reasoning_changes import purge_reasoning, rotate_reasoning_keys

    run = _execute(llm, user)
    row = AgentReasoningAudit.objects.filter(run_id=run.run_id).order_by("pk").first()
    AgentReasoningAudit.objects.filter(pk=row.pk).update(created_at=timezone.now() - dt.timedelta(days=400))
    stats: dict[str, int] = {}
    assert purge_reasoning(older_than_days=365, stats=stats) == 0
    assert stats == {"purged": 0, "tampered": 1}
    row.refresh_from_db()
    assert row.purged_at is None and row.reasoning_content is not None
    assert not _after_finish(run)  # nothing appended: no digest re-bound
    assert rotate_reasoning_keys().tampered == 0  # nothing to re-encrypt: all under the newest key
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("verify_audit", "--run", run.run_id, stdout=out)
    assert "stored row does not match its digest" in out.getvalue()
