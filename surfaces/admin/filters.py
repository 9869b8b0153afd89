"""The run list's own filters over stored, indexed columns (`surfaces.admin.runs`): audit complete,
unverified text delivered, cost, reconciled; and filters whose choices all have a name people read (an
empty stored value is an empty link to a screen reader): `NamedValuesFilter` lists a column's distinct
values, the empty one under its own label."""

from __future__ import annotations

from decimal import Decimal

from django.contrib import admin

from diagnosis.models import ReleaseDecision
from pricing.rules import CostStatus


class AuditCompleteFilter(admin.SimpleListFilter):
    """Runs whose stored `audit_complete` fact (`audit.read.list_facts`) is true or false (an indexed
    column)."""

    title = "audit complete"
    parameter_name = "audit_complete"

    def lookups(self, request, model_admin):
        return (("yes", "Yes"), ("no", "No"))

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(audit_complete=self.value() == "yes")
        return queryset


class UnverifiedDeliveredFilter(admin.SimpleListFilter):
    """Runs whose unverified draft text was streamed to a reader (`draft_chars > 0`)."""

    title = "unverified text delivered"
    parameter_name = "unverified"

    def lookups(self, request, model_admin):
        return (("yes", "Yes"), ("blocked", "Yes, and blocked"), ("no", "No"))

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(draft_chars__gt=0)
        if self.value() == "blocked":
            return queryset.filter(draft_chars__gt=0, release_decision=ReleaseDecision.BLOCKED)
        if self.value() == "no":
            return queryset.filter(draft_chars=0)
        return queryset


class CostFilter(admin.SimpleListFilter):
    """The run's stored cost (`pricing`): why it has none, or a range (indexed: `cost_status` with
    `created_at`, `cost`)."""

    title = "cost"
    parameter_name = "cost"
    RANGES = {
        "lt0.001": ("< $0.001", None, Decimal("0.001")),
        "0.001-0.01": ("$0.001 – $0.01", Decimal("0.001"), Decimal("0.01")),
        "0.01-0.1": ("$0.01 – $0.10", Decimal("0.01"), Decimal("0.1")),
        "ge0.1": ("≥ $0.10", Decimal("0.1"), None),
    }

    def lookups(self, request, model_admin):
        return (
            ("unavailable", "Unavailable (a call not priced)"),
            ("demo", "Demo (no price)"),
            ("not_priced", "Not priced yet"),
            *((key, label) for key, (label, _lo, _hi) in self.RANGES.items()),
        )

    def queryset(self, request, queryset):
        value = self.value()
        if value in (CostStatus.UNAVAILABLE, CostStatus.DEMO):
            return queryset.filter(cost_status=value)
        if value == "not_priced":
            return queryset.filter(cost_status=CostStatus.NOT_PRICED)
        if value in self.RANGES:
            _label, lo, hi = self.RANGES[value]
            queryset = queryset.filter(cost__isnull=False)
            if lo is not None:
                queryset = queryset.filter(cost__gte=lo)
            if hi is not None:
                queryset = queryset.filter(cost__lt=hi)
        return queryset


class ReconciledFilter(admin.BooleanFieldListFilter):
    """`tokens_reconciled`, titled as the console names it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.title = "reconciled"


class NamedValuesFilter(admin.SimpleListFilter):
    """The distinct values of `field` (at most `MAX_CHOICES`), "" shown as `empty_label` (and sent as
    `EMPTY`)."""

    field = ""
    empty_label = "none"
    EMPTY = "none"
    MAX_CHOICES = 50

    def lookups(self, request, model_admin):
        values = (
            model_admin.model.objects.order_by(self.field).values_list(self.field, flat=True).distinct()
        )[: self.MAX_CHOICES]
        return [(value or self.EMPTY, value or self.empty_label) for value in values if value is not None]

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(**{self.field: "" if value == self.EMPTY else value})


class ProviderFilter(NamedValuesFilter):
    title = "provider"
    parameter_name = "provider"
    field = "provider"
    empty_label = "not recorded"
