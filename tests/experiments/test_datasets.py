"""Datasets from real runs (issue 34 item 3), on runs the demo model executed through the real runtime:
a dataset from a filter (every run reviewed `incorrect` in a date range) by command and by the run list's
action over the filtered list, the run page's link, versions that are append-only, JSON Lines export
and import (command and admin download), the read-only admin; and an experiment started from the
dataset admin, whose results page lists the items."""

from __future__ import annotations

import datetime as dt
import html as markup
import io
import json
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from agent.runtime.demo import DemoModelClient
from audit.write.reviews import record_review
from diagnosis.models import DiagnosisRun
from experiments.datasets import add_runs
from experiments.models import Dataset, DatasetItem, Experiment
from tests.agent.runtime.support import ask
from tests.surfaces.admin.support import grant_console

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools", "demo")]

RUNBOOKS = Path(django_settings.BASE_DIR) / "runbooks"
QUESTIONS = [
    "The disk is full on /var/log and services fail with 'No space left on device'.",
    "Nginx returns 502 Bad Gateway after the deploy.",
    "Redis is evicting keys because used memory reached maxmemory.",
    "Pods are in CrashLoopBackOff after the rollout.",
]


@pytest.fixture
def demo(settings):
    settings.LLM_PROVIDER = "demo"
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())


@pytest.fixture
def runs(user):
    client = DemoModelClient(delta_delay=0)
    return [ask(user, q, client=client)[0] for q in QUESTIONS]


@pytest.fixture
def reviewer(django_user_model):
    person = django_user_model.objects.create_user("rev", password="pw-rev-1", is_staff=True)
    grant_console(person)
    person.groups.add(Group.objects.get(name="Reviewers"))
    for codename in ("add_dataset", "add_experiment", "view_dataset", "view_experiment"):
        person.user_permissions.add(Permission.objects.get(codename=codename))
    return person


def _review(runs, reviewer):
    record_review(run=runs[0], user=reviewer, verdict="incorrect", note="wrong command")
    record_review(run=runs[2], user=reviewer, verdict="incorrect")
    record_review(run=runs[1], user=reviewer, verdict="correct")


def test_a_dataset_from_a_filter_keeps_its_items_and_versions_are_append_only(runs, reviewer, tmp_path):
    _review(runs, reviewer)
    today = timezone.now().date()
    out = io.StringIO()
    since, until = str(today - dt.timedelta(days=30)), str(today + dt.timedelta(days=1))
    call_command(
        "make_dataset",
        "wrong answers",
        "--verdict",
        "incorrect",
        "--since",
        since,
        "--until",
        until,
        stdout=out,
    )
    assert "wrong answers v1: 2 items" in out.getvalue()
    v1 = Dataset.objects.get(name="wrong answers", version=1)
    items = list(v1.items.order_by("position"))
    assert [i.source_run_id for i in items] == [runs[0].run_id, runs[2].run_id]
    first = items[0]
    assert first.question == runs[0].query and first.reference == runs[0].content and first.reference
    assert (
        first.release_decision == runs[0].release_decision
        and first.config_fingerprint == runs[0].config_fingerprint
    )
    assert [(r["verdict"], r["reviewer"], r["note"]) for r in first.reviews] == [
        ("incorrect", "rev", "wrong command")
    ]
    # Out of the date range: nothing.
    with pytest.raises(Exception, match="None of these runs"):
        call_command(
            "make_dataset", "old", "--verdict", "incorrect", "--until", str(today - dt.timedelta(days=1))
        )

    # A new version: v1's items copied, the new run after them; v1 untouched.
    v2 = add_runs(name="wrong answers", runs=[runs[3], runs[0]], by="rev")
    assert (v2.version, v2.parent_id, v2.item_count) == (2, v1.pk, 3)
    assert list(v1.items.values_list("source_run_id", flat=True)) == [runs[0].run_id, runs[2].run_id]
    assert list(v2.items.order_by("position").values_list("source_run_id", flat=True)) == [
        runs[0].run_id,
        runs[2].run_id,
        runs[3].run_id,
    ]
    # Nothing new: no empty version.
    assert add_runs(name="wrong answers", runs=[runs[3]]).pk == v2.pk

    # JSON Lines out and in.
    path = tmp_path / "wrong.jsonl"
    call_command("export_dataset", "wrong answers", "--output", str(path), stderr=io.StringIO())
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [line["sourceRunId"] for line in lines] == [runs[0].run_id, runs[2].run_id, runs[3].run_id]
    assert lines[0]["reviews"][0]["verdict"] == "incorrect" and lines[0]["version"] == 2
    out = io.StringIO()
    call_command("import_dataset", "copy", str(path), stdout=out)
    assert "copy v1: 3 items" in out.getvalue()
    copied = Dataset.objects.get(name="copy")
    assert [(i.question, i.reference, i.reviews) for i in copied.items.order_by("position")] == [
        (i.question, i.reference, i.reviews) for i in v2.items.order_by("position")
    ]


