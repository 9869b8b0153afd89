"""Negotiated or private prices that win over the maintained table (`genai-prices`).

A `PriceOverride` prices every call whose model name matches `model_pattern` (a shell-style glob,
case-insensitive: `deepseek-*`, `gpt-4o-mini`, `*`) and, when `provider` is not blank, whose run was
executed by that provider (`DiagnosisRun.provider`: `openai`, `demo`), between `effective_from`
(inclusive) and `effective_to` (exclusive; blank = open). Prices are US dollars per million tokens.
Which override applies when several match is the rule's choice (`pricing.rules.PriceBook`).
"""

from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

PRICE_DIGITS = {"max_digits": 14, "decimal_places": 6}


class PriceOverride(models.Model):
    model_pattern = models.CharField(
        max_length=128, help_text="Model name or shell-style pattern (case-insensitive), e.g. deepseek-*"
    )
    provider = models.CharField(
        max_length=32,
        blank=True,
        default="",
        help_text="Only runs of this provider (the run's provider, e.g. openai); blank: any provider",
    )
    input_per_mtok = models.DecimalField(
        "input $/M tokens", validators=[MinValueValidator(Decimal(0))], **PRICE_DIGITS
    )
    cached_input_per_mtok = models.DecimalField(
        "cached input $/M tokens",
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal(0))],
        help_text="Blank: cached input is priced as input",
        **PRICE_DIGITS,
    )
    output_per_mtok = models.DecimalField(
        "output $/M tokens (reasoning included)", validators=[MinValueValidator(Decimal(0))], **PRICE_DIGITS
    )
    effective_from = models.DateTimeField()
    effective_to = models.DateTimeField(null=True, blank=True, help_text="Exclusive; blank: still in force")
    note = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "pricing_override"
        ordering = ["model_pattern", "-effective_from"]

    def __str__(self) -> str:
        return f"{self.model_pattern} from {self.effective_from:%Y-%m-%d}"

    def clean(self):
        if self.effective_to is not None and self.effective_from and self.effective_to <= self.effective_from:
            raise ValidationError({"effective_to": "Must be after the start."})
