"""Every durable row of a run is bound into its hash chain: a changed or deleted tool, step or reasoning
row, a changed released content or token ledger, or a changed event is named by `manage.py verify_audit`
(exit 1) and by the trace summary, and verifies again once restored; a reasoning purge or key rotation
writes its own chained event, so purged and re-encrypted rows verify; the trace never reads reasoning
content."""

from __future__ import annotations

import io
import logging

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.db import connection

from audit.models import AgentStep, EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.read import get_trace
from audit.verify import row_digests
from audit.verify.hash_chain import GENESIS_HASH, link_hash
from audit.write import DeclaredToolCall, RunRecorder, ToolCallRepeated
from audit.write.reasoning_changes import purge_reasoning, rotate_reasoning_keys
from diagnosis.models import DiagnosisRun, RunStatus
from reasoning import crypto
from reasoning.capture import build_capture
from reasoning.fields import Ciphertext
from reasoning.models import AgentReasoningAudit
from tests.audit.legacy import recorded_before_write_authentication
from tests.factories import REASONING_MARKER, executing, make_recorded_run, usage

pytestmark = pytest.mark.django_db

ROWS_OF_A_FULL_RUN = 7  # 2 steps, 2 tools, 2 reasoning rows, the run's terminal summary


def _verify(run):
    out = io.StringIO()
    try:
        call_command("verify_audit", "--run", run.run_id, stdout=out)
    except CommandError:
        return False, out.getvalue()
    return True, out.getvalue()


def _summary(run):
    return get_trace(run=DiagnosisRun.objects.get(pk=run.pk)).summary


def _seq(run, event_type, **details):
    """The sequence number of the last event of `event_type` whose details contain `details`."""
    events = TraceEvent.objects.filter(run_id=run.run_id, event_type=event_type).order_by("sequence_no")
    found = [e for e in events if all(e.details.get(k) == v for k, v in details.items())]
    return found[-1].sequence_no


def _assert_clean(run):
    ok, out = _verify(run)
    assert ok, out
    summary = _summary(run)
    assert summary.audit_complete, summary.gaps
    assert summary.rows_verified is True, summary.gaps
    return summary


def _assert_named(run, problem):
    ok, out = _verify(run)
    assert not ok and problem in out, out
    assert REASONING_MARKER not in out and "fernet:" not in out
    summary = _summary(run)
    assert not summary.audit_complete
    assert any(problem in gap for gap in summary.gaps), summary.gaps
    if "hash does not match" not in problem:  # a row, not an event: the rows are not verified
        assert summary.rows_verified is False, summary.gaps
    assert not any(REASONING_MARKER in gap or "fernet:" in gap for gap in summary.gaps)


def _stored_reasoning(run, step_index):
    return next(
        r for r in row_digests.stored_reasoning_rows(run_id=run.run_id) if r["step_index"] == step_index
    )


def test_a_recorded_run_verifies_every_row(user):
    run = make_recorded_run(user)
    summary = _assert_clean(run)
    assert summary.rows_verified_count == ROWS_OF_A_FULL_RUN
    assert "7 row(s) verified" in _verify(run)[1]
    finished = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_FINISHED)
    events = TraceEvent.objects.filter(run_id=run.run_id).count()
    assert finished.details["expected"] == {"events": events, "steps": 2, "tools": 2, "reasoning": 2}


# --------------------------------------------------------------------------------------------------
# Tampering with each kind of row is named, and restoring it verifies again
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("status", ToolStatus.FAILED),
        ("output_sha256", "0" * 64),
        ("output_length", 1),
        ("provider_tool_call_id", "call_9"),
        ("input_params", {"query": "something else"}),
    ],
)
def test_a_changed_tool_row_is_named(user, column, value):
    run = make_recorded_run(user)
    tool = ToolInvocation.objects.filter(run_id=run.run_id, tool_call_id="call_0")
    original = tool.values_list(column, flat=True).get()
    tool.update(**{column: value})
    seq = _seq(run, EventType.TOOL_INVOCATION, toolCallId="call_0")
    _assert_named(run, f"tool call call_0: stored row does not match its digest at sequence {seq}")
    tool.update(**{column: original})
    _assert_clean(run)


