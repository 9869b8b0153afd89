"""Cost per call and per run against hand-computed prices, override precedence by date, and the run's
stored cost written by the recorder and recomputed by `verify_audit`."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from audit.read.list_facts import refresh_run_costs
from audit.write import RunRecorder, Usage
from diagnosis import services
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunStatus
from pricing.costs import load_price_book
from pricing.models import PriceOverride
from pricing.rules import CallTokens, CostStatus, PriceBook, format_usd
from reasoning.capture import build_capture

AT = dt.datetime(2026, 11, 1, 12, tzinfo=dt.UTC)
pytestmark = pytest.mark.django_db


def tokens(prompt, completion, *, reasoning=None, cached=None, available=True):
    return CallTokens(
        prompt=prompt,
        completion=completion,
        total=None if prompt is None or completion is None else prompt + completion,
        reasoning=reasoning,
        cached=cached,
        available=available,
    )


def test_deepseek_call_with_cache_hits_and_reasoning_tokens():
    # deepseek-chat in genai-prices: $0.27 input, $0.07 cached input, $1.10 output per million tokens.
    # 1000 prompt tokens of which 400 cache hits; 500 completion tokens of which 200 reasoning (output).
    cost = PriceBook().price_call(
        provider="openai", model="deepseek-chat", tokens=tokens(1000, 500, reasoning=200, cached=400), at=AT
    )
    hand = (
        Decimal(600) * Decimal("0.27") + Decimal(400) * Decimal("0.07") + Decimal(500) * Decimal("1.1")
    ) / (10**6)
    assert hand == Decimal("0.00074")
    assert cost.status == CostStatus.PRICED and cost.source == "genai-prices"
    assert cost.amount == hand
    assert cost.matched_model == "deepseek/deepseek-chat"
    # deepseek-reasoner: $0.55 / $0.14 / $2.19; 2000 in (1500 cached), 800 out (600 of them reasoning).
    reasoner = PriceBook().price_call(
        provider="openai",
        model="deepseek-reasoner",
        tokens=tokens(2000, 800, reasoning=600, cached=1500),
        at=AT,
    )
    assert reasoner.amount == Decimal("0.002237")  # 500*0.55 + 1500*0.14 + 800*2.19 = 2237 µ$


def test_reasoning_reported_beside_the_completion_is_priced_as_output_too():
    # A provider whose reasoning count exceeds its completion count reports them separately.
    cost = PriceBook().price_call(
        provider="openai", model="deepseek-chat", tokens=tokens(1000, 100, reasoning=400), at=AT
    )
    assert cost.amount == (Decimal(1000) * Decimal("0.27") + Decimal(500) * Decimal("1.1")) / 10**6


def test_openai_call():
    # gpt-4o-mini: $0.15 input, $0.075 cached input, $0.60 output; 1200 in (1024 cached), 300 out.
    cost = PriceBook().price_call(
        provider="openai", model="gpt-4o-mini", tokens=tokens(1200, 300, cached=1024), at=AT
    )
    assert cost.amount == Decimal("0.0002832")  # 176*0.15 + 1024*0.075 + 300*0.6 = 283.2 µ$
    assert cost.matched_model == "openai/gpt-4o-mini"


def test_unknown_model_unreported_usage_and_demo_are_unavailable_never_zero():
    book = PriceBook()
    unknown = book.price_call(provider="openai", model="acme-llm-9", tokens=tokens(10, 10), at=AT)
    assert (unknown.amount, unknown.status) == (None, CostStatus.UNKNOWN_MODEL)
    lost = book.price_call(
        provider="openai", model="gpt-4o-mini", tokens=tokens(None, None, available=False), at=AT
    )
    assert (lost.amount, lost.status) == (None, CostStatus.USAGE_UNAVAILABLE)
    demo = book.price_call(provider="demo", model="gpt-4o-mini", tokens=tokens(10, 10), at=AT)
    assert (demo.amount, demo.status) == (None, CostStatus.DEMO)
    assert unknown.label == "unavailable (model not priced)" and demo.label == "demo (no price)"
    # A run with one unpriced call has no cost (not the sum of the others) and counts the call.
    run, calls = book.price_run(
        provider="openai",
        calls=[("gpt-4o-mini", tokens(1200, 300, cached=1024)), ("acme-llm-9", tokens(1, 1))],
        started_calls=3,  # one more started and never recorded
        at=AT,
    )
    assert (run.amount, run.status, run.priced_calls, run.unpriced_calls) == (None, "unavailable", 1, 2)
    assert calls[0].amount == Decimal("0.0002832")


def test_a_model_genai_prices_does_not_know_is_searched_for_once_per_snapshot(monkeypatch):
    """The lookup's result for an unknown name is remembered (genai-prices searches every provider again
    for it); a known model is still priced at each call's date, and a new snapshot starts afresh."""
    from genai_prices import data_snapshot

    from pricing import rules

    searched: list[str] = []
    real = data_snapshot.DataSnapshot.find_provider

    def counting(self, model_ref, provider_id, provider_api_url):
        searched.append(model_ref)
        return real(self, model_ref, provider_id, provider_api_url)

    monkeypatch.setattr(data_snapshot.DataSnapshot, "find_provider", counting)
    monkeypatch.setattr(rules, "_unknown", rules._Unknown())
    book = PriceBook()
    for _ in range(3):
        cost = book.price_call(provider="openai", model="acme-llm-9", tokens=tokens(10, 10), at=AT)
        assert (cost.amount, cost.status) == (None, CostStatus.UNKNOWN_MODEL)
    assert searched == ["acme-llm-9"]
    known = book.price_call(
        provider="openai", model="gpt-4o-mini", tokens=tokens(1200, 300, cached=1024), at=AT
    )
    assert known.amount == Decimal("0.0002832")
    # Another snapshot (a custom one installed) may know the name: it is looked up again.
    bundled = data_snapshot.get_snapshot()
    custom = data_snapshot.DataSnapshot(providers=bundled.providers, from_auto_update=False)
    monkeypatch.setattr(data_snapshot, "_custom_snapshot", custom)
    book.price_call(provider="openai", model="acme-llm-9", tokens=tokens(10, 10), at=AT)
    assert searched.count("acme-llm-9") == 2


