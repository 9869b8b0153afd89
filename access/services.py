"""Writes of access governance: issuing and revoking API tokens. Each write and its governance event
(`audit.write.record_governance_event`) commit together or not at all. Keyword-only arguments; log
lines name users by id and tokens by prefix, never a token's text."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from access.models import ApiToken
from access.stepup import ISSUE_OTP_MESSAGE, token_needs_otp
from access.tokens import digest_of, new_token, prefix_of
from audit.models import GovernanceEventType
from audit.write import record_governance_event

logger = logging.getLogger(__name__)

MAX_TTL_HOURS = 24 * 366


class TokenNeedsOtp(PermissionError):
    """The user may read reasoning and `REASONING_REQUIRE_OTP` is on: no token without a TOTP check."""

    def __init__(self, message: str = ISSUE_OTP_MESSAGE) -> None:
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """A new token: `plaintext` exists only here, to be shown once; `token` is the stored row."""

    token: ApiToken
    plaintext: str


def issue_token(
    *, user, actor: str = "", ttl_hours: float | None = None, name: str = "", otp_verified: bool = False
) -> IssuedToken:
    """Issue a token to `user`, valid for `ttl_hours` (default `API_TOKEN_TTL_HOURS`; at most a year).
    `otp_verified` is set only by callers that have just seen the user pass a TOTP check; without it a
    user who may read reasoning gets no token while `REASONING_REQUIRE_OTP` is on (`TokenNeedsOtp`,
    `access.stepup.token_needs_otp`)."""
    hours = settings.API_TOKEN_TTL_HOURS if ttl_hours is None else ttl_hours
    if not 0 < hours <= MAX_TTL_HOURS:
        raise ValueError(f"ttl_hours must be in (0, {MAX_TTL_HOURS}]")
    if not otp_verified and token_needs_otp(user):
        logger.info("api token refused user=%s: may read reasoning, no TOTP check", user.pk)
        raise TokenNeedsOtp()
    plaintext = new_token()
    now = timezone.now()
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user,
            name=name[:100],
            prefix=prefix_of(plaintext),
            digest=digest_of(plaintext),
            otp_verified=otp_verified,
            created_at=now,
            expires_at=now + dt.timedelta(hours=hours),
        )
        record_governance_event(
            event_type=GovernanceEventType.TOKEN_ISSUED,
            actor=actor or user.get_username(),
            subject_user=user.get_username(),
            details={
                "tokenId": token.pk,
                "prefix": token.prefix,
                "expiresAt": token.expires_at.isoformat(),
                "otpVerified": otp_verified,
            },
        )
    logger.info("api token issued user=%s prefix=%s otp=%s", user.pk, token.prefix, otp_verified)
    return IssuedToken(token=token, plaintext=plaintext)


def revoke_token(*, token: ApiToken, actor: str) -> bool:
    """Revoke `token` (kept, with who revoked it and when); False when it was revoked already."""
    with transaction.atomic():
        updated = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_by=actor[:150]
        )
        if not updated:
            return False
        token.refresh_from_db()
        record_governance_event(
            event_type=GovernanceEventType.TOKEN_REVOKED,
            actor=actor,
            subject_user=token.user.get_username(),
            details={"tokenId": token.pk, "prefix": token.prefix},
        )
    logger.info("api token revoked user=%s prefix=%s", token.user_id, token.prefix)
    return True


def record_break_glass_sign_in(*, user, address: str) -> None:
    """A password sign-in while local passwords are turned off for everyone else
    (`LOCAL_PASSWORD_LOGIN=breakglass`): the governance event `BREAK_GLASS_SIGN_IN`, so the use of the
    account kept for when the identity provider is down is in the signed chain, not only in a log."""
    record_governance_event(
        event_type=GovernanceEventType.BREAK_GLASS_SIGN_IN,
        actor=user.get_username(),
        subject_user=user.get_username(),
        details={"address": address[:64], "channel": "password"},
    )
    logger.warning("break-glass password sign-in user=%s", user.pk)
