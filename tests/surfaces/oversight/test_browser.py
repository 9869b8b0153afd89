"""The oversight console in headless Chromium (Playwright, Debian's /usr/bin/chromium) against the live
server: the dashboard for a period (charts and their tables), the run list's cost column sorted and
filtered, and a run page's token ledger with each call's cost. Screenshots go to `test-artifacts/`
(docs/admin.md shows copies from docs/images/)."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from audit.write import Usage
from pricing.rules import format_usd
from tests.browser import launch_chromium, requires_chromium
from tests.bulk import bulk_runs
from tests.pricing.test_cost import _recorded_run

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"
TIMEOUT_MS = 15_000
pytestmark = [pytest.mark.browser, requires_chromium]


@pytest.fixture
def console(transactional_db, user, superuser):
    bulk_runs(user, 420, days=14, readers=("auditor", "lead"))
    usage = Usage(
        available=True, prompt_tokens=5200, completion_tokens=640, total_tokens=5840, reasoning_tokens=410,
        cached_tokens=4096,
    )  # fmt: skip
    priced = _recorded_run(user, provider="openai", model="deepseek-reasoner", usages=[usage, usage])
    lost = _recorded_run(user, provider="openai", model="deepseek-chat", usages=[usage], started_extra=1)
    return {"priced": priced, "lost": lost}


def test_dashboard_and_cost_columns_in_chromium(console, live_server):
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(f"{live_server.url}/admin/login/")
            page.fill("#id_username", "root")
            page.fill("#id_password", "pw-root-1")
            page.click("input[type=submit]")
            page.get_by_role("link", name="Oversight dashboard").click()
            page.fill("input[name=since]", "2026-10-01")
            page.fill("input[name=until]", "2026-10-14")
            page.get_by_role("button", name="Show").click()
            expect(page.locator("svg.dc-chart")).to_have_count(5)
            expect(page.locator("#dc-runs tbody tr")).to_have_count(14)
            expect(page.locator("#dc-reads thead")).to_contain_text("auditor")
            expect(page.locator("#dc-tools tbody")).to_contain_text("query_metrics")
            page.screenshot(path=str(ARTIFACTS / "admin-dashboard.png"), full_page=True)

            page.goto(f"{live_server.url}/admin/diagnosis/diagnosisrun/?cost=unavailable")
            expect(page.locator("#result_list tbody tr").first).to_contain_text(console["lost"].run_id)
            expect(page.locator("#result_list tbody tr").first.locator(".field-cost_cell")).to_have_text(
                "unavailable"
            )
            # genai-prices prices DeepSeek by the time of day (its off-peak discount), so the expected
            # figures are the stored cost of the run as recorded now (its hand-computed values are in
            # tests/pricing); the two calls are identical, so each is half of it.
            run_cost = format_usd(console["priced"].cost)
            call_cost = format_usd(console["priced"].cost / 2)
            page.goto(f"{live_server.url}/admin/diagnosis/diagnosisrun/?o=-11")  # cost, highest first
            first = page.locator("#result_list tbody tr").first
            expect(first).to_contain_text(console["priced"].run_id)
            expect(first.locator(".field-cost_cell")).to_have_text(run_cost)
            page.screenshot(path=str(ARTIFACTS / "admin-run-list-cost.png"))

            first.get_by_role("link", name=console["priced"].run_id).click()
            expect(page.locator("#dc-run-cost")).to_contain_text(run_cost)
            expect(page.locator(".dc-ledger-calls td.dc-cost").first).to_have_text(call_cost)
            page.locator("#dc-run-cost").scroll_into_view_if_needed()
            ledger = page.locator("section:has(#dc-run-cost)")
            ledger.screenshot(path=str(ARTIFACTS / "admin-token-ledger-cost.png"))
        finally:
            browser.close()