def _override(pattern, start, end=None, *, provider="", inp="1", cached=None, out="2"):
    return PriceOverride.objects.create(
        model_pattern=pattern,
        provider=provider,
        input_per_mtok=Decimal(inp),
        cached_input_per_mtok=None if cached is None else Decimal(cached),
        output_per_mtok=Decimal(out),
        effective_from=start,
        effective_to=end,
    )


def test_override_precedence_by_date_and_specificity():
    jan, jun, sep = (dt.datetime(2026, m, 1, tzinfo=dt.UTC) for m in (1, 6, 9))
    old = _override("deepseek-*", jan, inp="0.20", cached="0.05", out="1.00")
    new = _override("deepseek-*", jun, inp="0.10", cached="0.02", out="0.50")
    exact = _override("deepseek-chat", sep, sep + dt.timedelta(days=30), inp="0.01", out="0.01")
    book = load_price_book()
    call = tokens(1000, 500, reasoning=200, cached=400)

    def price(at, model="deepseek-chat"):
        return book.price_call(provider="openai", model=model, tokens=call, at=at)

    # Before any override: genai-prices.
    assert price(dt.datetime(2025, 12, 1, tzinfo=dt.UTC)).source == "genai-prices"
    # March: only the January override is in force: 600*0.20 + 400*0.05 + 500*1.00 = 640 µ$.
    march = price(dt.datetime(2026, 3, 1, tzinfo=dt.UTC))
    assert (march.source, march.override_id, march.amount) == ("override", old.id, Decimal("0.00064"))
    # July: both patterns in force; the most recent wins: 600*0.10 + 400*0.02 + 500*0.50 = 318 µ$.
    july = price(dt.datetime(2026, 7, 1, tzinfo=dt.UTC))
    assert (july.override_id, july.amount) == (new.id, Decimal("0.000318"))
    # Mid-September: the exact name beats the patterns while it is in force (cached priced as input);
    assert price(sep + dt.timedelta(days=3)).override_id == exact.id
    assert price(sep + dt.timedelta(days=3)).amount == Decimal(1500) * Decimal("0.01") / 10**6
    # …and after its `effective_to` the newest pattern applies again; other models match the pattern.
    assert price(sep + dt.timedelta(days=31)).override_id == new.id
    assert price(sep + dt.timedelta(days=3), model="deepseek-reasoner").override_id == new.id
    # A provider-bound override beats an any-provider one for runs of that provider only.
    bound = _override("deepseek-*", jan, provider="openai", inp="9", out="9")
    book = load_price_book()
    assert (
        book.price_call(provider="openai", model="deepseek-chat", tokens=call, at=AT).override_id == bound.id
    )


