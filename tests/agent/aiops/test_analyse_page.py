"""The admin's "Analyse an alert" page (surfaces/admin/analyse.py) on the real Alertmanager the suite
starts (its Prometheus rule `servers.ALERT_NAME` fires from the first scrape): the firing alert is listed
and picked, a pasted alert and a described one start analyses, each through the API's own service, and
each answer is a redirect to the chat page of the new session; bad input is the page again with its
error and nothing written. And the README's example phrasing names its alert: the stored row, and the
silence the demo executor proposes, are on `alertname="HighLatency"`, not "—" / "unknown"; the run
page of that interrupted run says "waiting for approval", not "audit incomplete"."""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from agent.aiops import intake
from agent.runtime import approval_queue, approvals, supervisor
from agent.runtime.llm import aclose_clients
from agent.runtime.worker import work
from diagnosis.models import AgentFlow, AiOpsAlert, DiagnosisRun, RunStatus
from tests.agent.aiops import servers
from tests.agent.aiops.test_approvals import _expire_new_silences  # noqa: F401 (autouse fixture)
from tests.surfaces.admin.support import grant_console

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("aiops_settings")]
URL = "/admin/diagnosis/diagnosisrun/analyse/"
README_EXAMPLE = "HighLatency firing on api: p99 above 2 s"  # README.md, "AI Ops analyses"
RUNBOOKS = Path(django_settings.BASE_DIR) / "runbooks"


@pytest.fixture
def console(staff_user):
    client = Client()
    client.force_login(grant_console(staff_user))
    return client


def _started(response, staff_user) -> DiagnosisRun:
    """The run a POST started: the redirect goes to the chat page of its session, owned by the user."""
    assert response.status_code == 302, response.content.decode()[:2000]
    target = urlsplit(response["Location"])
    assert target.path == "/chat/"
    session_id = parse_qs(target.query)["session"][0]
    run = DiagnosisRun.objects.select_related("session").get(session_id=session_id)
    assert run.session.owner_id == staff_user.pk
    assert (run.agent_flow, run.status) == (AgentFlow.AI_OPS, RunStatus.PENDING)
    return run


def _firing_fingerprint(html: str) -> str:
    marker = 'data-fingerprint="'
    assert marker in html, html
    return html.split(marker, 1)[1].split('"', 1)[0]


def test_a_firing_alert_of_the_real_alertmanager_is_listed_picked_and_analysed(console, staff_user):
    # The rule fires from Prometheus' first scrape; reaching Alertmanager takes a moment more.
    deadline = time.monotonic() + servers.ALERT_DEADLINE
    while (
        servers.ALERT_NAME not in (html := console.get(URL).content.decode()) and time.monotonic() < deadline
    ):
        time.sleep(0.25)
    assert servers.ALERT_NAME in html and "Prometheus takes time to scrape itself" in html
    fingerprint = _firing_fingerprint(html)
    run = _started(console.post(URL, {"mode": "firing", "firing-fingerprint": fingerprint}), staff_user)
    alert = AiOpsAlert.objects.get(run_id=run.run_id)
    assert (alert.source, alert.alertname, alert.severity) == ("staff", servers.ALERT_NAME, "warning")
    assert alert.labels["job"] == "prometheus"  # as Alertmanager holds it, not as the browser sent it
    assert servers.ALERT_NAME in run.query and "Prometheus takes time to scrape itself" in run.query
    # An alert that is not (or no longer) firing: the page again, with the reason, and nothing started.
    again = console.post(URL, {"mode": "firing", "firing-fingerprint": "0000000000000000"})
    assert again.status_code == 400 and "no longer firing" in again.content.decode()
    assert AiOpsAlert.objects.count() == 1


def test_a_pasted_alert_and_a_described_one_start_analyses(console, staff_user):
    pasted = {
        "version": "4",
        "status": "firing",
        "commonLabels": {"job": "api"},
        "alerts": [
            {"status": "resolved", "labels": {"alertname": "Old"}},
            {
                "status": "firing",
                "labels": {"alertname": "HighLatency", "severity": "critical", "instance": "api-1"},
                "annotations": {"summary": "p99 above 2 s"},
                "startsAt": "2026-12-03T10:00:00Z",
            },
        ],
    }
    run = _started(console.post(URL, {"mode": "paste", "paste-alert_json": json.dumps(pasted)}), staff_user)
    alert = AiOpsAlert.objects.get(run_id=run.run_id)
    assert (alert.alertname, alert.severity) == ("HighLatency", "critical")
    assert alert.labels == {
        "alertname": "HighLatency",
        "severity": "critical",
        "instance": "api-1",
        "job": "api",
    }
    assert "since 2026-12-03T10:00:00Z" in run.query and "summary: p99 above 2 s" in run.query

    described = {
        "mode": "simple",
        "simple-alertname": "DiskFull",
        "simple-severity": "warning",
        "simple-labels": "instance=db-2\njob = node",
        "simple-annotations": "summary=/var is 97% full\ndescription: grows 2 GB an hour",
    }
    run = _started(console.post(URL, described), staff_user)
    alert = AiOpsAlert.objects.get(run_id=run.run_id)
    assert alert.labels == {"alertname": "DiskFull", "severity": "warning", "instance": "db-2", "job": "node"}
    assert alert.annotations == {"summary": "/var is 97% full", "description": "grows 2 GB an hour"}


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"mode": "paste", "paste-alert_json": "{not json"}, "This is not JSON"),
        ({"mode": "paste", "paste-alert_json": '{"annotations": {}}'}, "An alert is an object with labels"),
        ({"mode": "paste", "paste-alert_json": '{"labels": {"alertname": 3}}'}, "is not a string"),
        ({"mode": "simple", "simple-alertname": "high latency"}, "A name of letters, digits"),
        (
            {"mode": "simple", "simple-alertname": "X", "simple-labels": "no separator"},
            "write it as name=value",
        ),
        ({"mode": "firing"}, "Pick one of the firing alerts."),
    ],
)
def test_what_is_not_an_alert_is_the_page_again_with_its_error(console, data, error):
    response = console.post(URL, data)
    assert response.status_code == 400
    assert error in response.content.decode()
    assert not DiagnosisRun.objects.exists()