def test_the_console_adds_the_filtered_list_and_the_admin_is_read_only(runs, reviewer):
    _review(runs, reviewer)
    client = Client()
    client.force_login(reviewer)
    changelist = reverse("admin:diagnosis_diagnosisrun_changelist")
    listed = client.get(changelist, {"review_verdict": "incorrect"}).content.decode()
    assert runs[0].run_id in listed and runs[2].run_id in listed and runs[1].run_id not in listed
    # The action over the whole filtered list ("select all"): the form, then the new version.
    form = client.post(
        changelist + "?review_verdict=incorrect",
        {"action": "add_to_dataset", "select_across": "1", "_selected_action": [runs[0].pk]},
    )
    assert form.status_code == 200
    page = form.content.decode()
    assert "2 runs will be added" in page and runs[2].run_id in page and runs[1].run_id not in page
    done = client.post(
        reverse("admin:diagnosis_diagnosisrun_add_to_dataset"),
        {"run": [runs[0].run_id, runs[2].run_id], "name": "reviewed incorrect", "note": "March"},
    )
    dataset = Dataset.objects.get(name="reviewed incorrect")
    assert done.status_code == 302 and done["Location"] == reverse(
        "admin:experiments_dataset_change", args=[dataset.pk]
    )
    assert dataset.item_count == 2 and dataset.created_by == "rev" and dataset.note == "March"

    # The run page links the form for its run.
    run_page = client.get(reverse("admin:diagnosis_diagnosisrun_change", args=[runs[3].pk])).content.decode()
    assert f"datasets/add/?run={runs[3].run_id}" in run_page and 'id="dc-config-link"' in run_page
    assert (
        runs[3].run_id
        in client.get(
            reverse("admin:diagnosis_diagnosisrun_add_to_dataset"), {"run": runs[3].run_id}
        ).content.decode()
    )

    # Read-only admin; the download is the export.
    assert client.get(reverse("admin:experiments_dataset_add")).status_code == 403
    item = DatasetItem.objects.filter(dataset=dataset).first()
    change = client.post(
        reverse("admin:experiments_datasetitem_change", args=[item.pk]), {"question": "edited"}
    )
    assert change.status_code in (403, 200) and DatasetItem.objects.get(pk=item.pk).question == runs[0].query
    assert client.get(reverse("admin:experiments_dataset_delete", args=[dataset.pk])).status_code == 403
    download = client.get(reverse("admin:experiments_dataset_jsonl", args=[dataset.pk]))
    body = b"".join(download.streaming_content).decode()
    assert download["Content-Disposition"].startswith("attachment;")
    assert [json.loads(line)["sourceRunId"] for line in body.splitlines()] == [runs[0].run_id, runs[2].run_id]

    # Without the permission to add datasets: refused.
    plain = Client()
    staff = type(reviewer).objects.create_user("viewer", password="pw-viewer-1", is_staff=True)
    plain.force_login(grant_console(staff))
    assert plain.get(reverse("admin:diagnosis_diagnosisrun_add_to_dataset")).status_code == 403


def test_an_experiment_from_the_dataset_admin_and_its_results_page(runs, reviewer, tmp_path, settings):
    dataset = add_runs(name="two", runs=runs[:2], by="rev")
    client = Client()
    client.force_login(reviewer)
    url = reverse("admin:experiments_dataset_experiment", args=[dataset.pk])
    refused = client.post(url, {"candidate": '{"temperature": 1}'})
    assert refused.status_code == 200 and "unknown key" in refused.content.decode()
    terse = "You answer tersely from the runbooks, citing [kb:<slug>#<n>] ids."
    started = client.post(
        url, {"name": "terse prompt", "candidate": json.dumps({"prompts": {"agent": terse}})}
    )
    experiment = Experiment.objects.get(name="terse prompt")
    assert started.status_code == 302
    page = client.get(started["Location"]).content.decode()
    assert "terse prompt" in page and 'id="aggregate"' in page and markup.escape(terse) in page
    replays = list(experiment.replays.values_list("run_id", flat=True))
    assert len(replays) == 2 and all(replays)
    assert set(DiagnosisRun.objects.filter(run_id__in=replays).values_list("purpose", flat=True)) == {
        "experiment"
    }
    for run_id in replays:
        assert run_id in page


def test_an_imported_secret_is_redacted_before_the_item_and_its_replay_store_it(user):
    """A JSON Lines file is pasted text: its question and reference are redacted before the item is
    written (the same key by the same placeholder in both), and a replay's session and run carry only
    the placeholder."""
    from agent.runtime.candidate import Candidate
    from diagnosis.models import ChatSession
    from experiments.datasets import import_jsonl
    from experiments.runner import run_experiment

    key = "AKIA" + "QQQQ7XZ2B6JTKPL3"
    line = json.dumps({"question": f"Is {key} still valid?", "reference": f"Rotate {key} today."})
    dataset = import_jsonl(name="pasted", lines=[line], by="rev")
    item = dataset.items.get()
    placeholder = "[REDACTED:aws-access-key#1]"
    assert key not in item.question + item.reference
    assert placeholder in item.question and placeholder in item.reference
    experiment = run_experiment(dataset=dataset, candidate=Candidate.from_mapping({}), user=user, name="x")
    replay = DiagnosisRun.objects.get(run_id=experiment.replays.get().run_id)
    assert key not in replay.query and placeholder in replay.query
    title = ChatSession.objects.get(session_id=replay.session_id).title
    assert key not in title and placeholder in title
