"""The review queue (membership of each reason, the stored flag, claims, next, query counts), the review
form on the run page, the queue's counts on the admin index, and the comparison of two runs."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from audit.models import RunReview
from audit.read import get_trace
from audit.read.list_facts import refresh_run_facts
from audit.write import RunRecorder, Usage
from audit.write.reviews import claim_run, next_in_queue, record_review
from diagnosis import services
from diagnosis.models import AgentFlow, DiagnosisRun, ReleaseDecision, RunStatus
from diagnosis.review_queue import queue_counts, queued_runs, reasons_of
from surfaces.admin.compare import NOT_RECORDED, compare_traces
from surfaces.api.trace_render import trace_data
from tests.factories import make_recorded_run, record_full_run
from tests.surfaces.admin.support import grant_console, make_blocked_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def reviewer(django_user_model):
    user = django_user_model.objects.create_user("reviewer", password="pw-reviewer-1", is_staff=True)
    grant_console(user)
    user.groups.add(Group.objects.get(name="Reviewers"))
    return user


@pytest.fixture
def second_reviewer(django_user_model):
    user = django_user_model.objects.create_user("reviewer2", password="pw-reviewer-2", is_staff=True)
    grant_console(user)
    user.groups.add(Group.objects.get(name="Reviewers"))
    return user


def _reasons(run: DiagnosisRun) -> set[str]:
    """The run's reasons as the queue computes them, or None when it is not queued."""
    queued = queued_runs().filter(pk=run.pk).first()
    return None if queued is None else {r.key for r in reasons_of(queued)}


def _fresh(run: DiagnosisRun) -> DiagnosisRun:
    return DiagnosisRun.objects.get(pk=run.pk)


# --------------------------------------------------------------------------------------------------
# Membership, reason by reason, through the paths that really change each input
# --------------------------------------------------------------------------------------------------
def test_a_clean_published_run_is_not_queued(user):
    run = _fresh(make_recorded_run(user))
    assert run.audit_complete and run.tokens_reconciled and run.release_decision == ReleaseDecision.PUBLISHED
    assert not run.needs_review and _reasons(run) is None


def test_a_blocked_run_is_queued_with_its_reasons(user):
    run = _fresh(make_blocked_run(user))
    assert run.needs_review
    # The semantic guard reported no usage: the ledger is not reconciled either.
    assert _reasons(run) == {"blocked", "unreconciled"}


def test_an_unverified_draft_delivered_is_a_reason(user):
    run = _fresh(make_blocked_run(user, release_mode="draft", draft_chars=120))
    assert _reasons(run) == {"blocked", "unreconciled", "draft_delivered"}


def test_a_down_vote_queues_and_an_up_vote_unqueues(user, other_user):
    run = make_recorded_run(user)
    services.submit_feedback(run=run, user=user, rating="down", comment="wrong runbook")
    assert _fresh(run).downvoted and _reasons(run) == {"downvoted"}
    services.submit_feedback(run=run, user=other_user, rating="up")
    assert _reasons(run) == {"downvoted"}  # still voted down by one user
    services.submit_feedback(run=run, user=user, rating="up")
    assert not _fresh(run).downvoted and _reasons(run) is None


def test_an_incomplete_audit_is_a_reason(user):
    run = make_recorded_run(user)
    # A write lost after the end (counted on the run), then the facts rewritten as verify_audit does.
    DiagnosisRun.objects.filter(pk=run.pk).update(audit_write_failures=1)
    refresh_run_facts(run_ids=[run.run_id])
    assert not _fresh(run).audit_complete and _reasons(run) == {"audit_incomplete"}


def test_a_late_failed_write_after_the_end_queues_the_run(user):
    run = make_recorded_run(user)
    rec = RunRecorder.for_run(run)  # (a finished chain is never resumed: `ChainFinished`)
    rec.finished = True
    rec.chain.failed("late_write", RuntimeError("lost"))  # the recorder's own accounting of a lost write
    assert _reasons(run) == {"audit_incomplete"}


