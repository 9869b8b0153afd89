"""The read replica on /metrics (`core.replica`, `core.db_router`): its lag, whether reads may use it,
and where the read scopes of this process went and why. Nothing is served without `DATABASE_REPLICA_URL`
but the counters (all reads on the primary, reason `unconfigured`)."""

from __future__ import annotations

from collections.abc import Iterator

from django.conf import settings
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from core.db_router import read_counts, replica_configured
from core.replica import monitor


class ReplicaCollector(Collector):
    """Lag and health measured at most every `DATABASE_REPLICA_CHECK_SECONDS` (the scrape may measure);
    the read counters of this process since it started."""

    def collect(self) -> Iterator[Metric]:
        if replica_configured():
            state = monitor.state()
            max_lag = float(settings.DATABASE_REPLICA_MAX_LAG_SECONDS)
            lag = GaugeMetricFamily(
                "diagnosis_db_replica_lag_seconds",
                "Age of the oldest heartbeat the read replica has not applied (0: it shows the newest; "
                "NaN: not measured, the replica or the primary did not answer).",
            )
            lag.add_metric([], float("nan") if state.lag is None else state.lag)
            yield lag
            healthy = GaugeMetricFamily(
                "diagnosis_db_replica_healthy",
                "1 when the read replica answers within DATABASE_REPLICA_MAX_LAG_SECONDS of lag (reads "
                "may go there), else 0 (reads go to the primary).",
            )
            healthy.add_metric([], 1.0 if state.usable(max_lag) else 0.0)
            yield healthy
        reads = CounterMetricFamily(
            "diagnosis_db_replica_reads",
            "Read scopes (pages, traces, exports, scrapes) opened by this process, by the database they "
            "read and why (replica; or the primary: unconfigured, down, lagging, unknown, pinned, fresh, "
            "transaction, failover).",
            labels=["database", "reason"],
        )
        for (database, reason), n in sorted(read_counts().items()):
            reads.add_metric([database, reason], n)
        yield reads
