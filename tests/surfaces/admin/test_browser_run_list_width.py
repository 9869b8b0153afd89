"""The run list at 1280 px (a laptop) in headless Chromium: every column is on screen, Duration, Cost and
Created included, with no sideways scroll of the page (long cells wrap instead)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser import requires_chromium
from tests.surfaces.admin.test_browser import ARTIFACTS, TIMEOUT_MS, browser, runs  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, requires_chromium]
WIDTH = 1280


def test_the_run_list_keeps_every_column_at_1280_px(browser, live_server, runs):  # noqa: F811
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", "staff")
    page.fill("#id_password", "pw-staff-1")
    page.click("input[type=submit]")
    page.goto(f"{live_server.url}/admin/diagnosis/diagnosisrun/")
    expect(page.locator("#result_list tbody tr")).to_have_count(3)
    page.screenshot(path=str(ARTIFACTS / "admin-run-list-1280.png"), full_page=True)
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow} px"
    headers = page.locator("#result_list thead th")
    for column in ("duration", "cost", "created", "audit complete", "tokens"):
        header = headers.filter(has_text=column).first
        box = header.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= WIDTH, (column, box)
    for cell in ("td.field-duration", "td.field-cost_cell", "td.field-created"):
        box = page.locator(f"#result_list tbody tr >> nth=0 >> {cell}").bounding_box()
        assert box is not None and box["x"] + box["width"] <= WIDTH, (cell, box)
