"""Incremental and parallel verification (issue 49 items 1 and 2): `verify_audit` continues from a signed
state file kept outside the database and verifies only what changed since, yet a forged, edited or stale
state file, or a database changed under its watermarks, never lets it skip anything; `--workers N` prints
what `--workers 1` prints; `--json` sums it up for cron and CI."""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from audit.models import AgentStep, Checkpoint, LogNode, TraceEvent
from audit.transparency import keys
from audit.transparency.log import checkpoint
from audit.verify import incremental
from tests.audit.insertion import forge_event
from tests.factories import make_recorded_run


def _verify(*args) -> tuple[bool, str]:
    out = io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=out)
    except CommandError as exc:
        return False, out.getvalue() + f"\n{exc}"
    return True, out.getvalue()


def _newest() -> int:
    return Checkpoint.objects.order_by("-tree_size").values_list("tree_size", flat=True).first()


def _summary(*args) -> dict:
    out = io.StringIO()
    with contextlib.suppress(CommandError):
        call_command("verify_audit", "--json", *args, stdout=out)
    return json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.fixture
def state(tmp_path):
    path = tmp_path / "verify-state.json"
    with override_settings(AUDIT_SIGNING_KEYS=[keys.generate_key_text()], AUDIT_VERIFY_STATE_PATH=str(path)):
        yield path


@pytest.mark.django_db
def test_it_continues_from_the_state_and_verifies_only_what_changed(user, state):
    old = [make_recorded_run(user) for _ in range(3)]
    checkpoint()
    first = _summary()
    assert first["mode"] == "full" and first["ok"] and first["stateWritten"]
    assert first["runs"]["verified"] == 3
    written = json.loads(state.read_text())
    assert written["checkpoint"]["body"] == Checkpoint.objects.order_by("-tree_size").first().body

    size = _newest()
    new = make_recorded_run(user)  # finished, not anchored yet: verified
    again = _summary()
    assert again["mode"] == "incremental" and again["since"] == size and again["ok"]
    assert again["runs"]["verified"] == 1
    checkpoint()
    ok, out = _verify()
    assert ok and "verified 1 run(s): 1 ok" in out
    assert f"from checkpoint {size} on (consistency proven)" in out
    assert new.run_id not in out and old[0].run_id not in out

    # An event appended to an old, verified run (a new row above the watermark) puts it back in.
    forge_event(old[1].run_id, "REVIEW_RECORDED", {"verdict": "correct"}, note=False)
    ok, out = _verify()
    assert not ok and f"run={old[1].run_id} INVALID" in out and "verified 1 run(s)" in out
    # --all verifies everything.
    assert "verified 4 run(s)" in _verify("--all")[1]


@pytest.mark.django_db
def test_a_forged_or_edited_state_file_verifies_everything_and_fails(user, state):
    runs = [make_recorded_run(user) for _ in range(2)]
    checkpoint()
    assert _verify()[0]
    document = json.loads(state.read_text())

    # Raise the watermarks so that a forged row would look verified: the signature no longer verifies.
    document["watermarks"] = {t: [m[0] + 1000, m[1]] for t, m in document["watermarks"].items()}
    state.write_text(json.dumps(document))
    ok, out = _verify()
    assert not ok and "state INVALID the state file: its signature does not verify" in out
    assert "verified 2 run(s)" in out  # everything, not nothing

    # A state signed by a key of the attacker's own.
    with override_settings(AUDIT_SIGNING_KEYS=[keys.generate_key_text()]):
        incremental.write_state(str(state), incremental.State(document["checkpoint"]["body"], "", {}, ""))
    ok, out = _verify()
    assert not ok and "signed by unknown key" in out and "verified 2 run(s)" in out

    # A correctly signed state whose checkpoint is not the one the database holds (a checkpoint forged or
    # a log cut back): named, everything verified.
    cp = Checkpoint.objects.get()
    marks = incremental.watermarks()
    incremental.write_state(
        str(state), incremental.State(cp.body, cp.signature, marks, "", cp.link, cp.link_signature)
    )
    Checkpoint.objects.filter(pk=cp.pk).update(body=cp.body.replace("\n", "\n\n", 1))
    ok, out = _verify()
    assert not ok and f"the verified checkpoint tree_size={cp.tree_size} differs in the database" in out
    assert runs[0].run_id not in out.split("state INVALID")[0]


@pytest.mark.django_db
def test_a_row_deleted_under_the_watermarks_makes_it_a_full_verification(user, state):
    runs = [make_recorded_run(user) for _ in range(3)]
    checkpoint()
    assert _verify()[0]
    AgentStep.objects.filter(pk=AgentStep.objects.filter(run_id=runs[0].run_id).first().pk).delete()
    ok, out = _verify()
    assert "state NOTE rows deleted or inserted under the last verification's watermarks" in out
    assert not ok and f"run={runs[0].run_id} " in out and "verified 3 run(s)" in out


