"""Starting AI Ops analyses: from Alertmanager's webhook, from staff, from a shell. Writes only.

Every entry point ends in `start_analysis`, which creates in one transaction the session if needed, a
PENDING `AI_OPS` run and its `AiOpsAlert` row; nothing executes here (a queue worker claims the run).
`accept_notification` starts one run per distinct firing of an Alertmanager group (a re-sent firing
starts nothing; a resolved group stamps `resolved_at`), in the group's own session. The run's query is
`describe_alerts`' bounded plain text; it and the stored labels are redacted before they are stored. A
session an analysis starts is titled by its alert's name and severity (`analysis_title`).
Details: docs/aiops.md, *Starting analyses* and *The webhook*.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from agent.redaction import Redactor
from diagnosis import services
from diagnosis.models import AgentFlow, AiOpsAlert, AlertSource, ChatSession, DiagnosisRun

LABEL_CHARS = 200
VALUE_CHARS = 1000
MAX_LABELS = 40
MAX_ALERTS_DESCRIBED = 20
SESSION_PREFIX = "ses_am_"


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert of a notification, as Alertmanager sent it (validated by the API's serializer)."""

    status: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: str = ""
    ends_at: str = ""
    fingerprint: str = ""
    generator_url: str = ""


@dataclass(frozen=True, slots=True)
class Notification:
    """One webhook notification: an alert group and its alerts."""

    group_key: str
    status: str
    receiver: str = ""
    group_labels: Mapping[str, str] | None = None
    common_labels: Mapping[str, str] | None = None
    common_annotations: Mapping[str, str] | None = None
    external_url: str = ""
    alerts: Sequence[Alert] = ()
    truncated_alerts: int = 0


@dataclass(frozen=True, slots=True)
class Accepted:
    """What a notification or request started: the run it started, or the one it duplicates."""

    session_id: str
    run_id: str
    status: str
    deduplicated: bool


# ---------------------------------------------------------------------------------------------------
# Description of alerts (the run's query)
# ---------------------------------------------------------------------------------------------------
def bounded_mapping(values: Mapping[str, Any] | None) -> dict[str, str]:
    """At most `MAX_LABELS` string entries, keys and values cut to their bounds, sorted by key."""
    out: dict[str, str] = {}
    for key in sorted((values or {}).keys())[:MAX_LABELS]:
        out[str(key)[:LABEL_CHARS]] = str(values[key])[:VALUE_CHARS]
    return out


def _labels_text(labels: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in labels.items())


def describe_alerts(
    *, alerts: Sequence[Alert], group_labels: Mapping[str, str] | None = None, truncated: int = 0
) -> str:
    """The question an analysis answers: which alerts fire, with their labels, annotations and times."""
    firing = [a for a in alerts if a.status == "firing"] or list(alerts)
    lines = []
    if group_labels:
        lines.append(f"Alertmanager alert group firing: {_labels_text(bounded_mapping(group_labels))}")
    else:
        lines.append("Alert firing:")
    lines.append(f"Firing alerts: {len(firing) + truncated}")
    for alert in firing[:MAX_ALERTS_DESCRIBED]:
        labels = bounded_mapping(alert.labels)
        name = labels.pop("alertname", "") or "(unnamed alert)"
        severity = labels.pop("severity", "")
        head = f"- {name}" + (f" [severity {severity}]" if severity else "")
        if alert.starts_at:
            head += f" since {alert.starts_at}"
        lines.append(head)
        if labels:
            lines.append(f"  labels: {_labels_text(labels)}")
        for key, value in bounded_mapping(alert.annotations).items():
            lines.append(f"  {key}: {' '.join(value.split())}")
    hidden = len(firing) - MAX_ALERTS_DESCRIBED + truncated
    if hidden > 0:
        lines.append(f"(and {hidden} more alert(s) not listed)")
    lines.append(
        "Investigate: find the likely cause from live metrics, the active alerts and the runbooks, and "
        "say what to do next."
    )
    return "\n".join(lines)[: services.QUERY_MAX_CHARS]


