"""Service metrics in Prometheus' text format (`GET /metrics`, `telemetry.views.metrics`).

Record metrics (`RecordCollector`) come from the database at scrape time in a fixed number of aggregate
queries over a sliding window (`METRICS_WINDOW_SECONDS`), cached `METRICS_CACHE_SECONDS`, so every
process reports the same numbers at the same cost whatever the number of stored runs. Process metrics
(`register_process_gauge`: active runs, live followers; prometheus_client's process collector) are per
process. Nothing here reads or exposes content: labels are enumerations, model names and tool names.
Details: docs/observability.md, *Service metrics: `GET /metrics`*.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.db.models import BigIntegerField, Count, Max, Q, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.utils import timezone
from prometheus_client import CollectorRegistry, Gauge, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from core.db_router import reads_from_replica
from telemetry.replica_metrics import ReplicaCollector

RUN_SECONDS_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
RELEASE_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30)
SWEEP_CODES = ("LEASE_EXPIRED", "QUEUE_EXPIRED")


def window_seconds() -> int:
    """The record metrics' window (`METRICS_WINDOW_SECONDS`, default 3600, at least 60)."""
    return max(60, int(settings.METRICS_WINDOW_SECONDS))


def _reported(path: str) -> Q:
    """The JSON key at `path` holds a value: present and not JSON null (casting null would give 0)."""
    return Q(**{f"{path}__isnull": False}) & ~Q(**{path: None})


def _histogram(name: str, doc: str, queryset, field: str, buckets: tuple[float, ...]) -> Metric:
    """A cumulative histogram of `field` (milliseconds) over `queryset`, in one aggregate query (a JSON
    key of `details` is annotated as an integer first)."""
    if field.startswith("details__"):
        # Only a stored number counts: a missing key or JSON null (not measured) is left out, never 0.
        queryset = queryset.filter(_reported(field)).annotate(_ms=Cast(KT(field), BigIntegerField()))
        field = "_ms"
    aggregates: dict[str, Any] = {
        f"le{i}": Count("id", filter=Q(**{f"{field}__lte": bound * 1000})) for i, bound in enumerate(buckets)
    }
    aggregates["count"] = Count("id", filter=Q(**{f"{field}__isnull": False}))
    aggregates["sum"] = Sum(field)
    row = queryset.aggregate(**aggregates)
    family = HistogramMetricFamily(name, doc, unit="")
    family.add_metric(
        [],
        [(str(bound), row[f"le{i}"]) for i, bound in enumerate(buckets)] + [("+Inf", row["count"])],
        sum_value=(row["sum"] or 0) / 1000.0,
    )
    return family


@reads_from_replica
def record_metrics() -> list[Metric]:
    """The record metrics as of now (see the module docstring), in this order: the window's runs, their
    ledgers (tokens, cost, guard latency, gaps), tool calls, sweeps, the OTLP export outbox, the
    transparency log's checkpoints and witnesses."""
    from diagnosis.models import DiagnosisRun
    from diagnosis.selectors import production

    window = window_seconds()
    since = timezone.now() - dt.timedelta(seconds=window)
    recent_runs = production(DiagnosisRun.objects.filter(created_at__gte=since))
    families = _run_metrics(recent_runs, window)
    families += _ledger_metrics(recent_runs, since)
    families += _tool_metrics(since)
    families += _sweep_metrics(recent_runs)
    families += _export_metrics()
    families += _checkpoint_metrics()
    families.extend(witness_metrics())
    families.append(anchor_refusals())
    return families


