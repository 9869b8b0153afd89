"""Evidence bundles: exported by `manage.py export_evidence`, verified offline by `python -m
audit.verify_bundle` in a process without Django settings; no reasoning in them; any changed record,
a wrong key, an unanchored run or a store the attacker rewrote fails and says where."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from audit.models import Checkpoint, ToolInvocation
from audit.transparency import bundle, keys, log, note, signednote
from audit.transparency.evidence import build_bundle
from audit.write.reasoning_changes import purge_reasoning
from core import writeauth
from tests.audit.transparency.support import finished_runs, legacy_checkpoints, rewrite_tool_output
from tests.factories import REASONING_MARKER

pytestmark = pytest.mark.django_db

BASE_DIR = Path(settings.BASE_DIR)


@pytest.fixture
def anchored_run(user, signing_key):
    runs = finished_runs(user, 3, tools=2)
    log.checkpoint()
    return runs[1]


def _public():
    return keys.current_key().public


def _offline(path: Path, *keys_text: str) -> subprocess.CompletedProcess:
    """`python -m audit.verify_bundle` in a process with no Django settings in its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "DATABASE", "AUDIT_", "DEBUG"))}
    env["PYTHONPATH"] = str(BASE_DIR)
    args = [arg for key in keys_text for arg in ("--public-key", key)]
    return subprocess.run(
        [sys.executable, "-m", "audit.verify_bundle", str(path), *args],
        cwd=path.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_exported_bundle_verifies_offline_without_django(anchored_run, tmp_path):
    path = tmp_path / "evidence.json"
    err = io.StringIO()
    call_command("export_evidence", anchored_run.run_id, "--output", str(path), stderr=err)
    assert "anchored" in err.getvalue()
    text = path.read_text(encoding="utf-8")
    assert REASONING_MARKER not in text and "fernet:" not in text  # not even the ciphertext
    data = json.loads(text)
    assert len(data["rows"]["reasoning"]) == 2 and set(data["rows"]["reasoning"][0]) == {
        "stepIndex",
        "agentName",
        "digest",
    }
    public = note.public_text(_public())
    done = _offline(path, public)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK chain: 17 event(s), sequence 1..17, every hash recomputed" in done.stdout
    # 2 model steps, 2 tool rows, 2 reasoning rows (digests only), the terminal summary.
    assert (
        "OK rows: 9 record(s) match the digests their chain binds" in done.stdout
    )  # with the run's identity and session
    assert "OK anchor: leaf 1 recomputed from the chain" in done.stdout
    # Which write key authenticated the run, as the signed leaf says (checking the tag needs the key).
    key = writeauth.verifier().current.key_id
    assert f"OK write authentication: the signed leaf says the service verified write key {key}'s tag" in (
        done.stdout
    )
    assert f"VERIFIED run {anchored_run.run_id}" in done.stdout
    # The key may also be given as a file holding it.
    (tmp_path / "log.pub").write_text(public + "\n")
    assert _offline(path, str(tmp_path / "log.pub")).returncode == 0

    # What the verifier imports pulls in no Django at all.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, audit.verify_bundle; "
            "bad = sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('django', 'rest_framework', 'config')); "
            "print(bad); sys.exit(1 if bad else 0)",
        ],
        cwd=tmp_path,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(BASE_DIR)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stdout + probe.stderr


def test_a_one_byte_change_fails_and_says_where(anchored_run, tmp_path):
    text = json.dumps(build_bundle(run=anchored_run), indent=1)
    path = tmp_path / "evidence.json"
    public = note.public_text(_public())

    at = text.index('"output_preview": "') + len('"output_preview": "')
    path.write_text(text[:at] + ("y" if text[at] != "y" else "z") + text[at + 1 :])
    done = _offline(path, public)
    assert done.returncode == 1
    assert "FAIL rows.tools[0] (tool call call_0): the record does not match its digest" in done.stdout
    assert "NOT VERIFIED" in done.stdout

    at = text.index('"summary": "') + len('"summary": "')
    path.write_text(text[:at] + ("Q" if text[at] != "Q" else "R") + text[at + 1 :])
    done = _offline(path, public)
    assert done.returncode == 1 and "FAIL events[0] (sequence 1): hash does not match" in done.stdout

    path.write_text(text[:-3] + text[-2:])  # a byte of the structure: no longer JSON
    done = _offline(path, public)
    assert done.returncode == 1 and "FAIL bundle: not JSON" in done.stdout


def test_every_changed_value_of_the_bundle_is_caught(anchored_run):
    """Change one character at a time across the whole bundle (every 5th position, the records and the
    anchor): whatever still parses and means something else must fail."""
    original = build_bundle(run=anchored_run)
    text = json.dumps(original, separators=(",", ":"))
    public = [_public()]
    assert bundle.verify(json.loads(text), public).ok
    checked = 0
    for at in range(0, len(text), 5):
        ch = text[at]
        replacement = "1" if ch == "0" else "0" if ch.isdigit() else "b" if ch == "a" else "a"
        try:
            changed = json.loads(text[:at] + replacement + text[at + 1 :])
        except ValueError:
            continue
        if changed == original:
            continue
        checked += 1
        report = bundle.verify(changed, public)
        assert not report.ok, f"a change at {at} ({text[max(0, at - 30) : at + 30]!r}) was not caught"
    assert checked > 1000