# How a text names its alert, most explicit first: `alertname=HighLatency`, the description's own line
# (`- HighLatency [severity …]`), "Alert HighLatency …", and a text that starts with the name and says it
# fires ("HighLatency firing on api: …", the README's example).
_TEXT_NAME_RES = (
    re.compile(r"\balertname\s*[=:]\s*\"?([A-Za-z_][A-Za-z0-9_:]*)"),
    re.compile(r"^\s*-\s+([A-Za-z_][A-Za-z0-9_:]*)(?=\s*(?:\[severity|since\b|$))", re.M),
    re.compile(r"\bAlert\s+([A-Z][A-Za-z0-9_:]*)"),
    re.compile(r"^\s*([A-Z][A-Za-z0-9_:]*)\s+(?:is\s+)?(?:firing|fires|fired)\b"),
)
_NOT_NAMES = frozenset({"firing", "resolved", "group", "is", "the", "a"})
_TEXT_SEVERITY_RE = re.compile(r"\bseverity\s*[=:]?\s*\"?([a-z]+)", re.I)


def alert_name_in_text(text: str) -> str | None:
    """The alert name a text states (see `_TEXT_NAME_RES`), or None: the one reading of a text alert,
    for the intake (the stored `alertname`) and the offline demo model alike."""
    names = (m for pattern in _TEXT_NAME_RES for m in pattern.findall(text or ""))
    return next((m for m in names if m.lower() not in _NOT_NAMES), None)


class InvalidAlert(ValueError):
    """Something given as an alert that is not one; the message is safe to show."""


def alert_from_object(data: object) -> dict[str, Any]:
    """An Alertmanager alert as `start_staff_analysis` takes it (`labels`, `annotations`, `startsAt`),
    from what a person pastes or picks: an alert of the webhook payload or of the API v2 alert list, a
    list of alerts, or a whole webhook notification (its first firing alert, with the group's common
    labels and annotations under its own). `InvalidAlert` when there is no alert with string labels."""
    if isinstance(data, list):
        data = next((a for a in data if isinstance(a, dict)), None)
    if isinstance(data, dict) and isinstance(data.get("alerts"), list):
        alerts = [a for a in data["alerts"] if isinstance(a, dict)]
        firing = [a for a in alerts if a.get("status") in (None, "firing")] or alerts
        chosen = firing[0] if firing else None
        if chosen is None:
            raise InvalidAlert("The notification holds no alert.")
        common_labels = data.get("commonLabels") if isinstance(data.get("commonLabels"), dict) else {}
        common_notes = data.get("commonAnnotations")
        common_notes = common_notes if isinstance(common_notes, dict) else {}
        data = {
            **chosen,
            "labels": {**common_labels, **(chosen.get("labels") or {})},
            "annotations": {**common_notes, **(chosen.get("annotations") or {})},
        }
    if not isinstance(data, dict) or not isinstance(data.get("labels"), dict) or not data["labels"]:
        raise InvalidAlert("An alert is an object with labels (and optional annotations).")
    labels, annotations = data["labels"], data.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise InvalidAlert("annotations must be an object of strings.")
    for key, value in [*labels.items(), *annotations.items()]:
        if not isinstance(value, str):
            raise InvalidAlert(f"The value of {str(key)[:LABEL_CHARS]!r} is not a string.")
    starts = data.get("startsAt") or ""
    return {"labels": dict(labels), "annotations": dict(annotations), "startsAt": str(starts)[:64]}


def _name_and_severity(alerts: Sequence[Alert], common: Mapping[str, str] | None) -> tuple[str, str]:
    common = common or {}
    first = alerts[0].labels if alerts else {}
    name = common.get("alertname") or first.get("alertname") or ""
    severity = common.get("severity") or first.get("severity") or ""
    return str(name)[:200], str(severity)[:32]


def analysis_title(fields: Mapping[str, Any]) -> str:
    """The title of a session an analysis starts: the alert's name and severity, and how many more alerts
    fire with it ("HighLatency · critical", "DiskFull · warning · +2 more alerts"); "" for an analysis
    of a free question (the session then takes the question, as every session does). From the alert
    row's fields, so already redacted."""
    name = str(fields.get("alertname") or "")
    if not name:
        return ""
    parts = [name]
    if fields.get("severity"):
        parts.append(str(fields["severity"]))
    more = int(fields.get("alert_count") or 1) - 1
    if more > 0:
        parts.append(f"+{more} more alert{'s' if more > 1 else ''}")
    return " · ".join(parts)