def _run_metrics(recent_runs, window: int) -> list[Metric]:
    """The window, the window's runs by flow, status and release, and the finished ones' latencies."""
    from diagnosis.models import TERMINAL_RUN_STATUSES

    families: list[Metric] = []
    families.append(
        GaugeMetricFamily(
            "diagnosis_metrics_window_seconds",
            "The sliding window the record metrics cover (runs, steps and tool calls created in it).",
            value=window,
        )
    )
    runs = GaugeMetricFamily(
        "diagnosis_runs",
        "Runs created in the window by flow, status and release decision.",
        labels=["flow", "status", "release"],
    )
    for row in (
        recent_runs.values("agent_flow", "status", "release_decision").annotate(n=Count("id")).order_by()
    ):
        runs.add_metric([row["agent_flow"], row["status"], row["release_decision"] or ""], row["n"])
    families.append(runs)

    finished = recent_runs.filter(status__in=TERMINAL_RUN_STATUSES)
    families.append(
        _histogram(
            "diagnosis_run_duration_seconds",
            "Finished runs of the window by total duration (creation to finish).",
            finished,
            "total_duration_ms",
            RUN_SECONDS_BUCKETS,
        )
    )
    families.append(
        _histogram(
            "diagnosis_release_latency_seconds",
            "Runs of the window by the time from the answer's last token to the release decision.",
            finished,
            "release_latency_ms",
            RELEASE_SECONDS_BUCKETS,
        )
    )
    return families


def _ledger_metrics(recent_runs, since) -> list[Metric]:
    """What the window's ledgers hold: tokens by source and by model, cost, the semantic guard's
    latency, and the gaps (calls without usage, failed and fenced audit writes)."""
    from audit.models import EventType, TraceEvent

    families: list[Metric] = []
    ledger = recent_runs.aggregate(
        router=Sum("tokens_router"),
        agent=Sum("tokens_agent"),
        guard=Sum("tokens_guard"),
        failures=Sum("audit_write_failures"),
        fenced=Sum("fenced_writes"),
        unavailable=Sum("usage_unavailable_calls"),
    )
    tokens = GaugeMetricFamily(
        "diagnosis_tokens", "Tokens in the ledgers of the window's runs by source.", labels=["source"]
    )
    for source in ("router", "agent", "guard"):
        tokens.add_metric([source], ledger[source] or 0)
    families.append(tokens)
    families.append(_model_token_metric(since))
    families.extend(_cost_metrics(since))
    families.append(
        _histogram(
            "diagnosis_guard_duration_seconds",
            "Semantic guard model calls of the window by their recorded duration.",
            TraceEvent.objects.filter(event_type=EventType.SEMANTIC_GUARD_DECISION, created_at__gte=since),
            "details__durationMs",
            RELEASE_SECONDS_BUCKETS,
        )
    )
    families.append(
        GaugeMetricFamily(
            "diagnosis_usage_unavailable_calls",
            "Model calls of the window's runs whose provider reported no token usage.",
            value=ledger["unavailable"] or 0,
        )
    )
    families.append(
        GaugeMetricFamily(
            "diagnosis_audit_write_failures",
            "Durable audit writes that failed (fail-open), summed over the runs of the window.",
            value=ledger["failures"] or 0,
        )
    )
    families.append(
        GaugeMetricFamily(
            "diagnosis_fenced_writes",
            "Writes of stale lease owners refused by the lease fence, summed over the runs of the window.",
            value=ledger["fenced"] or 0,
        )
    )
    return families


def _model_token_metric(since) -> Metric:
    """Tokens of the window's model calls by source, model and kind."""
    from audit.models import EventType, TraceEvent

    by_model = GaugeMetricFamily(
        "diagnosis_model_tokens",
        "Tokens of the window's model calls (router, agents, semantic guard) by source, model and kind, "
        "as the provider reported them (a kind no call reported is absent, never 0).",
        labels=["source", "model", "kind"],
    )
    # One row per (source, model) from the calls' MODEL_TOKEN_USAGE events (the ledger's own record),
    # read through the (event_type, created_at) index.
    kinds = (("input", "promptTokens"), ("output", "completionTokens"))
    kinds += (("reasoning", "reasoningTokens"), ("cache_read", "cachedTokens"))
    for row in (
        TraceEvent.objects.filter(
            event_type=EventType.MODEL_TOKEN_USAGE, status="REPORTED", created_at__gte=since
        )
        .values(source=KT("details__source"), model=KT("details__model"))
        .annotate(
            **{
                kind: Sum(Cast(KT(f"details__{key}"), BigIntegerField()), filter=_reported(f"details__{key}"))
                for kind, key in kinds
            }
        )
        .order_by()
    ):
        for kind, _key in kinds:
            if row[kind] is not None:
                by_model.add_metric([str(row["source"]).lower(), str(row["model"]), kind], row[kind])
    return by_model