@pytest.mark.django_db
def test_a_changed_node_of_the_verified_tree_is_caught_by_the_consistency_check(user, state):
    make_recorded_run(user)
    make_recorded_run(user)
    checkpoint()
    assert _verify()[0]
    size = _newest()
    make_recorded_run(user)
    checkpoint()
    LogNode.objects.filter(level=1, node_index=0).update(hash="00" * 32)
    ok, out = _verify()
    assert not ok and f"verified checkpoint tree_size={size}: the stored tree no longer makes" in out


@pytest.mark.django_db
def test_since_a_tree_size_and_its_limits(user, state):
    make_recorded_run(user)
    checkpoint()
    size = _newest()
    later = make_recorded_run(user)
    checkpoint()
    ok, out = _verify("--since", str(size))
    assert ok and "verified 1 run(s)" in out and "no watermarks" in out
    assert later.run_id not in out
    assert _verify("--since", "77")[1].endswith("no checkpoint of tree size 77")


@pytest.mark.django_db(transaction=True)
def test_workers_print_what_one_process_prints(user, state):
    runs = [make_recorded_run(user) for _ in range(5)]
    checkpoint()
    TraceEvent.objects.filter(run_id=runs[2].run_id, sequence_no=3).update(summary="edited")
    AgentStep.objects.filter(run_id=runs[4].run_id).update(finish_reason="edited")
    LogNode.objects.filter(level=1, node_index=0).update(hash="00" * 32)  # found by the log's process
    one = _verify("--all", "--workers", "1", "--batch-size", "2")
    two = _verify("--all", "--workers", "2", "--batch-size", "2")
    assert not one[0] and one == two
    assert f"run={runs[2].run_id} INVALID" in one[1] and f"run={runs[4].run_id} INVALID" in one[1]
    assert "log INVALID log node level 1 index 0 (leaves 0–1) does not match its leaves" in one[1]


@pytest.mark.django_db(transaction=True)
def test_work_in_the_background_runs_in_a_process_of_its_own_or_here(user):
    from audit.verify import parallel

    here = os.getpid()
    forked = parallel.others_can_read()  # not on SQLite's in-memory test database: only this process sees it
    assert (parallel.in_background(os.getpid, enabled=True)() != here) is forked
    assert parallel.in_background(os.getpid, enabled=False)() == here
    assert parallel.in_background(lambda: Checkpoint.objects.count(), enabled=True)() == 0
    ran = []

    def failing() -> None:
        ran.append(os.getpid())
        raise ValueError("met here")

    with pytest.raises(ValueError, match="met here"):
        parallel.in_background(failing, enabled=True)()
    assert ran == [here]  # the forked process's failure, run again in this one


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_line_is_drawn_on_a_terminal_only(monkeypatch):
    from django.core.management.base import OutputWrapper

    from audit.management.commands.verify_audit import Progress

    monkeypatch.delenv("CI", raising=False)
    terminal, pipe = _Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        progress = Progress(OutputWrapper(stream), 4)
        for done in range(1, 5):
            progress.tick(done)
        progress.done()
    drawn = terminal.getvalue()
    assert "4/4 runs" in drawn and "runs/s" in drawn and "ETA" in drawn
    assert pipe.getvalue() == ""  # cron, CI, a pipe: nothing but the lines and the summary


@pytest.mark.django_db
def test_the_watermarks_are_checked_and_taken_in_one_statement_as_the_orm_counts_them(user, state):
    from django.db.models import Count, Max

    runs = [make_recorded_run(user) for _ in range(2)]
    old = incremental.watermarks()
    make_recorded_run(user)
    AgentStep.objects.filter(pk=AgentStep.objects.filter(run_id=runs[0].run_id).first().pk).delete()
    tallies = incremental._tallies(old)
    for table, model in incremental._watermarked():
        agg = model.objects.aggregate(top=Max("pk"), rows=Count("pk"))
        above = model.objects.filter(pk__gt=old[table][0]).count()
        assert tallies[table] == (int(agg["top"] or 0), agg["rows"], above), table
    assert incremental.watermarks(tallies) == incremental.watermarks()
    # Only the table with the deleted row is named, by the ORM's count up to its watermark.
    table = AgentStep._meta.db_table
    top, rows = old[table]
    up_to = AgentStep.objects.filter(pk__lte=top).count()
    assert up_to == rows - 1
    assert incremental.watermark_problems(old, tallies) == [
        f"{table}: {rows} row(s) up to id {top} were verified, {up_to} are stored"
    ]
    assert incremental.watermark_problems(old) == incremental.watermark_problems(old, tallies)


