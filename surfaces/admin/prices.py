"""Price overrides in the admin: staff with the model permissions add, change and retire them (set
`effective_to`; deleting one changes what past runs are recomputed to, which `verify_audit` reports)."""

from django.contrib import admin

from pricing.models import PriceOverride


@admin.register(PriceOverride)
class PriceOverrideAdmin(admin.ModelAdmin):
    list_display = (
        "model_pattern",
        "provider",
        "input_per_mtok",
        "cached_input_per_mtok",
        "output_per_mtok",
        "effective_from",
        "effective_to",
        "note",
    )
    list_filter = ("provider",)
    search_fields = ("model_pattern", "note")
    ordering = ("model_pattern", "-effective_from")
