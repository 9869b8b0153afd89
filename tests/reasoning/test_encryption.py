"""Encryption at rest of reasoning and assistant text: no plaintext in the column, key rotation, removed
keys, legacy plaintext, the production system check and the development key file."""

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.conf import settings as django_settings
from django.core.cache import cache
from django.core.management import CommandError, call_command
from django.core.management.base import SystemCheckError
from django.db import connection, transaction

from audit.write.reasoning_changes import rotate_reasoning_keys
from diagnosis import services
from reasoning import crypto
from reasoning.fields import Ciphertext
from reasoning.models import AgentReasoningAudit
from tests.factories import REASONING_MARKER, make_recorded_run

pytestmark = pytest.mark.django_db

KEY_A = Fernet.generate_key().decode()
KEY_B = Fernet.generate_key().decode()


@pytest.fixture(autouse=True)
def _keys(settings):
    settings.REASONING_ENCRYPTION_KEYS = [KEY_A]
    cache.clear()
    yield
    cache.clear()


def _raw_rows():
    table = connection.ops.quote_name("agent_reasoning_audit")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, reasoning_content, assistant_text FROM {table} ORDER BY id")
        return cursor.fetchall()


def _raw_values():
    return [v for _, r, a in _raw_rows() for v in (r, a) if v is not None]


def test_the_raw_columns_hold_no_plaintext(user):
    run = make_recorded_run(user, extra_steps=1)
    values = _raw_values()
    assert len(values) == 5  # step 1: reasoning + plan; step 2: text; step 3: reasoning + answer
    prefix = f"fernet:{crypto.key_id(KEY_A)}:"
    for value in values:
        assert value.startswith(prefix)
        assert REASONING_MARKER not in value and "tool_calls" not in value and "Replication" not in value
    rows = list(AgentReasoningAudit.objects.filter(run_id=run.run_id).order_by("step_index"))
    assert REASONING_MARKER in rows[0].reasoning_content and rows[1].reasoning_content is None
    assert rows[1].assistant_text == "thinking aloud"


def test_utf8mb4_text_round_trips_encrypted(user):
    from audit.write import RunRecorder
    from diagnosis import services
    from reasoning.capture import build_capture
    from tests.factories import usage

    run = services.create_run(session=services.create_session(owner=user), query="q")
    text = "诊断🚀𠜎 ünïcödé " * 2000
    rec = RunRecorder.for_run(run)
    rec.model_step(
        step_index=1,
        agent_name="diagnosis_agent",
        model="m",
        usage=usage(1, 1),
        reasoning=build_capture(reasoning=text, text=text),
    )
    row = AgentReasoningAudit.objects.get(run_id=run.run_id)
    assert row.reasoning_content == text[:32000] and row.assistant_text == text[:32000]
    assert "诊断" not in "".join(_raw_values())


def test_rotation_re_encrypts_under_the_new_key_and_the_old_key_can_go(api_client, auditor, user, settings):
    run = make_recorded_run(user)
    settings.REASONING_ENCRYPTION_KEYS = [KEY_B, KEY_A]
    # Both keys configured: old rows still read, new rows are written under B.
    assert REASONING_MARKER in AgentReasoningAudit.objects.filter(run_id=run.run_id).first().reasoning_content
    newer = make_recorded_run(user)

    out = io.StringIO()
    call_command("rotate_reasoning_keys", "--batch-size", "1", stdout=out)
    assert "re-encrypted 2, encrypted from plaintext 0, unreadable 0" in out.getvalue()
    prefix_b = f"fernet:{crypto.key_id(KEY_B)}:"
    assert all(v.startswith(prefix_b) for v in _raw_values())

    again = rotate_reasoning_keys()
    assert (again.scanned, again.rotated) == (0, 0)  # idempotent

    settings.REASONING_ENCRYPTION_KEYS = [KEY_B]  # the old key is removed
    api_client.force_login(auditor)
    for r in (run, newer):
        body = api_client.get(f"/api/diagnosis/{r.session_id}/trace/reasoning?runId={r.run_id}").json()
        assert all(rec["contentReadable"] for rec in body["records"])
        assert REASONING_MARKER in body["records"][0]["reasoningContent"]


def test_rows_under_a_removed_key_are_unreadable_but_never_break_reads(
    api_client, auditor, user, settings, caplog
):
    run = make_recorded_run(user)
    settings.REASONING_ENCRYPTION_KEYS = [KEY_B]  # A removed without rotating first
    with caplog.at_level(logging.WARNING):
        row = AgentReasoningAudit.objects.filter(run_id=run.run_id).first()
        assert isinstance(row.reasoning_content, Ciphertext)
        assert REASONING_MARKER not in str(row.reasoning_content)
        api_client.force_login(auditor)
        response = api_client.get(f"/api/diagnosis/{run.session_id}/trace/reasoning?runId={run.run_id}")
    assert response.status_code == 200
    records = response.json()["records"]
    assert all(r["contentReadable"] is False and r["reasoningContent"] is None for r in records)
    assert "undecryptable" in caplog.text and KEY_A not in caplog.text and KEY_B not in caplog.text

    before = _raw_rows()
    row.save()  # saving a row loaded with unreadable content keeps the stored token
    assert _raw_rows() == before
    with pytest.raises(CommandError, match="no longer configured"):
        call_command("rotate_reasoning_keys", stdout=io.StringIO())
    assert _raw_rows() == before

    settings.REASONING_ENCRYPTION_KEYS = [KEY_B, KEY_A]  # the key comes back: rotation completes
    report = rotate_reasoning_keys()
    assert report.rotated == 2 and report.unreadable == 0