def _cost_metrics(since) -> list[Metric]:
    """Cost of the window's model calls by source and model, and the calls that could not be priced."""
    from audit.read.dashboard import priced_usage
    from pricing.costs import load_price_book

    # Cost by the pricing rule (`pricing.rules`) of the window's calls, summed per source and model
    # (`audit.read.dashboard.priced_usage`: one GROUP BY, plus the price overrides); calls that cannot be
    # priced (unknown model, no usage, the demo model) are counted, never priced at 0.
    cost = GaugeMetricFamily(
        "diagnosis_model_cost_dollars",
        "Cost in US dollars of the window's model calls by source and model (priced calls only).",
        labels=["source", "model"],
    )
    unpriced = GaugeMetricFamily(
        "diagnosis_model_calls_unpriced",
        "Model calls of the window whose cost is unavailable, by source, model and reason.",
        labels=["source", "model", "reason"],
    )
    priced_sum: dict[tuple[str, str], float] = {}
    for row in priced_usage(since=since, until=timezone.now(), book=load_price_book(), by_day=False):
        key = (row.source.lower(), row.model)
        if row.cost is not None:
            priced_sum[key] = priced_sum.get(key, 0.0) + float(row.cost)
            if row.without_usage:
                unpriced.add_metric([*key, "usage_unavailable"], row.without_usage)
        else:
            unpriced.add_metric([*key, row.cost_status], row.calls)
    for key, value in sorted(priced_sum.items()):
        cost.add_metric(list(key), value)
    return [cost, unpriced]


def _tool_metrics(since) -> list[Metric]:
    """Tool invocations of the window by tool and status."""
    from audit.models import ToolInvocation

    tools = GaugeMetricFamily(
        "diagnosis_tool_calls",
        "Tool invocations of the window by tool and status.",
        labels=["tool", "status"],
    )
    for row in (
        ToolInvocation.objects.filter(created_at__gte=since)
        .values("tool_name", "status")
        .annotate(n=Count("id"))
        .order_by()
    ):
        tools.add_metric([row["tool_name"], row["status"]], row["n"])
    return [tools]


def _sweep_metrics(recent_runs) -> list[Metric]:
    """Runs of the window the sweeper failed, by reason."""
    swept = GaugeMetricFamily(
        "diagnosis_runs_swept", "Runs of the window failed by the sweeper, by reason.", labels=["reason"]
    )
    counts = {
        row["error_code"]: row["n"]
        for row in recent_runs.filter(error_code__in=SWEEP_CODES)
        .values("error_code")
        .annotate(n=Count("id"))
        .order_by()
    }
    for code in SWEEP_CODES:
        swept.add_metric([code], counts.get(code, 0))
    return [swept]


def _export_metrics() -> list[Metric]:
    """The OTLP export outbox: runs by state, and how long the oldest waits."""
    from telemetry.selectors import export_backlog

    backlog = export_backlog()
    exports = GaugeMetricFamily(
        "diagnosis_otlp_exports", "Runs in the OTLP export outbox by state.", labels=["state"]
    )
    for state, n in backlog.by_state.items():
        exports.add_metric([state], n)
    return [
        exports,
        GaugeMetricFamily(
            "diagnosis_otlp_export_lag_seconds",
            "How long the oldest finished run not yet exported has waited (0: none waits).",
            value=backlog.lag_seconds,
        ),
    ]


def _checkpoint_metrics() -> list[Metric]:
    """The age of the newest signed checkpoint (none before the first)."""
    from audit.models import Checkpoint

    newest = Checkpoint.objects.aggregate(at=Max("signed_at"))["at"]
    if newest is None:
        return []
    return [
        GaugeMetricFamily(
            "diagnosis_checkpoint_age_seconds",
            "Seconds since the newest signed checkpoint of the transparency log.",
            value=max(0.0, (timezone.now() - newest).total_seconds()),
        )
    ]


@reads_from_replica
def anchor_refusals() -> Metric:
    """Finished runs the checkpointer refused to anchor because their record did not authenticate
    (`audit.transparency.gate`: each recorded once in an ANCHOR_REFUSED governance event): a counter over
    the record's life. Alert on any increase: someone wrote a run's record who was not the service."""
    from audit.transparency.gate import reported_refusals

    return CounterMetricFamily(
        "diagnosis_audit_anchor_refusals",
        "Finished runs the checkpointer refused to anchor: their chain, write tags or row digests did not "
        "authenticate (alert on any increase).",
        value=len(reported_refusals()),
    )


