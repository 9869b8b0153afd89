"""The admin run page renders the released answer as the chat page does (headless Chromium): Markdown that
reads well, nothing the model wrote runs, and a citation opens its runbook chunk, highlighted."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from playwright.sync_api import expect, sync_playwright

from diagnosis import services
from tests.browser import launch_chromium, requires_chromium
from tests.factories import record_full_run
from tests.surfaces.admin.support import grant_console

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"
TIMEOUT_MS = 15_000
HOSTILE_ANSWER = (
    "The replica lags behind a long transaction [kb:mysql-replication-lag#3].\n\n"
    "- Check `SHOW SLAVE STATUS` <script>window.pwned = 1; alert('script')</script>\n"
    "- Compare positions <img src=x onerror=\"window.pwned = 2; alert('img')\">\n"
    "- [a trap](javascript:window.pwned=3) and **batch** large deletes [kb:mysql-replication-lag#4; "
    "kb:mysql-replication-lag#3]\n\n"
    "```sql\nSELECT 1; -- [kb:mysql-replication-lag#9]\n```"
)

pytestmark = [pytest.mark.browser, requires_chromium]


@pytest.fixture
def hostile_run(transactional_db, user, staff_user):
    grant_console(staff_user)
    call_command("load_knowledge", "runbooks", stdout=StringIO())
    run = services.create_run(session=services.create_session(owner=user), query="Replica lag on db-2?")
    record_full_run(run, answer=HOSTILE_ANSWER)
    run.refresh_from_db()
    assert run.content == HOSTILE_ANSWER
    return run


def test_the_run_page_renders_the_answer_inert_and_citations_open_their_chunk(hostile_run, live_server):
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            dialogs: list[str] = []
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.goto(f"{live_server.url}/admin/login/")
            page.fill("#id_username", "staff")
            page.fill("#id_password", "pw-staff-1")
            page.click("input[type=submit]")
            expect(page.locator("#user-tools")).to_contain_text("staff")

            page.goto(f"{live_server.url}/admin/diagnosis/diagnosisrun/{hostile_run.pk}/change/")
            answer = page.locator("#summary .dc-answer")
            expect(answer.locator("li")).to_have_count(3)
            expect(answer.locator("code").first).to_have_text("SHOW SLAVE STATUS")
            # What the model wrote as markup is shown as text and never runs.
            expect(answer).to_contain_text("<script>window.pwned = 1;")
            expect(answer).to_contain_text("<img src=x onerror=")
            page.wait_for_timeout(300)
            assert dialogs == []
            assert page.evaluate("typeof window.pwned") == "undefined"
            assert answer.locator("script, img, [onerror]").count() == 0
            assert page.evaluate("document.querySelectorAll('[onerror], [onload]').length") == 0
            assert answer.locator("a[href^='javascript']").count() == 0
            # Citations are links to the runbook view; a citation inside a code block stays code.
            citations = answer.locator("a.citation")
            expect(citations).to_have_count(3)
            assert (
                citations.nth(1).get_attribute("href") == "/knowledge/mysql-replication-lag/?chunk=4#chunk-4"
            )
            expect(answer.locator("pre code")).to_contain_text("[kb:mysql-replication-lag#9]")
            page.screenshot(path=str(ARTIFACTS / "admin-run-page-rendered-answer.png"), full_page=True)

            citations.first.click()
            page.wait_for_url("**/knowledge/mysql-replication-lag/?chunk=3#chunk-3")
            cited = page.locator("section.chunk.cited")
            expect(cited).to_have_count(1)
            expect(cited).to_have_attribute("id", "chunk-3")
            expect(cited).to_be_in_viewport()
            assert dialogs == []
        finally:
            browser.close()