def test_an_unreconciled_ledger_is_a_reason(user):
    session = services.create_session(owner=user)
    run = services.create_run(session=session, query="Why is the disk full?")
    rec = RunRecorder.for_run(run)
    rec.run_started(release_mode="verified")
    rec.routing_attempt(
        attempt=1, model="router-m", usage=Usage.unavailable(), ok=True, intent="CHITCHAT", confidence=0.9
    )
    rec.routing_decision(intent="CHITCHAT", confidence=0.9, reason="greeting", fallback=False)
    rec.release(decision=ReleaseDecision.PUBLISHED, reason="chit-chat")
    rec.finish(status=RunStatus.SUCCESS, content="Hello.")
    assert not _fresh(run).tokens_reconciled and _reasons(run) == {"unreconciled"}


def test_every_ai_ops_report_is_queued_until_reviewed(user, reviewer):
    session = services.create_session(owner=user)
    run = services.create_run(session=session, query="alert: HighLatency", agent_flow=AgentFlow.AI_OPS)
    record_full_run(run)
    assert _reasons(run) == {"aiops_report"}
    record_review(run=_fresh(run), user=reviewer, verdict="correct")
    assert not _fresh(run).needs_review and _reasons(run) is None


def test_unfinished_runs_are_never_queued(user):
    session = services.create_session(owner=user)
    run = services.create_run(session=session, query="still running", agent_flow=AgentFlow.AI_OPS)
    assert not _fresh(run).needs_review and _reasons(run) is None


def test_a_review_takes_a_run_off_the_queue_for_good(user, reviewer):
    run = make_blocked_run(user)
    record_review(run=run, user=reviewer, verdict="unsafe", note="Advises a rollback without evidence.")
    assert _reasons(run) is None
    services.submit_feedback(run=run, user=user, rating="down")
    assert _fresh(run).downvoted and _reasons(run) is None


