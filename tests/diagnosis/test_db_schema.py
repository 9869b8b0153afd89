"""The data model on the real database: migrations in sync, utf8mb4 round-trips, seed table shapes."""

import io

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection, models
from django.utils import timezone

from audit.models import AgentStep, RunReview, ToolInvocation, TraceEvent
from diagnosis.models import ChatSession, DiagnosisRun, RunFeedback
from reasoning.models import AgentReasoningAudit, ReasoningAccessLog

SAMPLE = "诊断🚀𠜎 — ünïcödé 😀 ok"  # CJK, 4-byte emoji, a 4-byte CJK extension B ideograph


@pytest.mark.django_db
def test_makemigrations_is_clean():
    out = io.StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def _fill_text_fields(model, obj):
    for field in model._meta.concrete_fields:
        if isinstance(field, (models.CharField, models.TextField)) and not field.choices:
            if field.unique or field.name.endswith("session_id") or field.name.endswith("run_id"):
                continue
            if field.name in ("hash", "prev_hash", "output_sha256"):
                continue
            limit = field.max_length or 10_000
            setattr(obj, field.attname, (SAMPLE * (limit // len(SAMPLE) + 1))[:limit])


@pytest.mark.django_db
def test_four_byte_utf8_round_trips_in_every_text_column(user):
    now = timezone.now()
    session = ChatSession(session_id="ses_🚀", owner=user)
    _fill_text_fields(ChatSession, session)
    session.save()
    run = DiagnosisRun(run_id="run_诊断", session=session, query="")
    _fill_text_fields(DiagnosisRun, run)
    run.save()
    rows = [
        (RunFeedback, RunFeedback(run=run, user=user, rating="up")),
        (
            TraceEvent,
            TraceEvent(
                run_id=run.run_id,
                session_id=session.session_id,
                sequence_no=1,
                phase="RUN",
                event_type="RUN_STARTED",
                details={"text": SAMPLE},
                prev_hash="0" * 64,
                hash="1" * 64,
                created_at=now,
            ),
        ),
        (
            AgentStep,
            AgentStep(
                run_id=run.run_id,
                session_id=session.session_id,
                step_index=1,
                model_output={"text": SAMPLE},
                created_at=now,
            ),
        ),
        (
            ToolInvocation,
            ToolInvocation(
                run_id=run.run_id,
                session_id=session.session_id,
                tool_call_id="call_😀",
                input_params={"query": SAMPLE},
                created_at=now,
                updated_at=now,
            ),
        ),
        (
            AgentReasoningAudit,
            AgentReasoningAudit(
                session_id=session.session_id,
                run_id=run.run_id,
                step_index=1,
                reasoning_available=True,
                content_bytes=1,
                created_at=now,
            ),
        ),
        (ReasoningAccessLog, ReasoningAccessLog(user=user, session_id="s", run_id="r", records_returned=1)),
    ]
    for model, obj in rows:
        _fill_text_fields(model, obj)
        obj.save()
    for model, obj in [(ChatSession, session), (DiagnosisRun, run), *rows]:
        stored = model.objects.get(pk=obj.pk)
        for field in model._meta.concrete_fields:
            if isinstance(field, (models.CharField, models.TextField, models.JSONField)):
                assert getattr(stored, field.attname) == getattr(obj, field.attname), (model, field.name)
    assert DiagnosisRun.objects.get(run_id="run_诊断").session_id == "ses_🚀"


@pytest.mark.mariadb
@pytest.mark.django_db
def test_mariadb_tables_are_utf8mb4_and_strict():
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@SESSION.sql_mode, @@character_set_connection")
        sql_mode, charset = cursor.fetchone()
        assert "STRICT_TRANS_TABLES" in sql_mode and charset == "utf8mb4"
        for model in apps.get_app_config("audit").get_models():
            cursor.execute(
                "SELECT TABLE_COLLATION FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
                [model._meta.db_table],
            )
            assert cursor.fetchone()[0].startswith("utf8mb4")


@pytest.mark.mariadb
@pytest.mark.django_db
def test_reasoning_table_matches_seed_000():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COLUMN_NAME, DATA_TYPE, IS_NULLABLE FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'agent_reasoning_audit'"
        )
        columns = {name: (dtype, nullable) for name, dtype, nullable in cursor.fetchall()}
        cursor.execute(
            "SELECT INDEX_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) "
            "FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'agent_reasoning_audit' GROUP BY INDEX_NAME"
        )
        indexes = dict(cursor.fetchall())
    assert columns["id"][0] == "bigint"
    assert columns["session_id"] == ("varchar", "NO") and columns["run_id"] == ("varchar", "NO")
    assert columns["step_index"][0] == "int" and columns["agent_name"][0] == "varchar"
    assert columns["reasoning_available"][0] == "tinyint"
    assert columns["reasoning_content"] == ("longtext", "YES")
    assert columns["assistant_text"] == ("longtext", "YES")
    assert columns["content_source"] == ("varchar", "YES")
    assert columns["content_bytes"] == ("int", "NO")
    assert columns["created_at"][0] == "datetime"
    assert indexes["idx_reasoning_run_step"] == "run_id,step_index"
    assert indexes["idx_reasoning_session_created"] == "session_id,created_at"


@pytest.mark.django_db
def test_auditor_group_holds_the_reasoning_permission():
    from django.contrib.auth.models import Group

    group = Group.objects.get(name="Reasoning Auditors")
    assert group.permissions.filter(
        codename="view_reasoning_content", content_type__app_label="reasoning"
    ).exists()


@pytest.mark.django_db
def test_audit_tables_have_no_foreign_key_to_the_run():
    with connection.cursor() as cursor:
        for model in (TraceEvent, AgentStep, ToolInvocation, AgentReasoningAudit):
            constraints = connection.introspection.get_constraints(cursor, model._meta.db_table)
            assert not [c for c in constraints.values() if c["foreign_key"]], model


@pytest.mark.django_db
def test_a_run_s_audit_rows_are_found_by_one_index_that_starts_with_run_id():
    """Events, steps, tools and reviews are read by run through their unique constraint, which starts
    with `run_id`; a second index on `run_id` alone (Django's default for the foreign key) only cost
    each insert, and migration 0021 dropped it. Asked of the database itself, on both backends."""
    with connection.cursor() as cursor:
        for model in (TraceEvent, AgentStep, ToolInvocation, RunReview):
            constraints = connection.introspection.get_constraints(cursor, model._meta.db_table)
            starting = {
                name: c
                for name, c in constraints.items()
                if (c["index"] or c["unique"]) and c["columns"][:1] == ["run_id"]
            }
            assert [name for name, c in starting.items() if c["unique"] and len(c["columns"]) > 1], model
            assert not [name for name, c in starting.items() if c["columns"] == ["run_id"]], (model, starting)
