"""The record's MCP endpoint's requests, counted by method (a tool's name for tools/call, `http` for a
request refused before MCP) and outcome in this process, served on /metrics as
`diagnosis_mcp_server_requests_total` (registered at app start by `surfaces.apps`, without loading the
MCP SDK). Labels are fixed names and outcomes, never arguments."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily

_counts: Counter[tuple[str, str]] = Counter()
_lock = threading.Lock()


def count(method: str, outcome: str) -> None:
    with _lock:
        _counts[(method, outcome)] += 1


def counted() -> dict[tuple[str, str], int]:
    with _lock:
        return dict(_counts)


class RequestCounter:
    """The counts as a Prometheus counter family (`telemetry.metrics.register_process_collector`)."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "diagnosis_mcp_server_requests",
            "Requests to the record's MCP endpoint by method (tools/call: the tool) and outcome.",
            labels=["method", "outcome"],
        )
        for (method, outcome), n in sorted(counted().items()):
            family.add_metric([method, outcome], n)
        yield family
