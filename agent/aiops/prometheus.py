"""Prometheus: the HTTP API client, the bounding of a query result, and its `prom:` evidence id.

`PrometheusClient.from_settings()` (`PROMETHEUS_URL`, empty: `NotConfigured`) runs `query` and
`query_range`, returning results exactly as Prometheus gives them (sample values stay strings); a refused
query raises `BadQuery`. `metric_evidence(...)` turns a result into the one citable evidence payload of a
query: the result bounded (series, points, labels, label values, saying what was cut), its id
`prom:<16 hex>` over the canonical JSON of query, times and bounded result (anyone holding the payload
can recompute it), and readable `text` for the guard model.
Details: docs/aiops.md, *`query_metrics`*.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from agent.aiops.http import BadQuery, BadResponse, MonitoringHTTP
from agent.aiops.http import unavailable as server_unavailable
from audit.payloads import canonical_json, clip
from diagnosis.evidence import METRIC_HEX_CHARS, METRIC_RESULT

NAME = "Prometheus"
EVIDENCE_HEX_CHARS = METRIC_HEX_CHARS
# The id as minted here (`diagnosis.evidence`, group `digest`); the evidence guard extracts a looser form
# so a malformed id is refused, not ignored.
EVIDENCE_ID_RE = METRIC_RESULT.regex

SERIES_MAX = 20
POINTS_MAX = 60
LABELS_MAX = 30
LABEL_VALUE_CHARS = 200
TEXT_CHARS = 2000


@dataclass(frozen=True, slots=True)
class QueryResult:
    result_type: str
    result: Any
    warnings: tuple[str, ...] = ()


def unavailable() -> str | None:
    """Why `query_metrics` cannot run now (`PROMETHEUS_URL` not configured, or not ready), or None."""
    return server_unavailable(NAME, settings.PROMETHEUS_URL)


class PrometheusClient:
    """The Prometheus HTTP API (see the module docstring). Synchronous: the tools run on the tool pool."""

    def __init__(self, base_url: str, *, timeout: float, max_bytes: int) -> None:
        self.http = MonitoringHTTP(base_url, name=NAME, timeout=timeout, max_bytes=max_bytes)

    @classmethod
    def from_settings(cls) -> PrometheusClient:
        return cls(
            settings.PROMETHEUS_URL,
            timeout=float(settings.AIOPS_HTTP_TIMEOUT_SECONDS),
            max_bytes=int(settings.AIOPS_MAX_RESPONSE_BYTES),
        )

    def query(self, query: str, *, time: float) -> QueryResult:
        return self._get("/api/v1/query", {"query": query, "time": _num(time)})

    def query_range(self, query: str, *, start: float, end: float, step: float) -> QueryResult:
        params = {"query": query, "start": _num(start), "end": _num(end), "step": _num(step)}
        return self._get("/api/v1/query_range", params)

    def _get(self, path: str, params: dict[str, str]) -> QueryResult:
        status, body = self.http.request("GET", path, params=params)
        if isinstance(body, dict) and body.get("status") == "error":
            error_type, error = str(body.get("errorType", "")), clip(str(body.get("error", "")), 500)
            if status in (400, 422):
                raise BadQuery(f"{error_type}: {error}", error_type=error_type, error=error)
            raise self.http.http_error(status, body)
        if not 200 <= status < 300:
            raise self.http.http_error(status, body)
        data = body.get("data") if isinstance(body, dict) and body.get("status") == "success" else None
        if not isinstance(data, dict) or not isinstance(data.get("resultType"), str):
            raise BadResponse(f"{NAME} answered without a query result")
        warnings = body.get("warnings") or []
        return QueryResult(
            result_type=data["resultType"],
            result=data.get("result"),
            warnings=tuple(clip(str(w), 300) for w in warnings[:10]) if isinstance(warnings, list) else (),
        )


def _num(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


# ---------------------------------------------------------------------------------------------------
# Bounding and evidence
# ---------------------------------------------------------------------------------------------------
def _bound_metric(metric: Any) -> tuple[dict[str, str], bool]:
    if not isinstance(metric, dict):
        return {}, bool(metric)
    names = sorted(metric)
    cut = len(names) > LABELS_MAX
    out = {}
    for name in names[:LABELS_MAX]:
        value = str(metric[name])
        if len(value) > LABEL_VALUE_CHARS:
            value, cut = value[:LABEL_VALUE_CHARS], True
        out[str(name)[:LABEL_VALUE_CHARS]] = value
    return out, cut


def bound_result(result_type: str, result: Any) -> tuple[Any, dict[str, Any]]:
    """`(bounded result, facts)`; facts: `seriesTotal`, `pointsTotal`, `truncated` (module docstring)."""
    if result_type not in ("vector", "matrix"):
        return result, {"seriesTotal": 0, "pointsTotal": 0 if result is None else 1, "truncated": False}
    series = result if isinstance(result, list) else []
    truncated = len(series) > SERIES_MAX
    points_total = 0
    out = []
    for item in series[:SERIES_MAX] if truncated else series:
        item = item if isinstance(item, dict) else {}
        metric, cut = _bound_metric(item.get("metric"))
        truncated |= cut
        if result_type == "vector":
            points_total += 1
            out.append({"metric": metric, "value": item.get("value")})
        else:
            values = item.get("values") if isinstance(item.get("values"), list) else []
            points_total += len(values)
            if len(values) > POINTS_MAX:
                values, truncated = values[-POINTS_MAX:], True
            out.append({"metric": metric, "values": values})
    if truncated:
        for item in series[SERIES_MAX:]:
            points_total += 1 if result_type == "vector" else len((item or {}).get("values") or [])
    return out, {"seriesTotal": len(series), "pointsTotal": points_total, "truncated": truncated}


def evidence_id(core: dict[str, Any]) -> str:
    digest = hashlib.sha256(canonical_json(core).encode("utf-8")).hexdigest()
    return METRIC_RESULT.format(digest=digest[:EVIDENCE_HEX_CHARS])


def metric_evidence(*, query: str, window: dict[str, float], result: QueryResult) -> dict[str, Any]:
    """The evidence payload (with its `id`) of one query: `window` is `{"time": t}` for an instant query,
    `{"start", "end", "step"}` for a range."""
    kind = "range" if "step" in window else "instant"
    bounded, facts = bound_result(result.result_type, result.result)
    core = {"query": query, "kind": kind, **window, "resultType": result.result_type, "result": bounded}
    return {
        "id": evidence_id(core),
        "source": "prometheus",
        **core,
        **facts,
        "warnings": list(result.warnings),
        "title": f"Prometheus {kind} query",
        "heading": query,
        "text": describe(kind=kind, window=window, result_type=result.result_type, result=bounded, **facts),
    }


def _iso(ts: Any) -> str:
    try:
        return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError, OverflowError, OSError):
        return str(ts)


def _series_name(metric: dict[str, str]) -> str:
    name = metric.get("__name__", "")
    labels = ",".join(f'{k}="{v}"' for k, v in metric.items() if k != "__name__")
    return f"{name}{{{labels}}}" if labels or not name else name


def _sample(pair: Any) -> tuple[Any, str]:
    if isinstance(pair, list) and len(pair) == 2:
        return pair[0], str(pair[1])
    return None, str(pair)


def _as_float(value: str) -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return None if math.isnan(number) else number


def describe(
    *,
    kind: str,
    window: dict[str, float],
    result_type: str,
    result: Any,
    seriesTotal: int,
    pointsTotal: int,
    truncated: bool,
) -> str:
    """A bounded, readable account of a (bounded) result: one line per series."""
    if kind == "range":
        head = f"range {_iso(window['start'])} .. {_iso(window['end'])} step {window['step']:g}s"
    else:
        head = f"at {_iso(window['time'])}"
    lines = [f"{result_type} result {head}: {seriesTotal} series" + (" (truncated)" if truncated else "")]
    if result_type == "vector":
        for item in result:
            _ts, value = _sample(item.get("value"))
            lines.append(f"{_series_name(item['metric'])} = {value}")
    elif result_type == "matrix":
        for item in result:
            samples = [_sample(pair) for pair in item.get("values") or []]
            if not samples:
                lines.append(f"{_series_name(item['metric'])}: no samples")
                continue
            numbers = [n for n in (_as_float(v) for _ts, v in samples) if n is not None]
            span = f"{len(samples)} samples {_iso(samples[0][0])} .. {_iso(samples[-1][0])}"
            stats = f", min {min(numbers):g}, max {max(numbers):g}" if numbers else ""
            lines.append(
                f"{_series_name(item['metric'])}: {span}: first {samples[0][1]}, last {samples[-1][1]}{stats}"
            )
    else:
        _ts, value = _sample(result)
        lines.append(f"= {value}")
    if len(lines) == 1 and result_type in ("vector", "matrix"):
        lines.append("no series matched")
    return clip("\n".join(lines), TEXT_CHARS)