@reads_from_replica
def witness_metrics() -> list[Metric]:
    """The witnesses' outcomes (`audit.transparency.witnesses`): refusals and failures by witness and
    reason since the start of the record (a counter: every attempt is a stored row), and the newest tree
    size each witness cosigned. Two GROUP BY queries over their own small tables."""
    from audit.models import CheckpointCosignature, WitnessAttempt, WitnessOutcome

    failures = CounterMetricFamily(
        "diagnosis_audit_witness_failures",
        "Checkpoint submissions a witness refused or that failed, by witness and reason (alert on any "
        "increase: a witness that refuses may have seen another history of the log).",
        labels=["witness", "reason"],
    )
    for row in (
        WitnessAttempt.objects.exclude(outcome=WitnessOutcome.COSIGNED)
        .values("witness", "outcome")
        .annotate(n=Count("id"))
        .order_by("witness", "outcome")
    ):
        failures.add_metric([row["witness"], row["outcome"]], row["n"])
    cosigned = GaugeMetricFamily(
        "diagnosis_audit_witness_last_cosigned_size",
        "The largest checkpoint tree size each witness cosigned (compare with the newest checkpoint's).",
        labels=["witness"],
    )
    for row in (
        CheckpointCosignature.objects.values("witness")
        .annotate(size=Max("checkpoint__tree_size"))
        .order_by("witness")
    ):
        cosigned.add_metric([row["witness"]], row["size"])
    return [failures, cosigned]


class RecordCollector(Collector):
    """The record metrics, recomputed at most every `METRICS_CACHE_SECONDS` (per process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = 0.0
        self._families: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        ttl = float(settings.METRICS_CACHE_SECONDS)
        with self._lock:
            if not self._families or time.monotonic() - self._at >= ttl:
                self._families = record_metrics() + [m for source in _record_sources for m in source()]
                self._at = time.monotonic()
            families = list(self._families)
        yield from families


_registry: CollectorRegistry | None = None
_registry_lock = threading.Lock()
# Gauges of this process's own state, registered by the layer that owns the value (the agent registers
# its active runs and live followers in `agent.apps`), so that telemetry never imports the runtime.
_process_gauges: dict[str, tuple[str, Callable[[], float]]] = {}


# Record metrics of higher layers (evaluation scores: `evaluations.metrics`), registered at app start:
# each a function returning metric families, read with the others and cached with them.
_record_sources: list[Callable[[], list[Metric]]] = []


def register_record_source(source: Callable[[], list[Metric]]) -> None:
    """Serve `source()`'s families with the record metrics (same window, same cache)."""
    if source not in _record_sources:
        _record_sources.append(source)


def register_process_gauge(name: str, documentation: str, read: Callable[[], float]) -> None:
    """Serve `read()` as the gauge `name` on /metrics; call at app start, before the first scrape."""
    with _registry_lock:
        if _registry is not None and name not in _process_gauges:
            raise RuntimeError(f"process gauge {name} registered after the registry was built")
        _process_gauges[name] = (documentation, read)


# Counters of this process kept by a higher layer (the record's MCP endpoint: `surfaces.mcp.server`),
# collected at each scrape like the gauges.
_process_collectors: list[Collector] = []


def register_process_collector(collector: Collector) -> None:
    """Serve `collector` (this process's own counts) on /metrics; call at app start, before the first
    scrape."""
    with _registry_lock:
        if _registry is not None:
            raise RuntimeError("process collector registered after the registry was built")
        _process_collectors.append(collector)


def registry() -> CollectorRegistry:
    """This process's registry: the record collector, the process gauges and the process collector."""
    global _registry
    with _registry_lock:
        if _registry is None:
            built = CollectorRegistry(auto_describe=False)
            built.register(RecordCollector())
            built.register(ReplicaCollector())
            for name, (documentation, read) in sorted(_process_gauges.items()):
                Gauge(name, documentation, registry=built).set_function(read)
            for collector in _process_collectors:
                built.register(collector)
            ProcessCollector(registry=built)
            _registry = built
        return _registry
