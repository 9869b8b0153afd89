"""The "Analyse an alert" page (`/admin/diagnosis/diagnosisrun/analyse/`): staff start an AI Ops analysis
from the browser and watch it run.

Three forms say which alert: one firing in the configured Alertmanager (only its fingerprint is posted;
the alert is read again when the form is sent), pasted JSON (`agent.aiops.intake.alert_from_object`) or
name, severity, labels and annotations. Each starts the analysis through the API's own service
(`agent.aiops.intake.start_staff_analysis`: the alert redacted before anything is stored) and redirects
to the chat page of its session. GET reads, POST writes (CSRF-protected); staff who may view runs.
Details: docs/admin.md, *Analyse an alert*.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.conf import settings
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode

from agent.aiops import intake
from agent.aiops.alertmanager import AlertmanagerClient, bound_alerts
from agent.aiops.http import AiOpsError, NotConfigured
from diagnosis.models import AlertSource
from diagnosis.services import InvalidQuery

PASTE_MAX_CHARS = 100_000
NAME_RE = r"^[A-Za-z_][A-Za-z0-9_:]*$"


def _pairs(text: str, what: str) -> dict[str, str]:
    """`key=value` lines (or `key: value`) as a mapping; blank lines are skipped."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        sep = "=" if "=" in line and (":" not in line or line.index("=") < line.index(":")) else ":"
        key, found, value = line.partition(sep)
        if not found or not key.strip():
            raise forms.ValidationError(f"{what}, line {number}: write it as name=value.")
        out[key.strip()] = value.strip().strip('"')
    return out


class FiringAlertForm(forms.Form):
    fingerprint = forms.CharField(
        max_length=64, error_messages={"required": "Pick one of the firing alerts."}
    )


class PastedAlertForm(forms.Form):
    alert_json = forms.CharField(
        label="Alert (JSON)",
        max_length=PASTE_MAX_CHARS,
        widget=forms.Textarea(attrs={"rows": 10, "spellcheck": "false"}),
        help_text="An alert from Alertmanager's webhook payload or its API (GET /api/v2/alerts), or a whole "
        "webhook notification (its first firing alert is analysed).",
    )

    def clean_alert_json(self) -> dict[str, Any]:
        try:
            data = json.loads(self.cleaned_data["alert_json"])
        except ValueError as exc:
            raise forms.ValidationError(f"This is not JSON ({exc}).") from None
        try:
            return intake.alert_from_object(data)
        except intake.InvalidAlert as exc:
            raise forms.ValidationError(str(exc)) from None


class SimpleAlertForm(forms.Form):
    alertname = forms.RegexField(
        label="Alert name",
        regex=NAME_RE,
        max_length=200,
        error_messages={"invalid": "A name of letters, digits, _ and :, as in Prometheus (HighLatency)."},
    )
    severity = forms.CharField(label="Severity", max_length=32, required=False)
    labels = forms.CharField(
        label="Other labels",
        required=False,
        max_length=10_000,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text="One per line: job=api",
    )
    annotations = forms.CharField(
        label="Annotations",
        required=False,
        max_length=20_000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One per line: summary=p99 latency above 2 s",
    )

    def clean_labels(self) -> dict[str, str]:
        return _pairs(self.cleaned_data["labels"], "Labels")

    def clean_annotations(self) -> dict[str, str]:
        return _pairs(self.cleaned_data["annotations"], "Annotations")

    def alert(self) -> dict[str, Any]:
        data = self.cleaned_data
        labels = {**data["labels"], "alertname": data["alertname"]}
        if data["severity"]:
            labels["severity"] = data["severity"]
        return {"labels": labels, "annotations": data["annotations"], "startsAt": ""}


def firing_alerts() -> tuple[list[dict[str, Any]], str]:
    """The active alerts of the configured Alertmanager (bounded, newest first) and, when there are none
    to show, why: not configured, or what went wrong asking it."""
    try:
        alerts = AlertmanagerClient.from_settings().alerts(active_only=True)
    except NotConfigured:
        return [], "No Alertmanager is configured (ALERTMANAGER_URL): paste the alert or describe it below."
    except AiOpsError as exc:
        return [], f"Alertmanager at {settings.ALERTMANAGER_URL} could not be read: {exc}"
    bounded, _facts = bound_alerts(alerts)
    if not bounded:
        return [], "No alert is firing in Alertmanager right now."
    for alert in bounded:  # the labels besides the name and severity, which have their own columns
        alert["other_labels"] = [
            f"{k}={v}" for k, v in alert["labels"].items() if k not in ("alertname", "severity")
        ]
    return bounded, ""


def _start(request, alert: dict[str, Any]):
    run = intake.start_staff_analysis(user=request.user, alert=alert, source=AlertSource.STAFF)
    return HttpResponseRedirect(reverse("chat") + "?" + urlencode({"session": run.session_id}))


def analyse_view(model_admin, request):
    """GET: the three forms (and the firing alerts); POST `mode` = firing | paste | simple: start the
    analysis and redirect to its live page, or the page again with the form's errors."""
    firing, firing_note = firing_alerts()
    forms_by_mode = {
        "firing": FiringAlertForm(prefix="firing"),
        "paste": PastedAlertForm(prefix="paste"),
        "simple": SimpleAlertForm(prefix="simple"),
    }
    status = 200
    if request.method == "POST":
        mode = request.POST.get("mode", "")
        if mode not in forms_by_mode:
            mode = "simple"
        form = type(forms_by_mode[mode])(request.POST, prefix=mode)
        forms_by_mode[mode] = form
        if form.is_valid():
            alert = None
            if mode == "firing":
                chosen = form.cleaned_data["fingerprint"]
                alert = next((a for a in firing if a["fingerprint"] == chosen), None)
                if alert is None:
                    form.add_error("fingerprint", "That alert is no longer firing in Alertmanager.")
                else:
                    alert = intake.alert_from_object(alert)
            elif mode == "paste":
                alert = form.cleaned_data["alert_json"]
            else:
                alert = form.alert()
            if alert is not None:
                try:
                    return _start(request, alert)
                except InvalidQuery as exc:
                    form.add_error(None, str(exc))
        status = 400
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": "Analyse an alert",
        "firing": firing,
        "firing_note": firing_note,
        "firing_form": forms_by_mode["firing"],
        "paste_form": forms_by_mode["paste"],
        "simple_form": forms_by_mode["simple"],
        "alertmanager_url": settings.ALERTMANAGER_URL,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/diagnosis/diagnosisrun/analyse.html", context, status=status)