@pytest.mark.parametrize("column", ["prompt_tokens", "total_tokens", "reasoning_tokens"])
def test_a_changed_step_token_count_is_named(user, column):
    run = make_recorded_run(user)
    step = AgentStep.objects.filter(run_id=run.run_id, step_index=1)
    original = step.values_list(column, flat=True).get()
    step.update(**{column: (original or 0) + 1})
    seq = _seq(run, EventType.AGENT_MODEL_STEP, stepIndex=1)
    _assert_named(run, f"model step 1: stored row does not match its digest at sequence {seq}")
    step.update(**{column: original})
    _assert_clean(run)


def test_a_changed_reasoning_row_is_named(user):
    run = make_recorded_run(user)
    stored = _stored_reasoning(run, 2)
    row = AgentReasoningAudit.objects.filter(pk=stored["id"])
    row.update(reasoning_content="a different story")  # encrypted like any write
    seq = _seq(run, EventType.AGENT_MODEL_STEP, stepIndex=2)
    problem = (
        f"reasoning row for step 2 (diagnosis_agent): stored row does not match its digest at sequence {seq}"
    )
    _assert_named(run, problem)
    row.update(reasoning_content=Ciphertext(stored["reasoning_content"]))  # the original stored value
    _assert_clean(run)


@pytest.mark.parametrize("column", ["content_bytes", "reasoning_available", "purged_at"])
def test_a_changed_reasoning_metadata_column_is_named(user, column):
    run = make_recorded_run(user)
    stored = _stored_reasoning(run, 1)
    row = AgentReasoningAudit.objects.filter(pk=stored["id"])
    forged = {"content_bytes": 1, "reasoning_available": False, "purged_at": stored["created_at"]}[column]
    row.update(**{column: forged})
    _assert_named(run, "reasoning row for step 1 (diagnosis_agent): stored row does not match its digest")
    row.update(**{column: stored[column]})
    _assert_clean(run)


def test_a_deleted_reasoning_row_is_named(user):
    run = make_recorded_run(user)
    stored = _stored_reasoning(run, 2)
    AgentReasoningAudit.objects.filter(pk=stored["id"]).delete()
    seq = _seq(run, EventType.AGENT_MODEL_STEP, stepIndex=2)
    _assert_named(run, f"reasoning row for step 2 (diagnosis_agent) missing (recorded at sequence {seq})")
    assert "1 reasoning row expected but not stored" in _summary(run).gaps
    restored = {k: v for k, v in stored.items() if k != "id"}
    for column in ("reasoning_content", "assistant_text"):
        restored[column] = Ciphertext(restored[column]) if restored[column] is not None else None
    AgentReasoningAudit.objects.create(**restored)
    _assert_clean(run)


def test_all_reasoning_rows_deleted_is_named(user):
    run = make_recorded_run(user)
    AgentReasoningAudit.objects.filter(run_id=run.run_id).delete()
    _assert_named(run, "reasoning row for step 1 (diagnosis_agent) missing")
    _assert_named(run, "reasoning row for step 2 (diagnosis_agent) missing")
    assert "2 reasoning row(s) expected but not stored" in _verify(run)[1]


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("content", "A forged answer."),
        ("tokens_total", 1),
        ("tokens_agent", 0),
        ("tokens_reconciled", False),
        ("model_calls", 99),
        ("release_decision", "BLOCKED"),
        ("expected_events", 3),
    ],
)
def test_a_changed_run_summary_is_named(user, column, value):
    run = make_recorded_run(user)
    original = getattr(run, column)
    DiagnosisRun.objects.filter(pk=run.pk).update(**{column: value})
    seq = _seq(run, EventType.RUN_FINISHED)
    _assert_named(
        run,
        "run: stored terminal summary (status, release, error, content, token ledger, expected counts) "
        f"does not match its digest at sequence {seq}",
    )
    DiagnosisRun.objects.filter(pk=run.pk).update(**{column: original})
    _assert_clean(run)