def test_without_an_alertmanager_the_page_says_so_and_the_other_forms_still_work(
    console, staff_user, settings
):
    settings.ALERTMANAGER_URL = ""
    html = console.get(URL).content.decode()
    assert "No Alertmanager is configured (ALERTMANAGER_URL)" in html
    _started(console.post(URL, {"mode": "simple", "simple-alertname": "DiskFull"}), staff_user)


def test_the_page_is_linked_from_the_admin_index_and_has_the_run_admins_access_rule(
    user, staff_user, console
):
    assert URL in console.get("/admin/").content.decode()
    assert Client().get(URL).status_code == 302  # anonymous: to the login
    client = Client()
    client.force_login(user)  # not staff
    assert client.get(URL).status_code == 302
    client.force_login(staff_user.__class__.objects.create_user("bare", password="pw", is_staff=True))
    assert client.get(URL).status_code == 403  # staff without the run admin's view permission
    assert client.post(URL, {"mode": "simple", "simple-alertname": "DiskFull"}).status_code == 403
    assert not DiagnosisRun.objects.exists()


def test_the_readme_example_names_its_alert(staff_user):
    call_command("aiops", README_EXAMPLE, "--queue", "--user", staff_user.username, stdout=io.StringIO())
    alert = AiOpsAlert.objects.get()
    assert (alert.alertname, alert.annotations) == ("HighLatency", {"summary": README_EXAMPLE})
    assert alert.run.query == README_EXAMPLE  # the person's words are the question, as given
    # A text without an alert's name stays a question: no name is made up for it.
    run = intake.start_staff_analysis(user=staff_user, alert="Why is checkout slow since the deploy?")
    assert run.aiops_alert.alertname == ""


@pytest.mark.usefixtures("chat_settings", "runtime_pools")
def test_the_readme_example_asking_for_a_silence_proposes_one_on_its_alert(staff_user):
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())
    text = README_EXAMPLE + ". Please silence it for 30 minutes while we look."
    run_id = intake.start_staff_analysis(user=staff_user, alert=text).run_id

    async def drain() -> int:
        try:
            return await work(launch=supervisor.launch, concurrency=1, poll_interval=0.05, until_idle=True)
        finally:
            await supervisor.stop_background()
            await aclose_clients()

    asyncio.run(drain())
    run = DiagnosisRun.objects.get(run_id=run_id)
    assert run.status == RunStatus.INTERRUPTED, (run.status, run.error_code)
    (waiting,) = approval_queue.waiting_in_run(run_id=run_id)
    assert waiting.tool_name == "create_silence"
    arguments = waiting.arguments if isinstance(waiting.arguments, dict) else json.loads(waiting.arguments)
    (matcher,) = arguments["matchers"]
    assert (matcher["name"], matcher["value"], matcher["isRegex"]) == ("alertname", "HighLatency", False)
    assert AiOpsAlert.objects.get(run_id=run_id).alertname == "HighLatency"
    # Its run page says it waits for a person, not that its audit is incomplete (it is not finished).
    client = Client()
    client.force_login(grant_console(staff_user))
    page = client.get(reverse("admin:diagnosis_diagnosisrun_change", args=[run.pk])).content.decode()
    assert 'id="dc-audit-waiting">waiting for approval<' in page
    assert 'id="dc-audit-alert"' not in page and "audit incomplete" not in page
    # The approvals page: one heading, times people read (minute precision, how long ago / how long left).
    approver = staff_user.__class__.objects.create_user("approver", password="pw", is_staff=True)
    approver.groups.add(Group.objects.get(name=approvals.APPROVERS_GROUP))
    client.force_login(approver)
    listing = client.get(reverse("admin:diagnosis_diagnosisrun_approvals")).content.decode()
    assert run_id in listing and listing.count("Tool calls waiting for approval</h1>") == 1
    row = listing.split(run_id, 1)[1].split("</tr>", 1)[0]
    assert " ago)" in row and "(in " in row and "T" not in row.split("<time", 2)[1].split(">", 1)[1][:16]
    assert "1</b> tool call waits for a decision" in client.get("/admin/").content.decode()


@pytest.mark.parametrize("alertmanager_url", ["", "http://127.0.0.1:9/"])
def test_a_firing_pick_with_no_alert_to_pick_still_says_what_is_wrong(console, settings, alertmanager_url):
    """With no Alertmanager, or one that cannot be read, the page has no list to pick from, yet a POST of
    the firing form (a stale tab, a list emptied since it was drawn) still shows its error, not a bare 400."""
    settings.ALERTMANAGER_URL = alertmanager_url
    for data, error in (
        ({"mode": "firing"}, "Pick one of the firing alerts."),
        ({"mode": "firing", "firing-fingerprint": "0000000000000000"}, "no longer firing"),
    ):
        response = console.post(URL, data)
        assert response.status_code == 400
        html = response.content.decode()
        assert error in html and 'id="dc-firing-note"' in html
    assert AiOpsAlert.objects.count() == 0