@pytest.mark.django_db(transaction=True)
def test_with_workers_each_table_is_counted_in_a_statement_of_its_own_on_its_own_connection(
    user, state, monkeypatch
):
    import threading

    from audit.verify import parallel

    runs = [make_recorded_run(user) for _ in range(2)]
    checkpoint()
    assert _summary("--workers", "2")["stateWritten"]
    old = json.loads(state.read_text())["watermarks"]
    make_recorded_run(user)
    AgentStep.objects.filter(pk=AgentStep.objects.filter(run_id=runs[0].run_id).first().pk).delete()
    calls: list[tuple[str, int]] = []
    select = incremental._select

    def spy(alias, selects, params, *, close=False):
        calls.append((threading.current_thread().name, len(selects)))
        return select(alias, selects, params, close=close)

    monkeypatch.setattr(incremental, "_select", spy)
    one = incremental._tallies(old)
    assert calls == [(threading.current_thread().name, 3 * len(incremental._watermarked()))]
    calls.clear()
    assert incremental._tallies(old, connections_n=3) == one
    if parallel.others_can_read():  # MariaDB; SQLite's in-memory test database: one statement here
        assert len(calls) == len(incremental._watermarked())
        assert all(name.startswith("verify-tally") and n == 3 for name, n in calls)
    # The deleted step is found the same way: the verification is a full one, and its run fails.
    summary = _summary("--workers", "2")
    assert summary["mode"] == "full" and not summary["ok"]
    assert runs[0].run_id in json.dumps(summary["problems"])


@pytest.mark.django_db
def test_runs_below_the_unanchored_floor_are_not_searched_again_and_the_floor_is_signed(
    user, state, monkeypatch
):
    import base64

    from audit.models import LogLeaf
    from diagnosis.models import DiagnosisRun

    anchored = [make_recorded_run(user) for _ in range(2)]
    checkpoint()
    waiting = make_recorded_run(user)  # finished, not anchored yet
    assert _verify()[0]
    assert json.loads(state.read_text())["unanchoredFrom"] == waiting.pk  # every run below it anchored

    searched: list[int] = []
    search = incremental.unanchored
    monkeypatch.setattr(
        incremental, "unanchored", lambda from_pk=0: searched.append(from_pk) or search(from_pk)
    )
    checkpoint()  # anchors it
    ok, out = _verify()
    assert ok and searched == [waiting.pk] and f"run={waiting.run_id}" not in out
    top = DiagnosisRun.objects.order_by("-pk").values_list("pk", flat=True).first()
    assert json.loads(state.read_text())["unanchoredFrom"] == top + 1  # none left: the next run's id on

    # The floor is signed: removed or lowered, the state does not verify and everything is verified.
    document = json.loads(state.read_text())
    for edit in ({"unanchoredFrom": 0}, {}):
        changed = {k: v for k, v in document.items() if k != "unanchoredFrom"} | edit
        state.write_text(json.dumps(changed))
        ok, out = _verify()
        assert not ok and "its signature does not verify" in out and "verified 3 run(s)" in out

    # A state written before the floor existed (signed without it) still verifies: every run searched.
    payload = {k: document[k] for k in ("format", "checkpoint", "watermarks", "verifiedAt")}
    key = keys.current_key()
    signature = base64.b64encode(key.private.sign(incremental._message(payload))).decode("ascii")
    state.write_text(json.dumps({**payload, "keyId": key.key_id, "signature": signature}))
    searched.clear()
    summary = _summary()
    assert summary["mode"] == "incremental" and summary["ok"] and searched == [0]

    # A leaf of a run below the floor deleted (the run no longer anchored): the leaves' watermark fails,
    # and the full verification finds the leaf missing.
    LogLeaf.objects.filter(run_id=anchored[0].run_id).delete()
    summary = _summary()
    assert summary["mode"] == "full" and not summary["ok"]
    assert "log INVALID log leaf index 0 missing" in json.dumps(summary["problems"])


@pytest.mark.django_db
def test_a_run_anchored_after_the_watermarks_stays_searched_until_a_watermark_covers_its_leaf(
    user, state, monkeypatch
):
    """A leaf appended while a verification runs (after its watermarks were taken) is above the leaves'
    watermark: deleted before the next verification, no count notices. So the floor never passes a
    run that only such a leaf anchors, and the next verification finds the run without its leaf."""
    from audit.models import LogLeaf

    make_recorded_run(user)
    checkpoint()
    late = make_recorded_run(user)  # finished, waiting to be anchored
    during: list = []
    take = incremental.watermarks

    def then_anchor(*args, **kwargs):
        marks = take(*args, **kwargs)
        if not during:  # the first verification: the run is anchored after its watermarks were taken
            during.append(checkpoint())
        return marks

    monkeypatch.setattr(incremental, "watermarks", then_anchor)
    assert _verify()[0]
    assert LogLeaf.objects.filter(run_id=late.run_id).exists()
    assert json.loads(state.read_text())["unanchoredFrom"] <= late.pk
    written = state.read_text()
    # The next verification's watermarks cover the leaf: its floor passes the run.
    assert _verify()[0]
    assert json.loads(state.read_text())["unanchoredFrom"] > late.pk
    # From the first state, with the leaf deleted (above that state's watermark: no count changes), the
    # run is searched and found without its leaf.
    state.write_text(written)
    LogLeaf.objects.filter(run_id=late.run_id).delete()
    summary = _summary()
    assert summary["mode"] == "incremental" and summary["runs"]["verified"] == 1
    assert summary["runs"]["unanchored"] == 1