def _insert_legacy_plaintext(run):
    table = connection.ops.quote_name("agent_reasoning_audit")
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (session_id, run_id, step_index, agent_name, reasoning_available, "
            "reasoning_content, assistant_text, content_source, content_bytes, created_at) "
            "VALUES (%s, %s, 99, 'diagnosis_agent', %s, %s, %s, 'PROVIDER_REASONING', 10, %s)",
            [run.session_id, run.run_id, True, f"legacy {REASONING_MARKER}", None, run.created_at],
        )


def test_legacy_plaintext_reads_and_rotation_encrypts_it(user):
    # A run recorded before row digests (no chain binds its rows): its plaintext row is encrypted.
    run = services.create_run(session=services.create_session(owner=user), query="before digests")
    _insert_legacy_plaintext(run)
    legacy = AgentReasoningAudit.objects.get(step_index=99)
    assert legacy.reasoning_content == f"legacy {REASONING_MARKER}"
    report = rotate_reasoning_keys()
    assert (report.scanned, report.encrypted, report.rotated) == (1, 1, 0)
    assert all(v.startswith("fernet:") and REASONING_MARKER not in v for v in _raw_values())
    assert AgentReasoningAudit.objects.get(step_index=99).reasoning_content == f"legacy {REASONING_MARKER}"


def test_the_migration_encrypts_plaintext_rows(user):
    from importlib import import_module

    migration = import_module("reasoning.migrations.0002_encrypt_reasoning_content")
    run = make_recorded_run(user)
    _insert_legacy_plaintext(run)
    before = {pk: (r, a) for pk, r, a in _raw_rows()}

    class Editor:
        pass

    editor = Editor()
    editor.connection = connection
    migration.encrypt_plaintext_rows(None, editor)
    after = {pk: (r, a) for pk, r, a in _raw_rows()}
    legacy_pk = AgentReasoningAudit.objects.get(step_index=99).pk
    assert after[legacy_pk][0].startswith("fernet:") and after[legacy_pk][1] is None
    assert {pk: v for pk, v in after.items() if pk != legacy_pk} == {
        pk: v for pk, v in before.items() if pk != legacy_pk
    }  # encrypted rows untouched
    assert AgentReasoningAudit.objects.get(pk=legacy_pk).reasoning_content.startswith("legacy")


def test_without_keys_in_production_nothing_is_written_in_plaintext(user, settings):
    settings.REASONING_ENCRYPTION_KEYS = []
    settings.REASONING_DEV_KEY_FILE = None
    with pytest.raises(crypto.EncryptionKeysMissing):
        crypto.keyring()
    with pytest.raises(crypto.EncryptionKeysMissing), transaction.atomic():
        AgentReasoningAudit.objects.create(
            session_id="s", run_id="r", step_index=1, agent_name="a", reasoning_available=True,
            reasoning_content="secret", content_bytes=6, created_at=user.date_joined,
        )  # fmt: skip
    assert _raw_values() == []


# --------------------------------------------------------------------------------------------------
# System check and the development key
# --------------------------------------------------------------------------------------------------
def _reasoning_errors():
    from reasoning.checks import check_encryption_keys

    return [e.id for e in check_encryption_keys()]


def test_the_system_check_requires_keys_when_debug_is_off(settings):
    settings.DEBUG = False
    settings.REASONING_ENCRYPTION_KEYS = []
    assert _reasoning_errors() == ["reasoning.E001"]
    with pytest.raises(SystemCheckError, match=r"reasoning\.E001"):
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())
    settings.REASONING_ENCRYPTION_KEYS = [KEY_A, "not-a-key"]
    assert _reasoning_errors() == ["reasoning.E002"]
    settings.REASONING_ENCRYPTION_KEYS = [KEY_A]
    assert _reasoning_errors() == []
    settings.DEBUG = True
    settings.REASONING_ENCRYPTION_KEYS = []
    assert _reasoning_errors() == []


def test_check_deploy_fails_in_a_production_process_without_keys(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REASONING_ENCRYPTION_KEYS", "DJANGO_SETTINGS_MODULE", "PYTHONPATH")
    }
    # Set explicitly (empty) so that a developer's .env file cannot supply keys to this process.
    env.update(DEBUG="false", SECRET_KEY="x" * 60, ALLOWED_HOSTS="localhost", REASONING_ENCRYPTION_KEYS="")
    manage = Path(django_settings.BASE_DIR) / "manage.py"
    result = subprocess.run(
        [sys.executable, str(manage), "check", "--deploy"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "reasoning.E001" in result.stderr
    # With keys the same check passes: test_the_system_check_requires_keys_when_debug_is_off (in process).


def test_the_development_key_is_generated_once_and_reused(settings, tmp_path, user):
    key_file = tmp_path / ".local" / "reasoning-encryption.key"
    settings.REASONING_ENCRYPTION_KEYS = []
    settings.REASONING_DEV_KEY_FILE = key_file
    make_recorded_run(user)
    assert key_file.exists() and (key_file.stat().st_mode & 0o777) == 0o600
    key = key_file.read_text().strip()
    assert all(v.startswith(f"fernet:{crypto.key_id(key)}:") for v in _raw_values())
    crypto._dev_key.cache_clear()  # as a new process would
    assert crypto.configured_keys() == [key]
    assert REASONING_MARKER in AgentReasoningAudit.objects.first().reasoning_content
    assert list(tmp_path.joinpath(".local").iterdir()) == [key_file]  # no temporary file left behind
