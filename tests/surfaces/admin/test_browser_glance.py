"""The console read at a glance (issue 50, item 4), in headless Chromium (Debian's /usr/bin/chromium):
on a laptop's first screen (1280 × 800) the run list shows its first run, its filters folded into one
line that names those in use; every column has a header that says what its cells hold; a run waiting
for approval shows its arguments as formatted JSON and its times in the reader's own time zone. axe-core
stays clean on each page. Screenshots go to `test-artifacts/` (git-ignored)."""

from __future__ import annotations

import datetime as dt
import json
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect, sync_playwright

from agent.runtime import approvals
from audit.models import ToolInvocation
from surfaces.admin.evaluation_views import SCORE_EXPLAINED
from tests.accessibility import assert_accessible
from tests.browser import launch_chromium, requires_chromium
from tests.factories import make_waiting_approval
from tests.surfaces.admin.support import grant_console
from tests.surfaces.admin.test_browser import ARTIFACTS, TIMEOUT_MS, _in_thread, runs  # noqa: F401 (fixture)

pytestmark = [pytest.mark.browser, requires_chromium]
VIEWER_ZONE = "Pacific/Auckland"  # far from the server's (UTC in tests): a local time reads differently


@pytest.fixture
def browser(runs):  # noqa: F811
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        try:
            yield chromium
        finally:
            chromium.close()


def _log_in(context, live_server, username: str, password: str):
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    expect(page.locator("#user-tools")).to_contain_text(username)
    return page


def test_the_first_run_is_on_a_laptops_first_screen_and_every_column_says_what_it_holds(
    browser,
    live_server,
    runs,  # noqa: F811
):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = _log_in(context, live_server, "staff", "pw-staff-1")
    page.goto(f"{live_server.url}/admin/diagnosis/diagnosisrun/")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(3)
    first = rows.first.bounding_box()
    assert first is not None and first["y"] + first["height"] <= 800, f"the first run row is at {first}"
    summary = page.locator("#dc-run-filters > summary")
    expect(summary).to_contain_text("none in use")
    expect(page.locator("#changelist-filter")).to_be_hidden()
    page.screenshot(path=str(ARTIFACTS / "admin-run-list-1280x800.png"))

    headers = page.locator("#result_list thead th:not(.action-checkbox-column)")
    assert headers.count() == 14
    for i in range(headers.count()):
        header = headers.nth(i)
        text = header.inner_text().strip()
        title = header.locator("abbr[title]").first.get_attribute("title") or ""
        assert text and len(title) > len(text), (i, text, title)
    score = headers.filter(has_text="eval score")
    expect(score).to_have_count(1)
    expect(score.locator("abbr")).to_have_attribute("title", SCORE_EXPLAINED)
    assert_accessible(page, "the run list, filters folded")

    summary.click()
    page.locator("#changelist-filter").get_by_role("link", name="Blocked", exact=True).click()
    expect(rows).to_have_count(1)
    # The filters stay open after the reload the filter caused (for this tab), and name the one in use.
    expect(page.locator("#changelist-filter")).to_be_visible()
    expect(summary).to_contain_text("1 in use: release decision")
    assert_accessible(page, "the run list, filters open")
    context.close()


@pytest.fixture
def waiting(runs, user, django_user_model):  # noqa: F811
    approver = django_user_model.objects.create_user("approver", password="pw-approver-1", is_staff=True)
    approver.groups.add(Group.objects.get(name=approvals.APPROVERS_GROUP))
    grant_console(approver)
    run, call_id = make_waiting_approval(user)
    return run, call_id


def test_the_approval_card_shows_formatted_arguments_and_the_readers_local_times(
    waiting, browser, live_server
):
    run, call_id = waiting
    call = _in_thread(lambda: ToolInvocation.objects.get(run_id=run.run_id, tool_call_id=call_id))
    context = browser.new_context(viewport={"width": 1280, "height": 900}, timezone_id=VIEWER_ZONE)
    page = _log_in(context, live_server, "approver", "pw-approver-1")
    page.goto(f"{live_server.url}/admin/diagnosis/diagnosisrun/{run.pk}/change/")
    card = page.locator(f"#approval-{call_id}")
    expect(card).to_be_visible()
    arguments = card.locator("pre.dc-approval-args")
    shown = json.dumps(call.input_params, indent=2, ensure_ascii=False, sort_keys=True)
    assert arguments.inner_text() == shown
    assert "{'" not in card.inner_text()  # no Python repr
    requested = card.locator("time.dc-local").first
    iso = requested.get_attribute("datetime")
    at = dt.datetime.fromisoformat(iso).astimezone(ZoneInfo(VIEWER_ZONE))
    expect(requested).to_have_text(at.strftime("%Y-%m-%d %H:%M"), use_inner_text=True)
    local = at.strftime("%Y-%m-%d %H:%M:%S")
    expect(requested).to_have_attribute("title", f"{local} your time ({VIEWER_ZONE}); {iso}")
    page.screenshot(path=str(ARTIFACTS / "admin-approval-card.png"), full_page=True)
    assert_accessible(page, "the run page with an approval waiting")
    context.close()
