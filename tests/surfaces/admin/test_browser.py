"""The admin console in a real headless Chromium (Playwright, Debian's /usr/bin/chromium) against the live
server: a staff member finds a blocked run and understands it without seeing reasoning; an auditor loads
the reasoning panel and the read is logged. Screenshots go to `test-artifacts/` (git-ignored).

Playwright's sync API cannot run inside an asyncio loop, so these tests are plain sync functions.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection
from playwright.sync_api import expect, sync_playwright

from reasoning.models import AccessChannel, ReasoningAccessLog
from tests.browser import launch_chromium, requires_chromium
from tests.factories import REASONING_MARKER, make_recorded_run
from tests.surfaces.admin.support import (
    BLOCK_REASON,
    UNSUPPORTED_CLAIM,
    grant_console,
    make_blocked_run,
    make_run_with_unfinished_tool,
)

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"
TIMEOUT_MS = 15_000

pytestmark = [pytest.mark.browser, requires_chromium]


def _in_thread(fn):
    """Run a database read outside Playwright's event loop (Django refuses sync ORM calls inside one)."""

    def call():
        try:
            return fn()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


@pytest.fixture
def runs(transactional_db, user, staff_user, auditor):
    """Three runs and the two console users, all committed before the browser starts."""
    grant_console(staff_user)
    grant_console(auditor)
    return {
        "published": make_recorded_run(user, query="Why is MySQL replication lagging on db-2?"),
        "blocked": make_blocked_run(user),
        "failed": make_run_with_unfinished_tool(user),
    }


@pytest.fixture
def browser(runs):
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        try:
            yield chromium
        finally:
            chromium.close()


def _log_in(browser, live_server, username: str, password: str):
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    expect(page.locator("#user-tools")).to_contain_text(username)
    return page


def test_staff_finds_a_blocked_run_and_sees_why_without_reasoning(browser, live_server, runs):
    blocked = runs["blocked"]
    page = _log_in(browser, live_server, "staff", "pw-staff-1")

    page.goto(f"{live_server.url}/admin/diagnosis/diagnosisrun/")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(3)
    page.locator("#dc-run-filters > summary").click()  # the filters are folded by default
    page.locator("#changelist-filter").get_by_role("link", name="Blocked", exact=True).click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(blocked.run_id)
    expect(rows.first.locator(".field-release_chip")).to_have_text("blocked")
    page.screenshot(path=str(ARTIFACTS / "admin-staff-run-list-blocked.png"), full_page=True)

    page.get_by_role("link", name=blocked.run_id).click()
    expect(page.locator("h1")).to_contain_text(blocked.run_id)
    verdict = page.locator("#verdict")
    expect(verdict).to_contain_text("BLOCKED")
    expect(verdict).to_contain_text(BLOCK_REASON)
    expect(verdict).to_contain_text("UNKNOWN_CITATION")
    expect(verdict).to_contain_text(UNSUPPORTED_CLAIM)

    timeline = page.locator("#timeline tr.dc-ev")
    expect(timeline).to_have_count(blocked.expected_events)
    expect(timeline.first).to_contain_text("RUN_STARTED")
    expect(timeline.last).to_contain_text("RUN_FINISHED")
    expect(page.locator("#waterfall .dc-wf-bar")).to_have_count(5)  # router, 2 steps, tool, guard
    expect(page.locator("#waterfall .dc-wf-step")).to_have_count(2)
    expect(page.locator("#waterfall .dc-wf-tool")).to_have_count(1)
    ledger = page.locator("#tokens")
    expect(ledger).to_contain_text("not reconciled")
    expect(ledger.locator("table.dc-ledger-calls tbody tr")).to_have_count(4)
    expect(ledger).to_contain_text("not reported")
    expect(page.locator("#audit")).to_contain_text("complete")

    expect(page.locator("#reasoning")).to_have_count(0)
    expect(page.locator("#dc-reasoning-load")).to_have_count(0)
    assert REASONING_MARKER not in page.content()
    page.screenshot(path=str(ARTIFACTS / "admin-staff-run-page.png"), full_page=True)

    page.goto(f"{live_server.url}/admin/diagnosis/diagnosisrun/{runs['failed'].pk}/change/")
    expect(page.locator("#waterfall .dc-wf-unknown")).to_have_count(1)
    expect(page.locator("#waterfall")).to_contain_text("duration unknown")
    page.screenshot(path=str(ARTIFACTS / "admin-staff-run-page-unknown-tool.png"), full_page=True)
    assert not _in_thread(ReasoningAccessLog.objects.exists)


def test_auditor_opens_the_reasoning_panel_and_the_read_is_logged(browser, live_server, runs):
    blocked = runs["blocked"]
    page = _log_in(browser, live_server, "auditor", "pw-auditor-1")
    page.goto(f"{live_server.url}/admin/diagnosis/diagnosisrun/{blocked.pk}/change/")
    expect(page.locator("#verdict")).to_contain_text("BLOCKED")
    assert REASONING_MARKER not in page.content()
    assert not _in_thread(ReasoningAccessLog.objects.exists)

    page.click("#dc-reasoning-load")
    records = page.locator("#dc-reasoning-records")
    expect(records).to_be_visible()
    expect(records).to_contain_text(REASONING_MARKER)
    expect(records.locator("article.dc-reasoning-record")).to_have_count(2)
    expect(records).to_contain_text("This read was logged")
    expect(page.locator("#dc-reasoning-form")).to_be_hidden()
    page.evaluate("window.scrollTo(0, 0)")  # the section bar is sticky: keep it at the top of the picture
    page.screenshot(path=str(ARTIFACTS / "admin-auditor-reasoning.png"), full_page=True)

    (entry,) = _in_thread(lambda: list(ReasoningAccessLog.objects.all()))
    assert (entry.username, entry.run_id, entry.session_id) == ("auditor", blocked.run_id, blocked.session_id)
    assert entry.channel == AccessChannel.ADMIN and entry.records_returned == 2
    assert entry.client_address == "127.0.0.1" and "HeadlessChrome" in entry.user_agent