def test_a_wrong_key_and_an_unanchored_run_fail(user, anchored_run, tmp_path):
    other = note.load_private(keys.generate_key_text()).public_key()
    report = bundle.verify(build_bundle(run=anchored_run), [other])
    origin = note.parse_note_body(Checkpoint.objects.order_by("-tree_size").first().body).origin
    signer = note.note_key_id(origin, keys.current_key().public)
    assert report.failures == [
        f"anchor.checkpoint: signed by key {signer}, not by a key given ({note.note_key_id(origin, other)})"
    ]
    late = finished_runs(user, 1)[0]
    report = bundle.verify(build_bundle(run=late), [_public()])
    assert report.failures == ["anchor: the run is not anchored in the transparency log yet"]
    assert any(line.startswith("rows:") for line in report.passed)  # its records still verify


def test_reasoning_purged_after_anchoring_still_verifies(anchored_run):
    assert purge_reasoning(run_id=anchored_run.run_id) == 2
    report = bundle.verify(build_bundle(run=anchored_run), [_public()])
    assert report.ok, report.failures
    assert len([n for n in report.notes if "content purged by governance" in n]) == 2


def test_the_bundle_of_a_rewritten_or_incomplete_store_fails_like_verify_audit(user, anchored_run):
    rewrite_tool_output(anchored_run, preview="another result")
    report = bundle.verify(build_bundle(run=anchored_run), [_public()])
    assert report.failures == ["anchor.leafData: differs from the chain up to sequence 17 (chainHead)"]

    other = finished_runs(user, 1)[0]
    log.checkpoint()
    tool = ToolInvocation.objects.filter(run_id=other.run_id).order_by("id").first()
    terminal = other.events.filter(details__toolCallId=tool.tool_call_id, status="SUCCEEDED").get()
    tool.delete()
    report = bundle.verify(build_bundle(run=other), [_public()])
    assert [f for f in report.failures if "missing" in f] == [
        f"rows: tool call {tool.tool_call_id} bound at sequence {terminal.sequence_no} is missing"
    ]


def test_the_bundle_proves_who_asked_what(anchored_run):
    """The run's question and its session's owner travel in the bundle as the records RUN_STARTED binds:
    a question changed in the store (or in the bundle) fails offline, and names where."""
    from diagnosis.models import DiagnosisRun

    built = build_bundle(run=anchored_run)
    start = built["rows"]["identity"]["start"]
    assert start["form"]["form"] == "run-start" and start["form"]["row"]["query"] == anchored_run.query
    assert built["rows"]["identity"]["session"]["form"]["form"] == "session"
    assert bundle.verify(json.loads(json.dumps(built)), [_public()]).ok

    edited = json.loads(json.dumps(built))
    edited["rows"]["identity"]["start"]["form"]["row"]["query"] = "Delete every log file"
    report = bundle.verify(edited, [_public()])
    assert any(
        f.startswith("rows.identity.start") and "does not match its digest" in f for f in report.failures
    )

    DiagnosisRun.objects.filter(pk=anchored_run.pk).update(query="Delete every log file")
    report = bundle.verify(build_bundle(run=DiagnosisRun.objects.get(pk=anchored_run.pk)), [_public()])
    assert any(
        f.startswith("rows.identity.start") and "differs from the one bound" in f for f in report.failures
    )


def test_a_bundle_of_an_old_format_checkpoint_still_verifies(anchored_run):
    legacy_checkpoints()
    data = build_bundle(run=anchored_run)
    assert set(data["anchor"]["checkpoint"]) == {"body", "signature"}
    report = bundle.verify(data, [_public()])
    assert report.ok, report.failures
    log.checkpoint()  # nothing waiting: still the old-format checkpoint
    assert bundle.verify(build_bundle(run=anchored_run), [_public()]).ok


def test_a_bundle_carries_its_checkpoint_as_a_signed_note(anchored_run):
    data = build_bundle(run=anchored_run)
    text = data["anchor"]["checkpoint"]["note"]
    body, signatures = signednote.split_note(text)
    assert signednote.parse_checkpoint(body).tree_size == data["anchor"]["treeSize"]
    assert [s.name for s in signatures] == [note.parse_note_body(body).origin]
    # Witness-ready (issue 50): a plain checkpoint, and its time and predecessor in a signed link.
    assert body.count("\n") == 3 and set(data["anchor"]["checkpoint"]) == {"note", "link"}
    link = data["anchor"]["checkpoint"]["link"]
    changed = json.loads(json.dumps(data))
    changed["anchor"]["checkpoint"]["link"] = link.replace("signed-at 2", "signed-at 1", 1)
    report = bundle.verify(changed, [_public()])
    assert report.failures == ["anchor.checkpoint.signature: checkpoint link signature does not verify"]
    del changed["anchor"]["checkpoint"]["link"]
    report = bundle.verify(changed, [_public()])
    assert any("checkpoint has no link" in f for f in report.failures), report.failures
