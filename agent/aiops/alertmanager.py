"""Alertmanager: the API v2 client (alerts) and the bounding of an alert list.

`AlertmanagerClient.from_settings()` (`ALERTMANAGER_URL`, empty: `NotConfigured`) lists alerts
(`alerts(active_only=True, filters=())`, all matchers must match; a refused matcher raises `BadQuery`),
creates a silence (`create_silence`, only for an approved call of the tool) and lists silences.
`bound_alerts(alerts)` keeps at most `ALERTS_MAX` alerts, newest first, reduced to the fields an analysis
reads with bounded values, and says how many there were and whether any were cut.
Details: docs/aiops.md, *`list_alerts`* and *Approvals*.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings

from agent.aiops.http import BadQuery, BadResponse, MonitoringHTTP, host_of
from agent.aiops.http import unavailable as server_unavailable
from audit.payloads import clip

NAME = "Alertmanager"
ALERTS_MAX = 50
LABELS_MAX = 30
LABEL_VALUE_CHARS = 200
ANNOTATION_CHARS = 1000
URL_CHARS = 500


def unavailable() -> str | None:
    """Why `list_alerts` and `create_silence` cannot run now (`ALERTMANAGER_URL` not configured, or not
    ready), or None."""
    return server_unavailable(NAME, settings.ALERTMANAGER_URL)


def host() -> str:
    """The host (and port) of the configured Alertmanager: where a silence would be created."""
    return host_of(settings.ALERTMANAGER_URL)


class AlertmanagerClient:
    """The Alertmanager API v2 (see the module docstring). Synchronous: the tools run on the tool pool."""

    def __init__(self, base_url: str, *, timeout: float, max_bytes: int) -> None:
        self.http = MonitoringHTTP(base_url, name=NAME, timeout=timeout, max_bytes=max_bytes)

    @classmethod
    def from_settings(cls) -> AlertmanagerClient:
        return cls(
            settings.ALERTMANAGER_URL,
            timeout=float(settings.AIOPS_HTTP_TIMEOUT_SECONDS),
            max_bytes=int(settings.AIOPS_MAX_RESPONSE_BYTES),
        )

    def alerts(self, *, active_only: bool = True, filters: Sequence[str] = ()) -> list[dict[str, Any]]:
        params: list[tuple[str, str]] = []
        if active_only:
            params += [("active", "true"), ("silenced", "false"), ("inhibited", "false")]
        params += [("filter", matcher) for matcher in filters]
        status, body = self.http.request("GET", "/api/v2/alerts", params=params)
        if status == 400:
            error = clip(body if isinstance(body, str) else str(getattr(body, "text", body) or ""), 500)
            raise BadQuery(f"bad_filter: {error}", error_type="bad_filter", error=error)
        if not 200 <= status < 300:
            raise self.http.http_error(status, body)
        if not isinstance(body, list):
            raise BadResponse(f"{NAME} answered without an alert list")
        return [alert for alert in body if isinstance(alert, dict)]

    def create_silence(
        self,
        *,
        matchers: Sequence[dict[str, Any]],
        starts_at: str,
        ends_at: str,
        created_by: str,
        comment: str,
    ) -> str:
        """`POST /api/v2/silences`: the new silence's id. A silence Alertmanager refuses (HTTP 400: a
        bad matcher or time range) raises `BadQuery` (`error_type` "bad_silence")."""
        payload = {
            "matchers": [dict(m) for m in matchers],
            "startsAt": starts_at,
            "endsAt": ends_at,
            "createdBy": created_by,
            "comment": comment,
        }
        status, body = self.http.request("POST", "/api/v2/silences", json_body=payload)
        if status == 400:
            error = clip(body if isinstance(body, str) else str(getattr(body, "text", body) or ""), 500)
            raise BadQuery(f"bad_silence: {error}", error_type="bad_silence", error=error)
        if not 200 <= status < 300:
            raise self.http.http_error(status, body)
        if not isinstance(body, dict) or not isinstance(body.get("silenceID"), str):
            raise BadResponse(f"{NAME} answered without a silence id")
        return body["silenceID"]

    def silences(self) -> list[dict[str, Any]]:
        """`GET /api/v2/silences`: every silence Alertmanager holds (active, pending and expired)."""
        status, body = self.http.request("GET", "/api/v2/silences")
        if not 200 <= status < 300:
            raise self.http.http_error(status, body)
        if not isinstance(body, list):
            raise BadResponse(f"{NAME} answered without a silence list")
        return [silence for silence in body if isinstance(silence, dict)]


def _bound_map(value: Any, chars: int) -> tuple[dict[str, str], bool]:
    if not isinstance(value, dict):
        return {}, False
    names = sorted(value)
    cut = len(names) > LABELS_MAX
    out = {}
    for name in names[:LABELS_MAX]:
        text = str(value[name])
        if len(text) > chars:
            text, cut = text[:chars], True
        out[str(name)[:LABEL_VALUE_CHARS]] = text
    return out, cut


def bound_alerts(alerts: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`(bounded alerts, facts)`; facts: `alertsTotal`, `truncated` (module docstring)."""
    ordered = sorted(alerts, key=lambda a: (str(a.get("startsAt", "")), str(a.get("fingerprint", ""))))
    ordered.reverse()
    truncated = len(ordered) > ALERTS_MAX
    out = []
    for alert in ordered[:ALERTS_MAX]:
        labels, cut_labels = _bound_map(alert.get("labels"), LABEL_VALUE_CHARS)
        annotations, cut_annotations = _bound_map(alert.get("annotations"), ANNOTATION_CHARS)
        truncated |= cut_labels or cut_annotations
        status = alert.get("status") if isinstance(alert.get("status"), dict) else {}
        receivers = alert.get("receivers") if isinstance(alert.get("receivers"), list) else []
        out.append(
            {
                "fingerprint": str(alert.get("fingerprint", "")),
                "state": str(status.get("state", "")),
                "silencedBy": [str(s) for s in (status.get("silencedBy") or [])][:10],
                "inhibitedBy": [str(s) for s in (status.get("inhibitedBy") or [])][:10],
                "labels": labels,
                "annotations": annotations,
                "startsAt": str(alert.get("startsAt", "")),
                "endsAt": str(alert.get("endsAt", "")),
                "updatedAt": str(alert.get("updatedAt", "")),
                "generatorURL": clip(str(alert.get("generatorURL", "")), URL_CHARS),
                "receivers": [str(r.get("name", "")) for r in receivers if isinstance(r, dict)][:10],
            }
        )
    return out, {"alertsTotal": len(ordered), "truncated": truncated}
