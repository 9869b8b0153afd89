"""API tokens, stored as digests only.

A token is `<prefix>.<secret>`: the 8-character `prefix` is stored in clear to find candidate rows (and
to name a token in lists and logs), the whole token only as its SHA-256 `digest`. The plaintext is shown
once, when it is issued (`access.services.issue_token`), and is never stored or logged. SHA-256 rather
than a slow password hash: the secret is 32 random bytes (256 bits), so a stolen digest cannot be
brute-forced, and authentication stays one indexed read per request. A token has an expiry and can be
revoked; revoked and expired rows are kept (who revoked it, when) for the governance record.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

PREFIX_CHARS = 8


class ApiToken(models.Model):
    """One issued API token (`access_api_token`).

    `otp_verified` records that the token was issued to a user who had just passed a TOTP check (a
    verified admin session, or `issue_token --otp`): such a token satisfies `REASONING_REQUIRE_OTP`.
    `imported` marks a former DRF `authtoken` key hashed in by the migration (access 0002)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=PREFIX_CHARS, db_index=True)
    digest = models.CharField(max_length=64, unique=True)
    otp_verified = models.BooleanField(default=False)
    imported = models.BooleanField(default=False)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        db_table = "access_api_token"
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"token {self.prefix}… of {self.user_id}"

    @property
    def active(self) -> bool:
        return self.revoked_at is None and self.expires_at > timezone.now()


class OidcIdentity(models.Model):
    """The account an OpenID Connect identity signs in to (`access_oidc_identity`): the provider's
    `issuer` and the user's `subject` there (`iss`, `sub`: the only stable pair the spec guarantees; a
    username or email claim can be reassigned at the provider). Made at the identity's first sign-in
    (`access.oidc`); `last_login_at` is its latest."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identities"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(default=timezone.now)
    last_login_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "access_oidc_identity"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="uniq_oidc_identity")]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
