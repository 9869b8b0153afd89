"""An AI Ops analysis as staff find it, in headless Chromium (Playwright, Debian's /usr/bin/chromium), on
the real stack: a Prometheus rule fires, Alertmanager notifies the webhook of a daphne process, whose
queue worker runs the analysis against the live servers (demo provider). A superuser opens the admin's
AI Ops analyses, filters by alert name, and opens the run page: the released, cited report, one lane per
agent in the waterfall, the plan decision in the timeline and the self-evaluation. Screenshots go to
`test-artifacts/` (docs/aiops.md shows them)."""

from __future__ import annotations

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from playwright.sync_api import expect, sync_playwright

from diagnosis.models import AiOpsAlert, DiagnosisRun
from tests.agent.aiops import servers
from tests.agent.aiops.test_alert_to_report import TOKEN, product, wait_for  # noqa: F401 (fixture)
from tests.browser import launch_chromium, requires_chromium
from tests.surfaces.chat.support import ARTIFACTS

pytestmark = [pytest.mark.browser, requires_chromium, pytest.mark.django_db(transaction=True)]
TIMEOUT_MS = 15_000
PASSWORD = "pw-root-browser-1"


@pytest.mark.parametrize("product", ["demo"], indirect=True)
def test_staff_find_an_alerts_analysis_and_read_its_cited_report(product, alertmanager_webhook, superuser):  # noqa: F811
    alertmanager_webhook(f"{product.url}/api/aiops/alertmanager", bearer_token=TOKEN)
    alert = wait_for(
        lambda: AiOpsAlert.objects.filter(alertname=servers.ALERT_NAME).first(),
        timeout=servers.ALERT_DEADLINE,
        what="Alertmanager's notification",
    )
    run = wait_for(
        lambda: DiagnosisRun.objects.filter(run_id=alert.run_id, status="SUCCESS").first(),
        timeout=60,
        what="the analysis",
    )
    assert run.release_decision == "PUBLISHED", run.content
    # The server process hashes with the production hashers (the suite's fast MD5 is in-process only).
    superuser.password = PBKDF2PasswordHasher().encode(PASSWORD, "browser-salt", iterations=1000)
    superuser.save(update_fields=["password"])
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(f"{product.url}/admin/login/")
            page.fill("#id_username", "root")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            expect(page.locator("#user-tools")).to_contain_text("root")

            page.goto(f"{product.url}/admin/diagnosis/aiopsalert/")
            expect(page.locator("h1")).to_contain_text("AI Ops analys")
            page.locator("#changelist-filter").get_by_role("link", name=servers.ALERT_NAME).click()
            rows = page.locator("#result_list tbody tr")
            expect(rows).to_have_count(1)
            expect(rows.first).to_contain_text(run.run_id)
            expect(rows.first).to_contain_text("published")
            expect(rows.first.locator(".field-provider_label")).to_have_text("DEMO")
            page.screenshot(path=str(ARTIFACTS / "aiops-analyses-list.png"), full_page=True)

            rows.first.get_by_role("link", name=run.run_id).click()
            expect(page.locator("h1")).to_contain_text(run.run_id)
            expect(page.locator("#verdict")).to_contain_text("PUBLISHED")
            answer = page.locator(".dc-answer")
            expect(answer).to_contain_text("Summary")
            expect(answer.locator("code.citation-metric").first).to_be_visible()  # a [prom:…] citation
            expect(page.locator('#waterfall .dc-wf-lane[data-lane="planner"]')).to_have_count(1)
            expect(page.locator('#waterfall .dc-wf-lane[data-lane="executor"]')).to_have_count(1)
            expect(page.locator("#timeline")).to_contain_text("PLAN_DECISION")
            expect(page.locator("#self-evaluation")).to_be_visible()
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=str(ARTIFACTS / "aiops-run-page.png"), full_page=True)
        finally:
            browser.close()
