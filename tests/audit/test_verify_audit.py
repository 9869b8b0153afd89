"""`manage.py verify_audit`: a clean store passes; a tampered, deleted or reordered event and lost writes
of a finished run are reported (without content) with a non-zero exit code."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection

from audit.models import TraceEvent
from audit.verify.runs import verify_all_runs
from audit.write import RunRecorder
from diagnosis.models import DiagnosisRun
from tests.factories import REASONING_MARKER, make_recorded_run

pytestmark = pytest.mark.django_db


def _verify(*args):
    out = io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=out)
    except CommandError as exc:
        return False, out.getvalue(), str(exc)
    return True, out.getvalue(), ""


def test_a_clean_store_verifies(user):
    runs = [make_recorded_run(user) for _ in range(3)]
    ok, out, _ = _verify()
    assert ok and "verified 3 run(s): 3 ok, 0 with problems" in out
    ok, out, _ = _verify("--run", runs[1].run_id)
    assert ok and "verified 1 run(s): 1 ok" in out


def test_a_tampered_event_fails_with_exit_code_1(user):
    good, bad = make_recorded_run(user), make_recorded_run(user)
    TraceEvent.objects.filter(run_id=bad.run_id, sequence_no=3).update(summary=f"edited {REASONING_MARKER}")
    ok, out, error = _verify()
    assert not ok and "1 run(s) failed verification" in error
    assert f"run={bad.run_id} INVALID sequence 3: stored hash does not match its content" in out
    assert good.run_id not in out and REASONING_MARKER not in out
    assert _verify("--run", good.run_id)[0] is True
    assert _verify("--run", bad.run_id)[0] is False


def _trace_read(run):
    from audit.read import get_trace

    return get_trace(run=DiagnosisRun.objects.get(pk=run.pk)).summary


def test_an_edited_details_text_fails_the_trace_read_and_verify_audit(user):
    """The trace read verifies each event's hash over its details as stored text first; an edit of that
    text (still valid, canonical JSON) is caught there and by verify_audit, which recomputes from the
    decoded value."""
    run = make_recorded_run(user)
    assert _trace_read(run).chain_valid
    event = TraceEvent.objects.get(run_id=run.run_id, sequence_no=2)
    with connection.cursor() as cur:
        cur.execute("SELECT details FROM diagnosis_trace_event WHERE id = %s", [event.pk])
        text = cur.fetchone()[0]
        edited = text.replace("}", ',"zz":1}', 1) if text != "{}" else '{"zz":1}'
        cur.execute("UPDATE diagnosis_trace_event SET details = %s WHERE id = %s", [edited, event.pk])
    summary = _trace_read(run)
    assert not summary.chain_valid and not summary.audit_complete
    assert "hash chain: sequence 2: stored hash does not match its content" in summary.gaps
    ok, out, _ = _verify("--run", run.run_id)
    assert not ok and f"run={run.run_id} INVALID sequence 2: stored hash does not match its content" in out


@pytest.mark.parametrize(
    "field,value", [("status", "EDITED"), ("summary", "edited"), ("phase", "RELEASE"), ("session_id", "x")]
)
def test_an_edited_field_fails_the_trace_read_and_verify_audit(user, field, value):
    """A field edited beside an untouched details text: the hash over the stored text no longer matches,
    nor does the recomputation from the decoded value."""
    run = make_recorded_run(user)
    TraceEvent.objects.filter(run_id=run.run_id, sequence_no=4).update(**{field: value})
    summary = _trace_read(run)
    assert not summary.chain_valid
    assert "hash chain: sequence 4: stored hash does not match its content" in summary.gaps
    ok, out, _ = _verify("--run", run.run_id)
    assert not ok and f"run={run.run_id} INVALID sequence 4: stored hash does not match its content" in out


def test_a_deleted_event_is_a_gap_and_a_missing_write(user):
    run = make_recorded_run(user)
    TraceEvent.objects.filter(run_id=run.run_id, sequence_no=5).delete()
    ok, out, _ = _verify("--run", run.run_id)
    assert not ok
    assert f"run={run.run_id} INVALID sequence gap: 5 missing" in out
    assert f"run={run.run_id} INVALID sequence 6: prev_hash does not match the previous event's hash" in out
    assert f"run={run.run_id} INCOMPLETE 1 timeline event(s) expected but not stored" in out


def test_a_truncated_tail_is_caught_by_the_expected_count(user):
    run = make_recorded_run(user)
    last = TraceEvent.objects.filter(run_id=run.run_id).order_by("-sequence_no").first()
    last.delete()  # the chain of what remains is valid; only the count shows the loss
    ok, out, _ = _verify("--run", run.run_id)
    assert not ok and "INCOMPLETE 1 timeline event(s) expected but not stored" in out
    assert "INVALID" not in out


def test_write_failures_and_a_running_run(user, run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    assert _verify("--run", run.run_id)[0] is True  # a running run's counts are not final yet
    done = make_recorded_run(user)
    DiagnosisRun.objects.filter(pk=done.pk).update(audit_write_failures=2)
    ok, out, _ = _verify()
    assert not ok and f"run={done.run_id} INCOMPLETE 2 audit write failure(s) recorded" in out


def test_an_unknown_run_is_an_error():
    with pytest.raises(CommandError, match="no run"):
        call_command("verify_audit", "--run", "run_absent", stdout=io.StringIO())


def test_all_runs_are_streamed_in_batches(user):
    runs = [make_recorded_run(user, tools=1) for _ in range(5)]
    results = list(verify_all_runs(batch_size=2))
    assert [r.run_id for r in results] == [r.run_id for r in runs]
    assert all(r.ok and r.events > 0 for r in results)


def test_the_command_error_maps_to_exit_code_1(user):
    run = make_recorded_run(user)
    TraceEvent.objects.filter(run_id=run.run_id, sequence_no=2).update(status="FORGED")
    with pytest.raises(CommandError) as failed:
        call_command("verify_audit", stdout=io.StringIO())
    assert failed.value.returncode == 1  # what manage.py exits with (BaseCommand.run_from_argv)


@pytest.mark.django_db(transaction=True)
def test_the_exit_code_of_a_real_manage_py_process(user):
    """What a cron job or CI sees: `manage.py verify_audit` in another process, on this test database
    (the clean case exits 0: test_a_clean_store_verifies, in process)."""
    run = make_recorded_run(user)
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        url = f"sqlite:///{db['NAME']}"
    else:
        host = f"{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 3306}"
        url = f"mysql://{db['USER']}:{db['PASSWORD']}@{host}/{db['NAME']}"
    env = {**os.environ, "DATABASE_URL": url}
    manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "verify_audit", "--skip-checks"]

    TraceEvent.objects.filter(run_id=run.run_id, sequence_no=3).update(summary="rewritten")
    tampered = subprocess.run(manage, env=env, capture_output=True, text=True, timeout=60)
    assert tampered.returncode == 1
    assert f"run={run.run_id} INVALID sequence 3: stored hash does not match its content" in tampered.stdout
    assert "Traceback" not in tampered.stderr
