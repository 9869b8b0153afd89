from django.apps import AppConfig


class PricingConfig(AppConfig):
    """What a model call cost: the one pricing rule (`pricing.rules`), the admin-editable price overrides
    and the runs' stored cost (`pricing.costs`)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "pricing"
    verbose_name = "Pricing"