def test_expected_counts_are_read_from_the_chain_not_the_run_columns(user):
    """Deleting a tool row and lowering the run's expected_tools to match still shows the loss."""
    run = make_recorded_run(user)
    ToolInvocation.objects.filter(run_id=run.run_id, tool_call_id="call_1").delete()
    DiagnosisRun.objects.filter(pk=run.pk).update(expected_tools=1)
    ok, out = _verify(run)
    assert not ok and "1 tool invocation(s) expected but not stored" in out
    assert "tool call call_1 missing (recorded at sequence" in out
    summary = _summary(run)
    assert summary.expected.tools == 2 and summary.persisted.tools == 1


def test_a_changed_event_is_named_and_restoring_it_verifies(user):
    run = make_recorded_run(user)
    event = TraceEvent.objects.filter(run_id=run.run_id, sequence_no=4)
    original = event.values_list("summary", flat=True).get()
    event.update(summary="forged")
    _assert_named(run, "sequence 4: stored hash does not match its content")
    event.update(summary=original)
    _assert_clean(run)


def test_a_digest_rewritten_in_an_event_breaks_the_chain(user):
    """Rewriting the bound digest to fit a forged row is caught by the event's own hash."""
    run = make_recorded_run(user)
    ToolInvocation.objects.filter(run_id=run.run_id, tool_call_id="call_0").update(status=ToolStatus.FAILED)
    seq = _seq(run, EventType.TOOL_INVOCATION, toolCallId="call_0")
    event = TraceEvent.objects.get(run_id=run.run_id, sequence_no=seq)
    event.details = {
        **event.details,
        "rowDigest": row_digests.TOOL.digest_of(
            ToolInvocation.objects.get(run_id=run.run_id, tool_call_id="call_0")
        ),
    }
    event.save(update_fields=["details"])
    _assert_named(run, f"sequence {seq}: stored hash does not match its content")


def test_a_row_written_outside_the_recorder_is_named(user):
    run = make_recorded_run(user)
    tool = ToolInvocation.objects.get(run_id=run.run_id, tool_call_id="call_0")
    tool.pk, tool.tool_call_id = None, "call_forged"
    tool.save()
    _assert_named(run, "tool call call_forged: stored row not recorded in the chain")


