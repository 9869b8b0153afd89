"""Separate credentials in a real headless Chromium (issue 45 item 4): an auditor's password mistyped
until it is locked out leaves their integration's API token and their signed-in session's TOTP step-up
working from the same address, and a code entered a second time is called "already used", with the
tries left on the codes' own counter."""

from __future__ import annotations

import html
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.db import connection
from django.test import Client
from playwright.sync_api import expect, sync_playwright

from tests.browser import launch_chromium, requires_chromium
from tests.factories import issue_token, totp_code, totp_device

TIMEOUT_MS = 15_000
LIMIT = 5

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


def _session_cookie(user, url: str) -> dict:
    """A signed-in session of `user` (as after an earlier sign-in), as a browser cookie."""
    client = Client()
    client.force_login(user)
    return {"name": "sessionid", "value": client.cookies["sessionid"].value, "url": url}


def test_a_locked_password_leaves_the_token_and_the_step_up_working_and_a_reused_code_is_named(
    transactional_db, settings, live_server, auditor
):
    settings.LOCKOUT_FAILURE_LIMIT = LIMIT
    device = totp_device(auditor)
    token = issue_token(auditor)
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            for _ in range(LIMIT):
                page.goto(f"{live_server.url}/admin/login/")
                page.fill("#id_username", "auditor")
                page.fill("#id_password", "not-the-password")
                page.click("input[type=submit]")
            text = html.unescape(page.content())
            assert "with this account's password from this address" in text and "Try again in" in text

            # The integration from the same address was never refused.
            sessions = httpx.get(
                f"{live_server.url}/api/diagnosis/sessions/",
                headers={"Authorization": f"Token {token}"},
                timeout=20,
            )
            assert sessions.status_code == 200, sessions.text

            # A session signed in before keeps its step-up: the right code verifies it.
            code = _in_thread(lambda: totp_code(device))
            first = browser.new_context()
            first.add_cookies([_in_thread(lambda: _session_cookie(auditor, live_server.url))])
            verify = first.new_page()
            verify.goto(f"{live_server.url}/admin/verify-otp/")
            verify.fill("#id_otp_token", code)
            verify.click("#dc-otp-form button[type=submit]")
            verify.wait_for_url(f"{live_server.url}/admin/")

            # The same code in another session: already used, counted on the codes' own counter.
            second = browser.new_context()
            second.add_cookies([_in_thread(lambda: _session_cookie(auditor, live_server.url))])
            again = second.new_page()
            again.goto(f"{live_server.url}/admin/verify-otp/")
            again.fill("#id_otp_token", code)
            again.click("#dc-otp-form button[type=submit]")
            error = again.locator("#dc-otp-error")
            expect(error).to_contain_text("That code was already used")
            expect(error).to_contain_text(f"{LIMIT - 1} tries left before this account's authenticator codes")
            assert "not valid" not in error.inner_text()
        finally:
            browser.close()
