"""`GET /metrics`: refused without the configured token, and the record metrics agree with the record."""

from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from diagnosis.models import RunStatus
from telemetry.outbox import enqueue_finished_runs
from tests.telemetry.support import make_recorded_run, record_aiops_run, record_failed_run

pytestmark = pytest.mark.django_db(transaction=True)
TOKEN = "metrics-token-7c1e"


def samples(text: str) -> dict[tuple[str, tuple], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


@pytest.fixture
def scrape(settings):
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_CACHE_SECONDS = 0

    def get(token: str | None = TOKEN):
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return Client().get("/metrics", headers=headers)

    return get


def test_anonymous_and_wrong_token_scrapes_are_refused(scrape, settings):
    assert scrape(None).status_code == 401
    assert scrape(None)["WWW-Authenticate"].startswith("Bearer")
    assert scrape("wrong").status_code == 401
    assert scrape(TOKEN[:-1]).status_code == 401
    assert Client().get("/metrics", headers={"Authorization": f"Token {TOKEN}"}).status_code == 401
    assert scrape().status_code == 200


def test_without_a_token_production_refuses_and_development_serves(settings):
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOW_ANONYMOUS = False
    assert Client().get("/metrics").status_code == 403
    settings.METRICS_ALLOW_ANONYMOUS = True
    assert Client().get("/metrics").status_code == 200


def test_record_metrics_agree_with_the_record(scrape, user):
    make_recorded_run(user, tools=2)
    make_recorded_run(user, tools=1)
    record_failed_run(user)
    record_aiops_run(user)
    enqueue_finished_runs()
    response = scrape()
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    found = samples(response.content.decode())

    def value(name, **labels):
        return found[(name, tuple(sorted(labels.items())))]

    assert value("diagnosis_runs", flow="DIAGNOSIS_AGENT", status=RunStatus.SUCCESS, release="PUBLISHED") == 2
    assert value("diagnosis_runs", flow="DIAGNOSIS_AGENT", status=RunStatus.FAILED, release="") == 1
    assert value("diagnosis_runs", flow="AI_OPS", status=RunStatus.SUCCESS, release="PUBLISHED") == 1
    assert value("diagnosis_tool_calls", tool="lookup_knowledge", status="SUCCEEDED") == 3
    assert value("diagnosis_tool_calls", tool="lookup_knowledge", status="FAILED") == 1
    assert value("diagnosis_tool_calls", tool="query_metrics", status="SUCCEEDED") == 1
    # factories: router 140 per run, agent 800+60 + 1500+90, guard 625
    assert value("diagnosis_tokens", source="router") == 2 * 140
    assert value("diagnosis_tokens", source="guard") == 2 * 625
    assert value("diagnosis_model_tokens", source="agent", model="agent-m", kind="cache_read") == 2 * 128
    assert value("diagnosis_model_tokens", source="agent", model="executor-m", kind="input") == 1200
    # Router and semantic guard calls by their own models too; the guard's recorded durations.
    assert any(k[0] == "diagnosis_model_tokens" and ("source", "router") in k[1] for k in found)
    assert any(k[0] == "diagnosis_model_tokens" and ("source", "guard") in k[1] for k in found)
    from audit.models import EventType, TraceEvent

    guards = TraceEvent.objects.filter(event_type=EventType.SEMANTIC_GUARD_DECISION)
    timed = [e.details["durationMs"] for e in guards if e.details.get("durationMs") is not None]
    # Guard calls without a recorded duration (JSON null) are left out, never counted as 0 ms.
    assert value("diagnosis_guard_duration_seconds_count") == len(timed)
    assert value("diagnosis_guard_duration_seconds_sum") == pytest.approx(sum(timed) / 1000)
    # Per (source, model) exactly the kinds some call reported, summed; a kind none reported is absent.
    usage = TraceEvent.objects.filter(event_type=EventType.MODEL_TOKEN_USAGE, status="REPORTED")
    expected: dict[tuple, int] = {}
    keys = {"input": "promptTokens", "output": "completionTokens"}
    keys |= {"reasoning": "reasoningTokens", "cache_read": "cachedTokens"}
    for event in usage:
        d = event.details
        for kind, key in keys.items():
            if d.get(key) is not None:
                label = (d["source"].lower(), d["model"], kind)
                expected[label] = expected.get(label, 0) + d[key]
    exported = {
        (dict(k[1])["source"], dict(k[1])["model"], dict(k[1])["kind"]): v
        for k, v in found.items()
        if k[0] == "diagnosis_model_tokens"
    }
    assert exported == expected
    assert value("diagnosis_run_duration_seconds_count") == 4
    assert value("diagnosis_otlp_exports", state="PENDING") == 4
    assert value("diagnosis_otlp_export_lag_seconds") >= 0
    assert value("diagnosis_audit_write_failures") == 0
    assert value("diagnosis_fenced_writes") == 0
    assert value("diagnosis_process_active_runs") == 0
    assert ("diagnosis_process_live_followers", ()) in found


def test_record_metrics_cover_the_window_only_with_a_constant_number_of_queries(scrape, user, settings):
    import datetime as dt

    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from audit.models import AgentStep, ToolInvocation
    from diagnosis.models import DiagnosisRun

    old = make_recorded_run(user, tools=1)
    long_ago = timezone.now() - dt.timedelta(hours=3)
    DiagnosisRun.objects.filter(run_id=old.run_id).update(created_at=long_ago)
    AgentStep.objects.filter(run_id=old.run_id).update(created_at=long_ago)
    ToolInvocation.objects.filter(run_id=old.run_id).update(created_at=long_ago)
    make_recorded_run(user, tools=2)
    settings.METRICS_WINDOW_SECONDS = 3600
    with CaptureQueriesContext(connection) as first:
        found = samples(scrape().content.decode())
    assert found[("diagnosis_metrics_window_seconds", ())] == 3600
    assert found[("diagnosis_run_duration_seconds_count", ())] == 1  # the run of three hours ago is out
    assert found[("diagnosis_tool_calls", (("status", "SUCCEEDED"), ("tool", "lookup_knowledge")))] == 2
    for _ in range(5):
        make_recorded_run(user, tools=1)
    with CaptureQueriesContext(connection) as second:
        scrape()
    assert len(second) == len(first)
    settings.METRICS_WINDOW_SECONDS = 4 * 3600
    found = samples(scrape().content.decode())
    assert found[("diagnosis_run_duration_seconds_count", ())] == 7


def test_cost_by_source_and_model_is_the_pricing_rule_and_unpriced_calls_are_counted(scrape, user):
    from decimal import Decimal

    from audit.write import Usage
    from pricing.rules import CallTokens, PriceBook
    from tests.pricing.test_cost import _recorded_run

    usage = Usage(
        available=True, prompt_tokens=1000, completion_tokens=500, total_tokens=1500, reasoning_tokens=200,
        cached_tokens=400,
    )  # fmt: skip
    run = _recorded_run(user, provider="openai", model="deepseek-chat", usages=[usage, usage])
    make_recorded_run(user, tools=1)  # router-m, agent-m, guard-m: no price
    found = samples(scrape().content.decode())
    one = PriceBook().price_call(
        provider="openai", model="deepseek-chat", tokens=CallTokens.from_usage(usage), at=run.created_at
    )
    cost = found[("diagnosis_model_cost_dollars", (("model", "deepseek-chat"), ("source", "agent")))]
    assert Decimal(str(cost)).quantize(Decimal("1e-9")) == (2 * one.amount).quantize(Decimal("1e-9"))
    unpriced = {k[1]: v for k, v in found.items() if k[0] == "diagnosis_model_calls_unpriced"}
    assert unpriced[(("model", "agent-m"), ("reason", "unknown_model"), ("source", "agent"))] == 2
    assert unpriced[(("model", "router-m"), ("reason", "unknown_model"), ("source", "router"))] == 1
    assert not any(dict(k).get("model") == "deepseek-chat" for k in unpriced)