# --------------------------------------------------------------------------------------------------
# Claims and next
# --------------------------------------------------------------------------------------------------
def test_a_claim_keeps_others_off_until_it_expires(user, reviewer, second_reviewer):
    run = make_blocked_run(user)
    assert claim_run(run_id=run.run_id, user=reviewer)
    assert _fresh(run).review_claimed_by == "reviewer"
    assert not claim_run(run_id=run.run_id, user=second_reviewer)
    DiagnosisRun.objects.filter(pk=run.pk).update(
        review_claim_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert claim_run(run_id=run.run_id, user=second_reviewer)
    assert _fresh(run).review_claimed_by == "reviewer2"


def test_next_opens_the_oldest_run_nobody_else_holds(user, reviewer, second_reviewer):
    older, newer = make_blocked_run(user), make_blocked_run(user)
    assert next_in_queue(user=reviewer).pk == older.pk
    assert next_in_queue(user=second_reviewer).pk == newer.pk
    assert next_in_queue(user=reviewer).pk == older.pk  # still the reviewer's own claim
    record_review(run=older, user=reviewer, verdict="correct")
    assert _fresh(older).review_claimed_by == ""  # the review ends the claim
    assert next_in_queue(user=reviewer) is None  # the other one is held by reviewer2


# --------------------------------------------------------------------------------------------------
# Scale: the queue page and the index counts cost the same queries at 10 and at many queued runs
# --------------------------------------------------------------------------------------------------
def _queued_runs(owner, n: int) -> None:
    session = services.create_session(owner=owner)
    runs = [
        DiagnosisRun(
            run_id=f"run_q{i:05d}_{session.pk}",
            session=session,
            query=f"question {i}",
            status=RunStatus.SUCCESS,
            release_decision=ReleaseDecision.BLOCKED,
            audit_complete=True,
            tokens_reconciled=i % 2 == 0,
        )
        for i in range(n)
    ]
    DiagnosisRun.objects.bulk_create(runs)
    refresh_run_facts(runs=DiagnosisRun.objects.filter(session=session))


def _queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


def test_queue_page_and_index_counts_do_not_depend_on_the_number_of_runs(client, user, reviewer):
    client.force_login(reviewer)
    queue = reverse("admin:diagnosis_diagnosisrun_queue")
    _queued_runs(user, 10)
    assert queue_counts()[0].count == 10
    _queries(client, queue)  # warm the session and permission caches
    small = (
        _queries(client, queue),
        _queries(client, queue + "?reason=unreconciled"),
        _queries(client, "/admin/"),
    )
    _queued_runs(user, 1200)
    total, counts = queue_counts()
    assert total.capped and total.shown == "1000+"
    assert {c.key: c.shown for c in counts}["unreconciled"] == "605"
    large = (
        _queries(client, queue),
        _queries(client, queue + "?reason=unreconciled"),
        _queries(client, "/admin/"),
    )
    assert small == large
    # Eight reasons (six of the run's columns, one of its failed tool calls: `audit.review_reasons`, one
    # of online evaluators: `evaluations.queue`) and the total, one capped count each, the page of runs,
    # and the governance chain's head (the reviewer's right is taken from the chain, its replay cached
    # per head): no join, no per-row query.
    assert large[0] <= 15


# --------------------------------------------------------------------------------------------------
# The admin pages
# --------------------------------------------------------------------------------------------------
def test_the_queue_page_lists_reasons_and_the_index_counts_them(client, user, reviewer):
    blocked = make_blocked_run(user)
    make_recorded_run(user)  # clean: not listed
    client.force_login(reviewer)
    html = client.get(reverse("admin:diagnosis_diagnosisrun_queue")).content.decode()
    assert blocked.run_id in html and 'data-reason="blocked"' in html
    assert html.count("<tr data-run=") == 1
    index = client.get("/admin/").content.decode()
    assert 'id="dc-review-counts"' in index and 'id="dc-queue-total">1<' in index


def test_review_from_the_run_page_and_on_to_the_next(client, user, reviewer):
    first, second = make_blocked_run(user), make_blocked_run(user)
    client.force_login(reviewer)
    page = client.get(reverse("admin:diagnosis_diagnosisrun_change", args=[first.pk]) + "?from=queue")
    html = page.content.decode()
    assert 'id="dc-review-form"' in html and 'name="from" value="queue"' in html
    response = client.post(
        reverse("admin:diagnosis_diagnosisrun_review", args=[first.pk]),
        {"verdict": "needs_follow_up", "note": "Ask the owner of checkout-api.", "from": "queue"},
    )
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:diagnosis_diagnosisrun_change", args=[second.pk]))
    review = RunReview.objects.get(run_id=first.run_id)
    assert (review.verdict, review.reviewer_username) == ("needs_follow_up", "reviewer")
    page = client.get(reverse("admin:diagnosis_diagnosisrun_change", args=[first.pk])).content.decode()
    assert 'id="dc-reviews"' in page and "Ask the owner of checkout-api." in page


def test_staff_without_the_permission_cannot_review(client, user, staff_user):
    grant_console(staff_user)
    run = make_blocked_run(user)
    client.force_login(staff_user)
    page = client.get(reverse("admin:diagnosis_diagnosisrun_change", args=[run.pk])).content.decode()
    assert 'id="dc-review-form"' not in page
    refused = client.post(
        reverse("admin:diagnosis_diagnosisrun_review", args=[run.pk]), {"verdict": "correct"}
    )
    assert refused.status_code == 403
    assert client.post(reverse("admin:diagnosis_diagnosisrun_queue_next")).status_code == 403
    assert not RunReview.objects.exists()


# --------------------------------------------------------------------------------------------------
# Compare
# --------------------------------------------------------------------------------------------------
def test_compare_marks_what_differs(user):
    left = make_recorded_run(user, tools=1)
    right = make_recorded_run(user, tools=2)
    comparison = compare_traces(
        trace_data(get_trace(run=_fresh(left))), trace_data(get_trace(run=_fresh(right)))
    )
    rows = {(s.key, r.label): r for s in comparison.sections for r in s.rows}
    assert rows[("tools", "tool calls in all")].differs
    assert (rows[("tools", "tool calls in all")].left, rows[("tools", "tool calls in all")].right) == (
        "1",
        "2",
    )
    assert rows[("tools", "call 2")].left == "—" and "lookup_knowledge" in rows[("tools", "call 2")].right
    assert not rows[("route", "intent")].differs and rows[("route", "intent")].left == "DIAGNOSIS"
    assert not rows[("release", "decision")].differs
    assert rows[("citations", "cited")].left == "kb:mysql-replication-lag#1"
    assert rows[("guards", "semantic guard")].left == rows[("guards", "semantic guard")].right
    assert rows[("steps", "diagnosis_agent: steps")].left == "2"
    # The test models have no price: the run's cost is unavailable, never 0.
    assert rows[("cost", "run cost")].left.startswith("unavailable (")
    assert comparison.differences >= 2


def test_compare_action_needs_exactly_two_runs_and_the_page_shows_them(client, user, reviewer):
    a, b, c = make_recorded_run(user), make_blocked_run(user), make_recorded_run(user)
    client.force_login(reviewer)
    changelist = reverse("admin:diagnosis_diagnosisrun_changelist")
    response = client.post(changelist, {"action": "compare_runs", "_selected_action": [a.pk, b.pk]})
    assert response.status_code == 302 and "compare/" in response["Location"]
    html = client.get(response["Location"]).content.decode()
    assert a.run_id in html and b.run_id in html and 'id="dc-differences"' in html
    assert 'class="dc-diff"' in html  # PUBLISHED against BLOCKED
    three = client.post(
        changelist, {"action": "compare_runs", "_selected_action": [a.pk, b.pk, c.pk]}, follow=True
    )
    assert "Select exactly two runs to compare." in three.content.decode()
    unknown = client.get(reverse("admin:diagnosis_diagnosisrun_compare") + "?a=run_nope&b=" + a.run_id)
    assert unknown.status_code == 302


@pytest.mark.skipif(connection.vendor != "mysql", reason="needs MariaDB/MySQL (DATABASE_URL=mysql://…)")
def test_the_queue_page_reads_the_flags_index_without_a_sort(client, user, reviewer):
    from diagnosis.review_queue import refresh_needs_review
    from tests.surfaces.admin.test_list_scaling import add_runs

    add_runs(user, 0, 30_000, audit_rows=False)
    DiagnosisRun.objects.update(tokens_reconciled=True)  # blocked, drafts and incomplete audits remain
    refresh_needs_review(runs=DiagnosisRun.objects.all())
    assert 0 < DiagnosisRun.objects.filter(needs_review=True).count() < 30_000
    client.force_login(reviewer)
    checked = 0
    for url in (
        reverse("admin:diagnosis_diagnosisrun_queue"),
        reverse("admin:diagnosis_diagnosisrun_queue") + "?reason=blocked",
    ):
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(url).status_code == 200
        for query in ctx.captured_queries:
            sql = query["sql"]
            if not sql.startswith("SELECT") or "LIMIT 50" not in sql or "diagnosis_run" not in sql:
                continue
            with connection.cursor() as cur:
                cur.execute("EXPLAIN " + sql)
                names = [c[0] for c in cur.description]
                plan = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
            for step in plan:
                if step["table"] == "diagnosis_run":
                    checked += 1
                    # The flag's index, or (one reason) the reason's own `(column, created_at)` index.
                    assert step["key"] and step["type"] != "ALL", (url, step)
                    if "reason=" not in url:
                        assert step["key"] == "idx_run_needs_review", (url, step)
                    assert "filesort" not in (step.get("Extra") or ""), (url, step)
    assert checked == 2


def test_verify_audit_reports_a_queue_flag_that_disagrees_and_refresh_rewrites_it(user):
    from audit.verify.runs import refresh_facts, verify_run

    run = make_blocked_run(user)
    DiagnosisRun.objects.filter(pk=run.pk).update(needs_review=False)  # behind the rule's back
    result = verify_run(run.run_id)
    assert result.facts == ["stored needs_review is False, recomputed True"]
    assert refresh_facts([result]) == 1
    assert _fresh(run).needs_review and verify_run(run.run_id).ok


def test_compare_shows_the_run_cost_as_the_run_page_words_it(user):
    body = trace_data(get_trace(run=_fresh(make_recorded_run(user))))
    priced = {
        **body,
        "run": {**body["run"], "cost": {**body["run"]["cost"], "amount": "0.012300", "status": "priced"}},
    }
    unpriced = {
        **body,
        "run": {
            **body["run"],
            "cost": {**body["run"]["cost"], "amount": None, "status": "unavailable", "unpricedCalls": 2},
        },
    }
    without = {**body, "run": {k: v for k, v in body["run"].items() if k != "cost"}}
    rows = [
        next(r for s in compare_traces(a, b).sections if s.key == "cost" for r in s.rows)
        for a, b in ((priced, unpriced), (without, without))
    ]
    assert rows[0].left.startswith("$0.0123") and rows[0].right == "unavailable (2 calls could not be priced)"
    assert rows[0].differs
    assert (rows[1].left, rows[1].differs) == (NOT_RECORDED, False)