# ---------------------------------------------------------------------------------------------------
# Starting a run
# ---------------------------------------------------------------------------------------------------
def service_user() -> AbstractBaseUser:
    """The owner of alert-group sessions (`AIOPS_SERVICE_USER`), created on first use without a usable
    password, so nobody can sign in as it."""
    User = get_user_model()
    name = str(settings.AIOPS_SERVICE_USER)
    user = User.objects.filter(username=name).first()
    if user is not None:
        return user
    try:
        with transaction.atomic():
            user = User(username=name)
            user.set_unusable_password()
            user.save()
            return user
    except IntegrityError:  # created concurrently
        return User.objects.get(username=name)


# Alert fields that are the service's own digests and counts, never text someone pasted.
_NOT_REDACTED = frozenset({"dedupe_key", "group_key_sha256", "fingerprints", "alert_count"})


def start_analysis(
    *,
    query: str,
    source: str,
    owner: AbstractBaseUser,
    session: ChatSession | None = None,
    session_id: str | None = None,
    alert_fields: Mapping[str, Any] | None = None,
    redactor: Redactor | None = None,
) -> DiagnosisRun:
    """A queued (PENDING) AI Ops run of `query` and its `AiOpsAlert` row, in one transaction. With
    `session_id` the session is that one (created for `owner` when absent: alert groups name theirs);
    `InvalidQuery` for a query `services.validate_query` refuses. An `IntegrityError` on `dedupe_key`
    (the same firing accepted concurrently) rolls everything back and propagates. `redactor`: the one
    that already redacted the alert's parts before they were bounded (a new one otherwise)."""
    query = services.validate_query(query)
    # The alert's text is redacted (agent.redaction) before anything stores it: the run's query and the
    # row's copies of the alert; the run keeps the facts (REDACTION_APPLIED, source `alert`).
    redactor = redactor if redactor is not None else Redactor()
    query = redactor.redact(query)
    fields = {
        name: value if name in _NOT_REDACTED else redactor.redact_value(value)
        for name, value in dict(alert_fields or {}).items()
    }
    redaction = redactor.take()
    # A session this analysis starts is titled by its alert (a session that exists keeps its title).
    title = analysis_title(fields)
    with transaction.atomic():
        if session is None and session_id:
            session = ChatSession.objects.filter(session_id=session_id).first()
            if session is None:
                session = services.create_session(owner=owner, session_id=session_id, title=title)
        if session is None:
            session = services.create_session(owner=owner, title=title)
        run = services.create_run(
            session=session, query=query, agent_flow=AgentFlow.AI_OPS, redaction=redaction
        )
        AiOpsAlert.objects.create(run=run, source=source, last_notified_at=timezone.now(), **fields)
    return run


def _redacted(notification: Notification, redactor: Redactor) -> tuple[Notification, list[Alert]]:
    """The notification and its firing alerts with their text redacted (labels, annotations, receiver,
    URLs); the group key and fingerprints stay as sent (they are hashed, and the stored group key is
    redacted with the row's fields)."""

    def alert(a: Alert) -> Alert:
        return replace(
            a,
            labels=redactor.redact_value(dict(a.labels)),
            annotations=redactor.redact_value(dict(a.annotations)),
            generator_url=redactor.redact(a.generator_url),
        )

    redacted = replace(
        notification,
        receiver=redactor.redact(notification.receiver),
        group_labels=redactor.redact_value(dict(notification.group_labels or {})),
        common_labels=redactor.redact_value(dict(notification.common_labels or {})),
        common_annotations=redactor.redact_value(dict(notification.common_annotations or {})),
        external_url=redactor.redact(notification.external_url),
        alerts=[alert(a) for a in notification.alerts],
    )
    return redacted, [a for a in redacted.alerts if a.status == "firing"]