# --------------------------------------------------------------------------------------------------
# Rows written on the recorder's other paths verify
# --------------------------------------------------------------------------------------------------
class _FailInserts:
    """A database execute wrapper (Django's instrumentation hook) that rejects INSERTs into `table`."""

    def __init__(self, table):
        self.table = table

    def __call__(self, execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("INSERT") and self.table in sql:
            from django.db import OperationalError

            raise OperationalError(1114, "The table is full")
        return execute(sql, params, many, context)


def _declared_step(rec, *ids):
    rec.model_step(
        step_index=1,
        agent_name="diagnosis_agent",
        model="m",
        usage=usage(10, 5),
        reasoning=build_capture(reasoning=f"why {REASONING_MARKER}", text=""),
        tool_calls=[DeclaredToolCall(tool_call_id=i, name="lookup_knowledge", arguments="{}") for i in ids],
        finish_reason="tool_calls",
    )


def test_the_terminal_row_inserted_when_the_start_never_committed_verifies(run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    _declared_step(rec, "c1")
    with connection.execute_wrapper(_FailInserts("tool_invocation")):
        rec.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={"q": "lag"})
    assert not ToolInvocation.objects.filter(run_id=run.run_id).exists()
    rec.tool_finished(tool_call_id="c1", status=ToolStatus.SUCCEEDED, output="result")
    rec.finish(status=RunStatus.SUCCESS, content="done")
    tool = ToolInvocation.objects.get(run_id=run.run_id)
    assert tool.status == ToolStatus.SUCCEEDED and tool.input_params == {"q": "lag"}
    ok, out = _verify(run)
    assert "tool call c1" not in out  # its row verifies; only the lost start write is reported
    assert "1 audit write failure(s) recorded" in out and not ok
    summary = _summary(run)
    assert not any("tool call c1" in gap for gap in summary.gaps)
    assert summary.rows_verified_count == 4  # step, reasoning, tool, run


def test_tools_closed_by_a_takeover_and_the_finish_verify(run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    _declared_step(rec, "c1", "c2", "c3")
    for call in ("c1", "c2", "c3"):
        rec.tool_started(tool_call_id=call, tool_name="lookup_knowledge", input_params={"q": call})
    rec.tool_finished(tool_call_id="c1", status=ToolStatus.SUCCEEDED, output="ok")
    rec.close_tools(status=ToolStatus.INTERRUPTED, error_code="CANCELLED")  # c2, c3 in this process
    with pytest.raises(ToolCallRepeated):  # nothing written
        rec.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={"q": "c1"})
    # Another process (the sweeper) takes over and finishes.
    taken = RunRecorder.resume(run.run_id)
    taken.finish(status=RunStatus.FAILED, error_code="LEASE_EXPIRED", error_message="owner gone")
    summary = _assert_clean(run)
    assert summary.rows_verified_count == 1 + 1 + 3 + 1


def test_a_takeover_that_closes_a_running_tool_verifies(run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    _declared_step(rec, "c1")
    rec.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={"q": "lag"})
    taken = RunRecorder.resume(run.run_id)
    taken.close_tools(status=ToolStatus.FAILED, error_code="LEASE_EXPIRED", error_message="owner gone")
    taken.finish(status=RunStatus.FAILED, error_code="LEASE_EXPIRED")
    assert ToolInvocation.objects.get(run_id=run.run_id).status == ToolStatus.FAILED
    assert _assert_clean(run).rows_verified_count == 4


def test_a_running_run_takes_expected_counts_from_its_events(run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    _declared_step(rec, "c1")
    rec.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={})
    assert _verify(run)[0] is True
    summary = _summary(run)
    assert summary.rows_verified_count == 3 and summary.gaps == ["run still RUNNING"]
    assert summary.expected.steps == 1 and summary.expected.tools == 1
    AgentStep.objects.filter(run_id=run.run_id).delete()
    assert "model step 1 missing (recorded at sequence 2)" in _summary(run).gaps
    assert _verify(run)[0] is False


# --------------------------------------------------------------------------------------------------
# Purge and key rotation keep the proof
# --------------------------------------------------------------------------------------------------
def test_a_purged_run_verifies_as_purged(user):
    run = make_recorded_run(user)
    other = make_recorded_run(user)
    assert purge_reasoning(run_id=run.run_id) == 2
    purge = TraceEvent.objects.filter(run_id=run.run_id).order_by("-sequence_no").first()
    assert purge.event_type == EventType.REASONING_PURGED and purge.status == "PURGED"
    assert [(r["stepIndex"], r["agentName"]) for r in purge.details["rows"]] == [
        (1, "diagnosis_agent"),
        (2, "diagnosis_agent"),
    ]
    ok, out = _verify(run)
    assert ok, out
    assert (
        f"run={run.run_id} NOTE reasoning row for step 1 (diagnosis_agent) purged "
        f"(sequence {purge.sequence_no})" in out
    )
    summary = _assert_clean(run)
    assert summary.rows_verified_count == ROWS_OF_A_FULL_RUN
    assert summary.persisted.events == summary.expected.events
    assert not TraceEvent.objects.filter(run_id=other.run_id, event_type=EventType.REASONING_PURGED).exists()
    # A purged row altered or deleted afterwards is still named.
    AgentReasoningAudit.objects.filter(run_id=run.run_id, step_index=2).delete()
    _assert_named(
        run, f"reasoning row for step 2 (diagnosis_agent) missing (recorded at sequence {purge.sequence_no})"
    )


def test_a_purge_by_age_writes_one_event_per_run_and_is_idempotent(user):
    runs = [make_recorded_run(user) for _ in range(3)]
    assert purge_reasoning(older_than_days=0, batch_size=4) == 6
    assert purge_reasoning(older_than_days=0) == 0
    out = io.StringIO()
    call_command("verify_audit", stdout=out)
    assert "verified 3 run(s): 3 ok, 0 with problems; 21 row(s) verified" in out.getvalue()
    for run in runs:
        purges = TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.REASONING_PURGED)
        assert sum(len(e.details["rows"]) for e in purges) == 2


