"""Run configurations in the console (issue 34, item 1): the run list's configuration filter and column,
and the configuration page (`configurations/<fingerprint>/`).

A configuration is what `agent.runtime.configuration` fingerprinted when a run started (prompt digests,
models and parameters, tool schemas, knowledge snapshot, guards, release policy), kept once per
fingerprint in `diagnosis.RunConfiguration`. The list filters on the indexed `config_fingerprint` and
shows its first 12 digits, linked to the runs of the same configuration; the page shows the document,
the prompt texts its digests cover, and how many runs executed under it. Staff who may view runs, like
every page hung off the run admin.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import Http404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from agent.runtime.configuration import short_fingerprint
from diagnosis.models import DiagnosisRun
from diagnosis.selectors import FINGERPRINT_SHAPE, recent_configurations, run_configurations

PARAMETER = "config"


def _label(config) -> str:
    document = config.document or {}
    models = document.get("models") or {}
    knowledge = document.get("knowledge") or {}
    agent = models.get("agent") or models.get("executor") or "?"
    return (
        f"{short_fingerprint(config.fingerprint)} · {document.get('flow', '?')} · {agent} · "
        f"{knowledge.get('documents', '?')} runbooks"
    )


class ConfigurationFilter(admin.SimpleListFilter):
    """Runs of one configuration (`config_fingerprint`, indexed with `created_at`): the newest
    configurations are offered; any fingerprint given in the address (the column's link) applies."""

    title = "configuration"
    parameter_name = PARAMETER

    def lookups(self, request, model_admin):
        offered = [(c.fingerprint, _label(c)) for c in recent_configurations()]
        value = self.value()
        if value and value not in {fp for fp, _ in offered} and FINGERPRINT_SHAPE.match(value):
            offered.append((value, short_fingerprint(value)))
        return [("none", "Not recorded"), *offered]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "none":
            return queryset.filter(config_fingerprint="")
        if value:
            return queryset.filter(config_fingerprint=value if FINGERPRINT_SHAPE.match(value) else "-")
        return queryset


def runs_of_configuration_url(fingerprint: str) -> str:
    return reverse("admin:diagnosis_diagnosisrun_changelist") + "?" + urlencode({PARAMETER: fingerprint})


def configuration_url(fingerprint: str) -> str:
    return reverse("admin:diagnosis_diagnosisrun_configuration", args=[fingerprint])


def config_cell(run: DiagnosisRun):
    """The list's cell: the short fingerprint, linked to the configuration page, with the full one as
    its title; "—" for a run that recorded none."""
    if not run.config_fingerprint:
        return "—"
    return format_html(
        '<a class="dc-mono" href="{}" title="{}">{}</a>',
        configuration_url(run.config_fingerprint),
        run.config_fingerprint,
        short_fingerprint(run.config_fingerprint),
    )


def _leaves(value, prefix: str = "") -> list[tuple[str, object]]:
    if isinstance(value, dict):
        rows: list[tuple[str, object]] = []
        for key in sorted(value):
            rows += _leaves(value[key], f"{prefix}.{key}" if prefix else str(key))
        return rows
    if isinstance(value, list):
        return [(prefix, ", ".join(str(v) for v in value))]
    return [(prefix, value)]


def configuration_view(model_admin, request, fingerprint: str):
    config = run_configurations(fingerprints=[fingerprint]).get(fingerprint)
    if config is None:
        raise Http404("No configuration has this fingerprint.")
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": f"Configuration {short_fingerprint(fingerprint)}",
        "config": config,
        "rows": _leaves(config.document),
        "prompts": sorted((config.prompts or {}).items()),
        "runs": DiagnosisRun.objects.filter(config_fingerprint=fingerprint).count(),
        "runs_url": runs_of_configuration_url(fingerprint),
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/diagnosis/diagnosisrun/configuration.html", context)