def test_format_usd_never_shows_a_non_zero_cost_as_zero():
    assert format_usd(Decimal("0.00074")) == "$0.000740"
    assert format_usd(Decimal("0.0000001")) == "<$0.000001"
    assert format_usd(Decimal("1.23456")) == "$1.2346"
    assert format_usd(None) == "—"


def _recorded_run(owner, *, provider: str, model: str, usages: list[Usage], started_extra: int = 0):
    session = services.create_session(owner=owner)
    run = services.create_run(session=session, query="why is the replica lagging?")
    rec = RunRecorder.for_run(run)
    rec.run_started(release_mode="verified", details={"provider": provider})
    for i, u in enumerate(usages, start=1):
        rec.model_call_started()
        rec.model_step(
            step_index=i,
            agent_name="diagnosis_agent",
            model=model,
            usage=u,
            reasoning=build_capture(reasoning="r", text="answer"),
            finish_reason="stop",
        )
    for _ in range(started_extra):
        rec.model_call_started()
    rec.release(decision=ReleaseDecision.PUBLISHED, reason="ok")
    rec.finish(status=RunStatus.SUCCESS, content="answer")
    run.refresh_from_db()
    return run


def test_recorder_stores_the_run_cost_and_verify_audit_recomputes_it(user):
    usage = Usage(
        available=True,
        prompt_tokens=1000,
        completion_tokens=500,
        total_tokens=1500,
        reasoning_tokens=200,
        cached_tokens=400,
    )
    priced = _recorded_run(user, provider="openai", model="deepseek-chat", usages=[usage, usage])
    # Priced at the run's creation date (today): compare with the rule itself at that date.
    one = PriceBook().price_call(
        provider="openai", model="deepseek-chat", tokens=CallTokens.from_usage(usage), at=priced.created_at
    )
    assert (priced.cost, priced.cost_status, priced.cost_unpriced_calls) == (2 * one.amount, "priced", 0)
    lost = _recorded_run(user, provider="openai", model="deepseek-chat", usages=[usage], started_extra=1)
    assert (lost.cost, lost.cost_status, lost.cost_unpriced_calls) == (None, "unavailable", 1)
    demo = _recorded_run(user, provider="demo", model="demo-agent", usages=[usage])
    assert (demo.cost, demo.cost_status) == (None, "demo")

    # An override added afterwards makes the stored cost disagree with the rule: verify_audit names it,
    # --refresh-facts rewrites it.
    _override("deepseek-chat", priced.created_at - dt.timedelta(days=1), inp="1", cached="1", out="1")
    out = StringIO()
    with pytest.raises(CommandError):  # a disagreeing fact fails verification, rewritten or not
        call_command("verify_audit", "--refresh-facts", stdout=out)
    stored = priced.cost.quantize(Decimal("1e-10"))
    wanted = f"run={priced.run_id} FACTS stored cost is {stored} (priced), recomputed 0.0030000000 (priced)"
    assert wanted in out.getvalue()
    assert f"run={lost.run_id} FACTS" not in out.getvalue()  # still unavailable under the override
    priced.refresh_from_db()
    assert priced.cost == Decimal(2 * 1500) / 10**6
    DiagnosisRun.objects.filter(pk=demo.pk).update(cost_status="")
    assert refresh_run_costs(only_unpriced=True) == 1
    demo.refresh_from_db()
    assert demo.cost_status == "demo"