def test_a_purge_while_the_run_executes_leaves_it_complete(run):
    rec = executing(run)  # claimed: the purge writes under the executor's epoch, never fenced
    rec.run_started()
    _declared_step(rec, "c1")
    purge_reasoning(run_id=run.run_id)
    rec.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={})
    rec.tool_finished(tool_call_id="c1", status=ToolStatus.SUCCEEDED, output="ok")
    rec.finish(status=RunStatus.SUCCESS, content="done")
    summary = _assert_clean(run)
    assert summary.rows_verified_count == 4
    assert summary.persisted.events == summary.expected.events


def test_key_rotation_writes_its_event_and_the_rows_verify(user, settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.REASONING_ENCRYPTION_KEYS = [old]
    run = make_recorded_run(user)
    settings.REASONING_ENCRYPTION_KEYS = [new, old]
    report = rotate_reasoning_keys()
    assert report.rotated == 2
    rekey = TraceEvent.objects.filter(run_id=run.run_id).order_by("-sequence_no").first()
    assert rekey.event_type == EventType.REASONING_REKEYED and len(rekey.details["rows"]) == 2
    settings.REASONING_ENCRYPTION_KEYS = [new]  # the old key removed after rotating
    assert _assert_clean(run).rows_verified_count == ROWS_OF_A_FULL_RUN
    assert rotate_reasoning_keys().rotated == 0  # idempotent: no second event
    assert TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.REASONING_REKEYED).count() == 1


# --------------------------------------------------------------------------------------------------
# The trace never reads reasoning content
# --------------------------------------------------------------------------------------------------
def test_the_trace_verifies_reasoning_rows_without_decrypting_them(
    api_client, user, monkeypatch, caplog, settings
):
    run = make_recorded_run(user)
    decrypted = []
    real = crypto.Keyring.decrypt
    monkeypatch.setattr(
        crypto.Keyring, "decrypt", lambda self, stored: decrypted.append(1) or real(self, stored)
    )
    # Without any key that could decrypt the rows, their digests still verify.
    settings.REASONING_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    api_client.force_login(user)
    with caplog.at_level(logging.WARNING):
        response = api_client.get(f"/api/diagnosis/{run.session_id}/trace?runId={run.run_id}")
    assert response.status_code == 200
    body = response.content.decode()
    summary = response.json()["summary"]
    assert summary["rowsVerifiedCount"] == ROWS_OF_A_FULL_RUN and summary["auditComplete"] is True
    assert decrypted == []
    assert "undecryptable" not in caplog.text
    assert REASONING_MARKER not in body and "fernet:" not in body


# --------------------------------------------------------------------------------------------------
# Runs recorded before row digests
# --------------------------------------------------------------------------------------------------
_DIGEST_KEYS = ("stepDigest", "reasoningDigest", "rowDigest", "runDigest", "expected")


def _strip_digests(run):
    """Rewrite the run's chain as it was recorded before row digests existed (valid, without digests)."""
    prev = GENESIS_HASH
    for event in TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"):
        event.details = {k: v for k, v in event.details.items() if k not in _DIGEST_KEYS}
        event.prev_hash = prev
        event.hash = link_hash(event)
        event.save(update_fields=["details", "prev_hash", "hash"])
        prev = event.hash


def test_a_run_recorded_before_row_digests_reads_as_not_bound(user):
    run = make_recorded_run(user)
    _strip_digests(run)
    # Row digests came before write authentication: such a run is one the signed log vouches for.
    assert recorded_before_write_authentication().anchored_runs == 1
    ok, out = _verify(run)
    assert ok, out
    assert "NOTE model steps 1, 2: not bound (recorded before row digests)" in out
    assert "NOTE tool calls call_0, call_1: not bound (recorded before row digests)" in out
    summary = _summary(run)
    assert summary.audit_complete and summary.rows_verified_count == 0
    assert summary.rows_verified is False  # nothing bound: nothing proven, though nothing is missing
    assert "run summary " + run.run_id + ": not bound (recorded before row digests)" in summary.gaps


