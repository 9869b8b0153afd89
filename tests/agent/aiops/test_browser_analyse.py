"""Starting an AI Ops analysis from the browser, in headless Chromium (Debian's /usr/bin/chromium), on the
real stack: a Prometheus rule fires into the real Alertmanager; a staff user opens "Analyse an alert"
from the admin index, picks the firing alert from Alertmanager's list and sends it; the browser lands on
the chat page of the new analysis, which the daphne process's queue worker runs (demo provider, against
the live Prometheus and Alertmanager) while the page follows it, until the cited report is shown."""

from __future__ import annotations

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from playwright.sync_api import expect, sync_playwright

from diagnosis.models import AiOpsAlert, DiagnosisRun, RunStatus
from tests.agent.aiops import servers
from tests.agent.aiops.test_alert_to_report import product, wait_for  # noqa: F401 (fixture)
from tests.browser import launch_chromium, requires_chromium
from tests.surfaces.admin.support import grant_console
from tests.surfaces.chat.support import ARTIFACTS

pytestmark = [pytest.mark.browser, requires_chromium, pytest.mark.django_db(transaction=True)]
TIMEOUT_MS = 20_000
PASSWORD = "pw-staff-browser-1"


@pytest.mark.parametrize("product", ["demo"], indirect=True)
def test_staff_pick_a_firing_alert_and_follow_its_analysis_live(product, staff_user, monkeypatch):  # noqa: F811
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright keeps a loop on this thread
    grant_console(staff_user)
    # The server process hashes with the production hashers (the suite's fast MD5 is in-process only).
    staff_user.password = PBKDF2PasswordHasher().encode(PASSWORD, "browser-salt", iterations=1000)
    staff_user.save(update_fields=["password"])
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(f"{product.url}/admin/login/")
            page.fill("#id_username", staff_user.username)
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.locator("#dc-analyse-link").get_by_role("link", name="Analyse an alert").click()
            expect(page.locator("h1")).to_have_text("Analyse an alert")
            # The rule's alert reaches Alertmanager a moment after Prometheus' first scrape.
            row = page.locator("#dc-firing-alerts tbody tr").filter(has_text=servers.ALERT_NAME)

            def listed() -> bool:
                if row.count():
                    return True
                page.reload()
                return False

            wait_for(listed, timeout=servers.ALERT_DEADLINE, what="the firing alert in the list")
            row.first.get_by_role("radio").check()
            page.screenshot(path=str(ARTIFACTS / "aiops-analyse-form.png"), full_page=True)
            page.get_by_role("button", name="Analyse the selected alert").click()

            page.wait_for_url("**/chat/?session=*")
            alert = AiOpsAlert.objects.select_related("run").get(source="staff")
            assert (alert.alertname, alert.severity) == (servers.ALERT_NAME, "warning")
            assert alert.run.session.owner_id == staff_user.pk
            turn = page.locator(f".turn[data-run-id='{alert.run_id}']")
            turn.wait_for()
            expect(turn.locator(".question")).to_contain_text(servers.ALERT_NAME)
            wait_for(
                lambda: turn.get_attribute("data-finished") == "true", timeout=90, what="the live analysis"
            )
            run = DiagnosisRun.objects.get(run_id=alert.run_id)
            assert run.status == RunStatus.SUCCESS, (run.status, run.error_code)
            assert "[prom:" in run.content
            page.screenshot(path=str(ARTIFACTS / "aiops-analysis-in-chat.png"), full_page=True)
        finally:
            browser.close()
