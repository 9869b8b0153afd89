"""An auditor's oversight work in a real headless Chromium (Playwright, Debian's /usr/bin/chromium) against
the live server: the review queue's counts on the admin index, the queue, claiming the next run and
reviewing it on its run page (and on to the next), then comparing two runs of the same question picked
on the run list. Screenshots go to `test-artifacts/` (git-ignored; docs/admin.md shows copies from
docs/images/).

Playwright's sync API cannot run inside an asyncio loop, so these tests are plain sync functions.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect, sync_playwright

from audit.models import RunReview
from tests.browser import launch_chromium, requires_chromium
from tests.factories import make_recorded_run
from tests.surfaces.admin.support import grant_console, make_blocked_run
from tests.surfaces.admin.test_browser import ARTIFACTS, _in_thread, _log_in

pytestmark = [pytest.mark.browser, requires_chromium]
QUESTION = "Why does checkout-api return 502 since the deploy?"


@pytest.fixture
def oversight(transactional_db, user, auditor):
    """The same question asked twice (answered, then blocked after a model change), a down-voted
    answer, and an auditor (staff + "Reasoning Auditors", who hold audit.review_run)."""
    grant_console(auditor)
    assert auditor.has_perm("audit.review_run")
    from diagnosis import services

    before = make_recorded_run(user, query=QUESTION, tools=1)
    after = make_blocked_run(user, query=QUESTION)
    voted = make_recorded_run(user, query="Why is MySQL replication lagging on db-2?", tools=2)
    services.submit_feedback(run=voted, user=user, rating="down", comment="it missed the long transaction")
    Group.objects.get(name="Reviewers")  # made on migrate
    return {"before": before, "after": after, "voted": voted}


@pytest.fixture
def browser(oversight):
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        try:
            yield chromium
        finally:
            chromium.close()


def test_an_auditor_works_through_the_queue(browser, live_server, oversight):
    after, voted = oversight["after"], oversight["voted"]
    page = _log_in(browser, live_server, "auditor", "pw-auditor-1")

    page.goto(f"{live_server.url}/admin/")
    counts = page.locator("#dc-review-counts")
    expect(counts).to_be_visible()
    expect(page.locator("#dc-queue-total")).to_have_text("2")
    expect(counts).to_contain_text("blocked by the guards 1")
    expect(counts).to_contain_text("voted down by a user 1")
    page.screenshot(path=str(ARTIFACTS / "admin-index-review-queue.png"))

    counts.get_by_role("link", name="Review queue").click()
    rows = page.locator("#dc-queue tbody tr[data-run]")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text(after.run_id)  # oldest first
    expect(rows.first.locator('[data-reason="blocked"]')).to_be_visible()
    expect(page.locator(f'#dc-queue tr[data-run="{voted.run_id}"] [data-reason="downvoted"]')).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / "review-queue.png"), full_page=True)

    page.locator("#dc-queue-next button").click()
    expect(page.locator("h1")).to_contain_text(after.run_id)
    form = page.locator("#dc-review-form")
    expect(form).to_be_visible()
    form.locator('input[value="unsafe"]').check()
    form.locator("textarea").fill("Advises rolling back image 1.42 without evidence for it.")
    page.locator("#reviews").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "run-review-form.png"))
    form.get_by_role("button").click()

    # On to the next queued run; the reviewed one is off the queue.
    expect(page.locator("h1")).to_contain_text(voted.run_id)
    review = _in_thread(lambda: RunReview.objects.get(run_id=after.run_id))
    assert (review.verdict, review.reviewer_username) == ("unsafe", "auditor")

    page.goto(f"{live_server.url}/admin/diagnosis/diagnosisrun/{after.pk}/change/")
    reviews = page.locator("#dc-reviews")
    expect(reviews).to_contain_text("unsafe")
    expect(reviews).to_contain_text("without evidence")
    expect(page.locator("#timeline")).to_contain_text("REVIEW_RECORDED")
    expect(page.locator("#dc-rows-verified")).to_contain_text("verified")
    page.locator("#reviews").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "run-reviews.png"))


def test_compare_two_runs_of_the_same_question(browser, live_server, oversight):
    before, after = oversight["before"], oversight["after"]
    page = _log_in(browser, live_server, "auditor", "pw-auditor-1")
    page.goto(f"{live_server.url}/admin/diagnosis/diagnosisrun/")
    for run in (before, after):
        page.locator(f'#result_list input.action-select[value="{run.pk}"]').check()
    page.select_option("select[name=action]", "compare_runs")
    page.locator("button[name=index]").click()

    expect(page.locator("h1")).to_contain_text("Compare two runs")
    expect(page.locator("#dc-differences")).to_contain_text("difference")
    release = page.locator("#cmp-release tr", has_text="decision")
    expect(release.first).to_have_class("dc-diff")
    expect(release.first).to_contain_text("PUBLISHED")
    expect(release.first).to_contain_text("BLOCKED")
    question = page.locator("#cmp-run tr", has_text="question")
    expect(question).not_to_have_class("dc-diff")  # the same question on both sides
    expect(page.locator("#cmp-tools")).to_contain_text("lookup_knowledge")
    expect(page.locator("#cmp-citations")).to_contain_text("kb:deploy-rollback#1")
    expect(page.locator("#cmp-guards")).to_contain_text("semantic guard")
    expect(page.locator("#cmp-cost")).to_contain_text("unavailable")  # the test models have no price
    expect(page.locator("#cmp-latency")).to_contain_text("ms")
    page.screenshot(path=str(ARTIFACTS / "compare-runs.png"), full_page=True)