# --------------------------------------------------------------------------------------------------
# Outside a test transaction: the production write paths (on MariaDB one compound statement per
# decision; with group commit, batches on the committer's connection)
# --------------------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("group_commit", [False, True])
def test_rows_written_on_the_production_paths_verify(user, group_commit):
    from diagnosis import services
    from tests.factories import record_full_run

    run = services.create_run(session=services.create_session(owner=user), query="q")
    record_full_run(run, tools=2, extra_steps=1, recorder=RunRecorder.for_run(run, group_commit=group_commit))
    assert _assert_clean(run).rows_verified_count == ROWS_OF_A_FULL_RUN + 2  # one more step and reasoning row
    purge_reasoning(run_id=run.run_id)
    assert _assert_clean(run).rows_verified_count == ROWS_OF_A_FULL_RUN + 2
    ToolInvocation.objects.filter(run_id=run.run_id, tool_call_id="call_1").update(status=ToolStatus.FAILED)
    _assert_named(run, "tool call call_1: stored row does not match its digest")


def test_the_pure_chain_reader_names_the_models_event_types_and_tool_statuses():
    """`audit.verify.chain_digests` (shared with the offline bundle verifier) spells the choices of
    `audit.models`."""
    from audit.models import EventType, ToolStatus
    from audit.verify import chain_digests

    for name in (
        "AGENT_MODEL_STEP",
        "TOOL_INVOCATION",
        "RUN_FINISHED",
        "REASONING_PURGED",
        "REASONING_REKEYED",
    ):
        assert getattr(chain_digests, name) == EventType[name].value
    assert frozenset(ToolStatus.values) == chain_digests.TOOL_STATUSES


# --------------------------------------------------------------------------------------------------
# The run's identity (run-start, session) and its terminal form run/4; runs recorded before them
# --------------------------------------------------------------------------------------------------
def _rehash_from(run, sequence_no):
    """Re-hash the stored chain from `sequence_no` on (as a writer of an earlier version left it)."""
    prev = GENESIS_HASH
    for event in TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"):
        if event.sequence_no >= sequence_no:
            event.prev_hash = prev
            event.hash = link_hash(event)
            TraceEvent.objects.filter(pk=event.pk).update(prev_hash=event.prev_hash, hash=event.hash)
        prev = event.hash


def test_a_new_run_binds_its_identity_and_its_session_at_start(user):
    run = make_recorded_run(user)
    started = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_STARTED)
    assert started.details["startForm"] == "run-start" and started.details["sessionForm"] == "session"
    assert started.details["startDigest"] == row_digests.RUN_START.digest_of(run)
    assert started.details["sessionDigest"] == row_digests.SESSION.digest_of(run.session)
    assert started.details["owner"] == user.get_username()
    finished = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_FINISHED)
    assert finished.details["runForm"] == "run/4"
    _assert_clean(run)


def test_a_run_started_before_identity_digests_verifies_with_a_note(user):
    run = make_recorded_run(user)
    started = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_STARTED)
    legacy = {
        k: v for k, v in started.details.items() if k not in ("startForm", "startDigest", "sessionForm")
    }
    legacy.pop("sessionDigest")
    legacy.pop("owner")
    TraceEvent.objects.filter(pk=started.pk).update(details=legacy)
    _rehash_from(run, started.sequence_no)
    DiagnosisRun.objects.filter(pk=run.pk).update(query="changed: nothing bound it then")
    # Identity digests came before write authentication: such a run is one the signed log vouches for.
    assert recorded_before_write_authentication().anchored_runs == 1
    ok, out = _verify(run)
    assert ok, out
    assert "run identity (question, session, owner) not bound" in out


def test_a_run_finished_in_form_run_3_still_verifies_and_its_intent_is_then_unbound(user):
    run = make_recorded_run(user)
    finished = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_FINISHED)
    details = {**finished.details, "runForm": "run/3", "runDigest": row_digests.RUN_V3.digest_of(run)}
    TraceEvent.objects.filter(pk=finished.pk).update(details=details)
    _rehash_from(run, finished.sequence_no)
    # Form run/4 came before write authentication: a run/3 run is one the signed log vouches for.
    recorded_before_write_authentication()
    _assert_clean(run)
    DiagnosisRun.objects.filter(pk=run.pk).update(error_message="not in run/3")
    assert _verify(run)[0]
    DiagnosisRun.objects.filter(pk=run.pk).update(status=RunStatus.FAILED)
    assert not _verify(run)[0]
