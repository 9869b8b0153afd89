"""The admin's step-up in a real headless Chromium (Playwright, Debian's /usr/bin/chromium): with
`REASONING_REQUIRE_OTP` on, an auditor who logged in with a password is asked for a TOTP code instead
of being shown reasoning (in words for a browser user, no server command); after entering the code the
browser returns to the run page's panel, which loads by itself (the step-up page said what the code is
for, and the run page confirms it), and only that read is logged.
Screenshots go to `test-artifacts/` (git-ignored)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection
from playwright.sync_api import expect, sync_playwright

from reasoning.models import ReasoningAccessLog
from surfaces.admin.stepup import VERIFIED_MESSAGE
from tests.accessibility import assert_accessible
from tests.browser import launch_chromium, requires_chromium
from tests.factories import REASONING_MARKER, totp_code, totp_device
from tests.surfaces.admin.support import grant_console, make_blocked_run

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TIMEOUT_MS = 15_000

pytestmark = [pytest.mark.browser, requires_chromium]


def _in_thread(fn):
    """A database call outside Playwright's event loop (Django refuses sync ORM calls inside one)."""

    def call():
        try:
            return fn()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


def test_auditor_verifies_a_totp_code_before_the_reasoning_panel_opens(
    transactional_db, settings, live_server, user, auditor
):
    settings.REASONING_REQUIRE_OTP = True
    grant_console(auditor)
    device = totp_device(auditor)
    run = make_blocked_run(user)
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(f"{live_server.url}/admin/login/")
            page.fill("#id_username", "auditor")
            page.fill("#id_password", "pw-auditor-1")
            page.click("input[type=submit]")
            expect(page.locator("#user-tools")).to_contain_text("auditor")

            page.goto(f"{live_server.url}/admin/diagnosis/diagnosisrun/{run.pk}/change/")
            page.click("#dc-reasoning-load")
            otp = page.locator("#dc-otp-required")
            expect(otp).to_contain_text("second factor")
            expect(otp).to_contain_text("authenticator app")
            assert "manage.py" not in otp.inner_text() and "issue_token" not in otp.inner_text()
            assert REASONING_MARKER not in page.content()
            assert not _in_thread(ReasoningAccessLog.objects.exists)
            page.screenshot(path=str(ARTIFACTS / "admin-reasoning-otp-required.png"), full_page=True)

            page.click("#dc-verify-otp")
            purpose = page.locator("#dc-otp-purpose")  # the page says what the code is for
            expect(purpose).to_contain_text("reasoning")
            expect(purpose).to_contain_text("authenticator app")
            expect(purpose).to_contain_text("until you sign out")
            assert_accessible(page, "the TOTP step-up page")
            page.fill("#id_otp_token", _in_thread(lambda: totp_code(device)))
            page.screenshot(path=str(ARTIFACTS / "admin-verify-otp.png"))
            page.click("#dc-otp-form button[type=submit]")
            # Back on the run page at its reasoning panel, which loads by itself: no second click.
            page.wait_for_url(f"**/admin/diagnosis/diagnosisrun/{run.pk}/change/#reasoning")
            expect(page.locator("ul.messagelist li.success")).to_have_text(VERIFIED_MESSAGE)  # confirmed
            records = page.locator("#dc-reasoning-records")
            expect(records).to_contain_text(REASONING_MARKER)
            expect(records).to_contain_text("This read was logged")
            assert "load=reasoning" not in page.url  # a reload does not read (and log) it again
            page.reload()
            expect(page.locator("#dc-reasoning-load")).to_be_visible()
        finally:
            browser.close()
    (entry,) = _in_thread(lambda: list(ReasoningAccessLog.objects.all()))
    assert entry.username == "auditor" and entry.channel == "ADMIN" and entry.run_id == run.run_id
