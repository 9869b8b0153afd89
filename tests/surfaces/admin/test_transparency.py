"""The transparency log in the admin: the run page says whether and where the run is anchored and offers
its evidence bundle; the checkpoint list shows each checkpoint's verification state and verifies the
whole log on request; the admin agrees with verify_audit and the bundle verifier."""

import json

import pytest
from django.test import Client
from django.urls import reverse

from audit.models import Checkpoint
from audit.transparency import bundle, keys, log, note
from tests.audit.transparency.support import delete_run, rewrite_tool_output
from tests.factories import REASONING_MARKER, make_recorded_run
from tests.surfaces.admin.support import grant_console

pytestmark = pytest.mark.django_db


@pytest.fixture
def console_staff(staff_user, settings):
    settings.AUDIT_SIGNING_KEYS = [keys.generate_key_text()]
    settings.AUDIT_VERIFY_KEYS = []
    client = Client()
    client.force_login(grant_console(staff_user))
    return client


def _run_url(run, view="change"):
    return reverse(f"admin:diagnosis_diagnosisrun_{view}", args=[run.pk])


def _anchor_cell(html):
    return html[html.index('id="dc-anchor"') :].split("</dd>")[0]


def test_the_run_page_shows_the_anchor_and_offers_the_bundle(console_staff, user):
    run = make_recorded_run(user)
    html = console_staff.get(_run_url(run)).content.decode()
    assert "not yet" in _anchor_cell(html) and 'id="dc-evidence-link"' in html
    log.checkpoint()
    cp = Checkpoint.objects.get()
    cell = _anchor_cell(console_staff.get(_run_url(run)).content.decode())
    assert "in the log" in cell and ">0<" in cell and f">{cp.tree_size}<" in cell
    assert cp.signed_at.strftime("%Y-%m-%d %H:%M:%S") in cell

    response = console_staff.get(_run_url(run, "evidence"))
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="evidence-{run.run_id}.json"'
    assert REASONING_MARKER not in response.content.decode()
    assert bundle.verify(json.loads(response.content), [keys.current_key().public]).ok


def test_a_run_rewritten_after_anchoring_shows_on_its_page(console_staff, user):
    run = make_recorded_run(user)
    log.checkpoint()
    rewrite_tool_output(run, preview="forged")
    html = console_staff.get(_run_url(run)).content.decode()
    assert "audit incomplete" in html
    assert "transparency log: anchored in log leaf 0: the chain head at sequence" in html
    report = bundle.verify(
        json.loads(console_staff.get(_run_url(run, "evidence")).content), [keys.current_key().public]
    )
    assert report.failures == [
        f"anchor.leafData: differs from the chain up to sequence {run.events.count()} (chainHead)"
    ]


def test_the_checkpoint_list_shows_verification_and_verifies_the_whole_log(console_staff, user):
    runs = [make_recorded_run(user) for _ in range(3)]
    log.checkpoint(batch_size=2)
    url = reverse("admin:audit_checkpoint_changelist")
    html = console_staff.get(url).content.decode()
    assert html.count("verified: signed by key") == 2

    # The newest: 3 runs, and the governance head (the console's staff user was given the staff flag
    # and "Staff viewers").
    forged = Checkpoint.objects.order_by("-tree_size").first()
    assert forged.tree_size == 4
    body = note.parse_note_body(forged.body, forged.link)
    changed = note.NoteBody(body.origin, body.tree_size, "cd" * 32, "", "", extended=False)
    Checkpoint.objects.filter(pk=forged.pk).update(body=changed.text(), root_hash=changed.root_hash)
    html = console_staff.get(url).content.decode()
    assert (
        "checkpoint link names another checkpoint" in html and "root does not match the stored tree" in html
    )

    delete_run(runs[0].run_id)
    response = console_staff.post(
        url, {"action": "verify_whole_log", "_selected_action": [forged.pk], "index": 0}, follow=True
    )
    text = response.content.decode()
    # (the admin capitalises each message)
    assert f"Anchored run {runs[0].run_id} (leaf 0) is missing from the store" in text
    assert "Checkpoint tree_size=4: checkpoint link names another checkpoint" in text
    # Read-only: nothing is added, changed or deleted here.
    assert console_staff.get(reverse("admin:audit_checkpoint_add")).status_code == 403
    assert console_staff.get(reverse("admin:audit_checkpoint_change", args=[forged.pk])).status_code == 200
