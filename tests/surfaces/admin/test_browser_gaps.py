"""The "Unanswered questions" page in a real headless Chromium (Debian's /usr/bin/chromium) against the
live server: staff reach it from the admin index, see the uncovered questions the demo model blocked
grouped under their terms with the closest runbook, follow a run's link to its run page, and the page
passes axe-core (`tests/accessibility.py`). Database-agnostic; marked `browser` like the other pages."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect, sync_playwright

from tests.accessibility import assert_accessible
from tests.browser import launch_chromium, requires_chromium
from tests.evaluations.test_gaps import OFF_TOPIC, UNCOVERED, _ask, _small_corpus
from tests.surfaces.admin.support import grant_console
from tests.surfaces.admin.test_browser import ARTIFACTS, _log_in

# The page's queries and rows are tested on both databases (tests/evaluations/test_gaps.py); like every
# browser test, scripts/test.sh runs this once, in the MariaDB half (tests/conftest.py).
pytestmark = [pytest.mark.browser, requires_chromium]


@pytest.fixture
def asked(transactional_db, chat_settings, runtime_pools, user, staff_user, tmp_path):
    grant_console(staff_user)
    _small_corpus(tmp_path / "kb")
    return [_ask(user, q) for q in UNCOVERED[:2]], _ask(user, OFF_TOPIC[0])


def test_staff_see_the_questions_no_runbook_answers(asked, live_server):
    blocked, _off_topic = asked
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = _log_in(browser, live_server, "staff", "pw-staff-1")
            page.goto(f"{live_server.url}/admin/")
            page.locator("#dc-gaps-link a").click()
            expect(page.locator("h1")).to_have_text("Unanswered questions")
            rows = page.locator("#dc-gaps tbody tr[data-gap]")
            expect(rows).to_have_count(2)
            first = rows.first
            expect(first.locator("th")).to_contain_text("saml")
            expect(first).to_contain_text("blocked 2")
            expect(first.locator(".dc-gap-statement")).to_contain_text("No runbook covers “")
            expect(rows.nth(1)).to_contain_text("out of scope 1")
            expect(page.locator("#dc-gaps-summary")).to_contain_text("3 runs")
            assert_accessible(page, "unanswered questions")
            page.screenshot(path=str(ARTIFACTS / "unanswered-questions.png"), full_page=True)
            first.get_by_role("link", name=blocked[0].run_id).click()
            expect(page.locator("h1")).to_contain_text(blocked[0].run_id)
        finally:
            browser.close()
