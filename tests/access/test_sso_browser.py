"""Single sign-on in a real headless Chromium (Debian's, through Playwright) against the live server and
the OpenID provider process of `tests/oidc_server.py`: the login page's "Sign in with Test IdP" button
leads through the provider (its own sign-in page) and back, the user lands on the admin signed in with the
groups the provider asserted; with `LOCAL_PASSWORD_LOGIN=breakglass` the page says passwords are for
break-glass accounts and refuses a normal user's right password. "Log out" ends the provider's session
too (its cookie in this real browser), so the next sign-in at this "shared computer" shows the
provider's password page again. Screenshots go to `test-artifacts/` (git-ignored)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect, sync_playwright

from tests.access.conftest import CLIENT_ID, CLIENT_SECRET, OP_PASSWORD, alice
from tests.access.test_stepup_browser import _in_thread
from tests.browser import launch_chromium, requires_chromium

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TIMEOUT_MS = 15_000

pytestmark = [pytest.mark.browser, requires_chromium]


def test_sign_in_with_the_identity_provider_in_a_browser(
    transactional_db,
    settings,
    live_server,
    oidc,
    staff_user,
):
    settings.LOCAL_PASSWORD_LOGIN = "breakglass"
    settings.BREAK_GLASS_USERNAMES = ["root"]
    oidc.configure(
        client={
            "id": CLIENT_ID,
            "secret": CLIENT_SECRET,
            "redirect_uris": [f"{live_server.url}/oidc/callback/"],
            "post_logout_redirect_uris": [f"{live_server.url}/oidc/signed-out/"],
        },
        user=alice(groups=["sre-oncall", "change-board"]),
    )
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(f"{live_server.url}/admin/")  # → the login page, next=/admin/
            expect(page.locator("#sso-login")).to_contain_text("break-glass")
            # A normal user's right password is refused, with the way in.
            page.fill("#id_username", "staff")
            page.fill("#id_password", "pw-staff-1")
            page.click("input[type=submit]")
            expect(page.locator(".errornote")).to_contain_text("Password sign-in is turned off")
            page.screenshot(path=str(ARTIFACTS / "sso-breakglass-refused.png"), full_page=True)

            page.click("#sso-login-button")  # → the provider's sign-in page
            _sign_in_at_the_provider(page)  # → the callback → /admin/
            page.wait_for_url(f"{live_server.url}/admin/")
            expect(page.locator("#user-tools")).to_contain_text("Alice")  # her given_name
            page.screenshot(path=str(ARTIFACTS / "sso-signed-in.png"), full_page=True)

            # Log out: this service, then the provider's end_session_endpoint, back to the signed-out page.
            page.locator("#logout-form button").click()
            page.wait_for_url(lambda url: url.startswith(f"{live_server.url}/oidc/signed-out/?state="))
            expect(page.locator("#signed-out-message")).to_have_text(
                "You are signed out of this service and of Test IdP."
            )
            page.screenshot(path=str(ARTIFACTS / "sso-signed-out.png"), full_page=True)
            # The next person at this computer: the provider asks for the password again.
            page.click("#signed-out-sign-in")
            expect(page.locator("#op-password")).to_be_visible()
        finally:
            browser.close()
    user = _in_thread(lambda: get_user_model().objects.get(username="alice"))
    groups = _in_thread(lambda: set(user.groups.values_list("name", flat=True)))
    assert groups == {"Staff viewers", "Approvers"} and user.is_staff


def _sign_in_at_the_provider(page) -> None:
    expect(page.locator("h1")).to_have_text("Sign in to the Test IdP")
    page.fill("#op-username", "alice")
    page.fill("#op-password", OP_PASSWORD)
    page.click("#op-submit")
