"""List filters of the console's lists whose choices all have a name people read (an empty stored value
is an empty link to a screen reader): `NamedValuesFilter` lists a column's distinct values, the empty
one under its own label."""

from __future__ import annotations

from django.contrib import admin


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