def dedupe_key(group_key: str, firing: Sequence[Alert]) -> str:
    """sha256 over the group key and the firing alerts' (fingerprint, startsAt), order-independent."""
    members = sorted({(a.fingerprint, a.starts_at) for a in firing})
    blob = json.dumps([group_key, members], separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def group_session_id(group_key: str) -> str:
    return SESSION_PREFIX + hashlib.sha256(group_key.encode()).hexdigest()[:40]


def _existing(key: str) -> Accepted | None:
    row = (
        AiOpsAlert.objects.filter(dedupe_key=key)
        .select_related("run")
        .only("id", "run__run_id", "run__session_id", "run__status")
        .first()
    )
    if row is None:
        return None
    AiOpsAlert.objects.filter(pk=row.pk).update(
        notifications=F("notifications") + 1, last_notified_at=timezone.now()
    )
    return Accepted(
        session_id=row.run.session_id, run_id=row.run.run_id, status=row.run.status, deduplicated=True
    )


def accept_notification(notification: Notification) -> Accepted | None:
    """Start the analysis of a notification's firing alerts, or find the one already started for the
    same firing (see the module docstring). None when nothing fires (the group resolved)."""
    group_sha = hashlib.sha256(notification.group_key.encode()).hexdigest()
    firing = [a for a in notification.alerts if a.status == "firing"]
    if not firing:
        AiOpsAlert.objects.filter(group_key_sha256=group_sha, resolved_at__isnull=True).update(
            resolved_at=timezone.now()
        )
        return None
    key = dedupe_key(notification.group_key, firing)
    found = _existing(key)
    if found is not None:
        return found
    # Redacted before anything is cut to its bounds (a cut must not leave half a secret behind).
    redactor = Redactor()
    notification, firing = _redacted(notification, redactor)
    name, severity = _name_and_severity(firing, notification.common_labels)
    query = describe_alerts(
        alerts=firing, group_labels=notification.group_labels, truncated=notification.truncated_alerts
    )
    fields = {
        "dedupe_key": key,
        "group_key": notification.group_key[:1000],
        "group_key_sha256": group_sha,
        "receiver": notification.receiver[:200],
        "alertname": name,
        "severity": severity,
        "alert_count": len(firing) + notification.truncated_alerts,
        "fingerprints": [{"fingerprint": a.fingerprint, "startsAt": a.starts_at} for a in firing][:200],
        "labels": bounded_mapping(notification.common_labels),
        "annotations": bounded_mapping(notification.common_annotations),
        "external_url": notification.external_url[:500],
    }
    try:
        run = start_analysis(
            query=query,
            source=AlertSource.ALERTMANAGER,
            owner=service_user(),
            session_id=group_session_id(notification.group_key),
            alert_fields=fields,
            redactor=redactor,
        )
    except IntegrityError:
        found = _existing(key)  # the same firing, accepted by a concurrent request
        if found is None:
            raise
        return found
    return Accepted(session_id=run.session_id, run_id=run.run_id, status=run.status, deduplicated=False)


def start_staff_analysis(
    *,
    user: AbstractBaseUser,
    query: str | None = None,
    alert: Mapping[str, Any] | str | None = None,
    source: str = AlertSource.STAFF,
) -> DiagnosisRun:
    """An analysis a person asked for: a free question (`query`), or an alert given as text or as an
    Alertmanager-style object (`labels`, `annotations`, optional `startsAt`). A new session of `user`."""
    fields: dict[str, Any] = {}
    redactor = Redactor()
    if isinstance(alert, Mapping):
        alert = redactor.redact_value(dict(alert))  # before anything is cut to its bounds
        parsed = Alert(
            status="firing",
            labels=bounded_mapping(alert.get("labels")),
            annotations=bounded_mapping(alert.get("annotations")),
            starts_at=str(alert.get("startsAt") or "")[:64],
        )
        query = describe_alerts(alerts=[parsed])
        name, severity = _name_and_severity([parsed], None)
        fields = {
            "alertname": name,
            "severity": severity,
            "alert_count": 1,
            "labels": dict(parsed.labels),
            "annotations": dict(parsed.annotations),
        }
    elif isinstance(alert, str):
        query = alert
        name = alert_name_in_text(alert)
        if name:
            # A text that names its alert ("HighLatency firing on api: …") is that alert: its row names
            # it (and its severity when the text states one), the text is its summary.
            severity = _TEXT_SEVERITY_RE.search(alert)
            labels = {"alertname": name[:LABEL_CHARS]}
            if severity:
                labels["severity"] = severity.group(1).lower()[:32]
            fields = {
                "alertname": name[:200],
                "severity": labels.get("severity", ""),
                "alert_count": 1,
                "labels": labels,
                # Redacted before it is cut to its bound (a cut must not leave half a secret).
                "annotations": {"summary": " ".join(redactor.redact(alert).split())[:VALUE_CHARS]},
            }
    return start_analysis(
        query=query or "", source=source, owner=user, alert_fields=fields, redactor=redactor
    )
