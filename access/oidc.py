"""OpenID Connect sign-in (`OIDC_ENABLED`; docs/security.md): mozilla-django-oidc's authorization code
flow (with PKCE and a nonce) against the provider of `access.oidc_provider`, the ID token checked as
OpenID Connect Core 3.1.3.7 asks and the account found by (issuer, subject).

`OidcBackend.authenticate` answers only the callback view (`surfaces.oidc_views`), never a password form;
`verify_token` refuses an ID token that is not exactly this provider's, for this client, current and of
this browser's sign-in. A superuser is never linked; a refusal signs nobody in, is logged (never a
token) and is not counted by the lockout.
Details: docs/security.md, *7. Single sign-on (OpenID Connect) and break-glass passwords*.
"""

from __future__ import annotations

import hmac
import logging

import jwt
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation, ValidationError
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import absolutify

from access import oidc_provider, sso
from access.models import OidcIdentity
from access.oidc_provider import Refused
from access.passwords import provider_name

logger = logging.getLogger(__name__)

REQUIRED_CLAIMS = ["iss", "sub", "aud", "exp", "iat"]
__all__ = ["OidcBackend", "Refused", "refuse_message"]


def refuse_message(request, reason: str) -> None:
    logger.warning("single sign-on refused: %s", reason)
    if request is not None:
        request.sso_refused = reason
    if request is not None and hasattr(request, "_messages"):
        messages.error(request, f"Sign-in with {provider_name()} failed: {reason}.")


class OidcBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend with the checks above; inert while `OIDC_ENABLED` is off."""

    def __init__(self, *args, **kwargs) -> None:
        self.UserModel = get_user_model()
        if sso.enabled():
            super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------------------------------
    # The flow
    # ------------------------------------------------------------------------------------------
    def authenticate(self, request, **kwargs):
        # Only the callback view passes `nonce` (and `code_verifier`); a password form never does.
        if not sso.enabled() or request is None or "nonce" not in kwargs:
            return None
        self.request = request
        code, state = request.GET.get("code"), request.GET.get("state")
        if not code or not state:
            return None
        payload = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": absolutify(request, reverse("oidc_authentication_callback")),
        }
        if kwargs.get("code_verifier"):
            payload["code_verifier"] = kwargs["code_verifier"]
        try:
            tokens = oidc_provider.redeem(payload)  # Unreachable is a Refused too
            id_token = tokens.get("id_token")
            if not isinstance(id_token, str) or not id_token:
                raise Refused("the identity provider returned no ID token")
            claims = self.verify_token(id_token, nonce=kwargs.get("nonce"))
            return self.get_or_create_user(tokens.get("access_token"), id_token, claims)
        except Refused as exc:
            refuse_message(request, str(exc))
            return None

    def verify_token(self, token, **kwargs):
        """The ID token's claims, verified (see the module, step 2), or `Refused`."""
        nonce = kwargs.get("nonce")
        algorithm = self.OIDC_RP_SIGN_ALGO
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Refused("the ID token is not a signed JWT") from None
        if header.get("alg") != algorithm:
            raise Refused(f"the ID token is not signed with {algorithm}")
        key = self.retrieve_matching_jwk(token)
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=settings.OIDC_OP_ISSUER,
                leeway=int(settings.OIDC_CLOCK_SKEW_SECONDS),
                options={"require": REQUIRED_CLAIMS},
            )
        except jwt.ExpiredSignatureError:
            raise Refused("the ID token has expired") from None
        except jwt.InvalidIssuerError:
            raise Refused("the ID token was issued by another issuer than the one configured") from None
        except jwt.InvalidAudienceError:
            raise Refused("the ID token is not addressed to this application") from None
        except jwt.ImmatureSignatureError:
            raise Refused("the ID token is not valid yet") from None
        except jwt.MissingRequiredClaimError as exc:
            raise Refused(f"the ID token has no `{exc.claim}` claim") from None
        except jwt.PyJWTError:
            raise Refused("the ID token's signature or claims are invalid") from None
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if len(audiences) > 1 and claims.get("azp") != self.OIDC_RP_CLIENT_ID:
            raise Refused("the ID token was issued to another client (azp)")
        token_nonce = claims.get("nonce")
        if not (
            isinstance(nonce, str)
            and isinstance(token_nonce, str)
            and hmac.compare_digest(nonce.encode(), token_nonce.encode())
        ):
            raise Refused("the ID token does not carry this sign-in's nonce")
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            raise Refused("the ID token has no subject")
        return claims

    def retrieve_matching_jwk(self, token):
        """The provider's key for this token's `kid` and `alg` (the key set fetched again once for a
        key id not seen yet: the provider rotated)."""
        try:
            header = jwt.get_unverified_header(token)
            for fresh in (False, True):
                for jwk in oidc_provider.jwks(fresh=fresh):
                    if jwk.get("kid") == header.get("kid") and jwk.get("alg", header["alg"]) == header["alg"]:
                        return jwt.PyJWK(jwk)
        except (ValueError, KeyError, jwt.PyJWTError, SuspiciousOperation):
            pass
        raise Refused("no key of the identity provider's JWKS matches the ID token")

    def get_userinfo(self, access_token, id_token, payload):
        info = oidc_provider.userinfo(str(access_token or ""))
        if info is None:
            return {}
        if info.get("sub") != payload["sub"]:
            raise Refused("the userinfo response is about another subject than the ID token")
        return info

    def get_or_create_user(self, access_token, id_token, payload):
        userinfo = self.get_userinfo(access_token, id_token, payload)
        claims = {**userinfo, **payload}
        with transaction.atomic():
            user = self._account(claims)
            if not user.is_active:
                raise Refused("this account is deactivated")
            self.update_user(user, claims)
            sso.apply_claims(user, claims)
        # What the provider asserted about this sign-in: the signed ID token's amr/acr, else the
        # userinfo's (some providers put them only there); the ID token kept for the sign-out's hint.
        user.sso_second_factor = sso.second_factor(payload, userinfo)
        user.sso_id_token = id_token
        return user

    # ------------------------------------------------------------------------------------------
    # The account
    # ------------------------------------------------------------------------------------------
    def _account(self, claims: dict):
        issuer, subject = str(claims["iss"]), str(claims["sub"])
        identity = (
            OidcIdentity.objects.select_for_update()
            .select_related("user")
            .filter(issuer=issuer, subject=subject)
            .first()
        )
        if identity is not None:
            OidcIdentity.objects.filter(pk=identity.pk).update(last_login_at=timezone.now())
            return identity.user
        username = self._username(claims)
        existing = self.UserModel._default_manager.filter(**{self.UserModel.USERNAME_FIELD: username}).first()
        if existing is not None:
            if not settings.OIDC_LINK_EXISTING_USERS or existing.is_superuser:
                raise Refused(
                    f"an account named {username!r} already exists here and is not linked to this identity "
                    "(an administrator may allow linking with OIDC_LINK_EXISTING_USERS, never for superusers)"
                )
            user = existing
        else:
            user = self.UserModel._default_manager.create_user(username, email=self._email(claims))
        OidcIdentity.objects.create(user=user, issuer=issuer, subject=subject)
        logger.info("single sign-on identity linked user=%s new=%s", user.pk, existing is None)
        return user

    def _username(self, claims: dict) -> str:
        claim = settings.OIDC_USERNAME_CLAIM or "sub"
        username = claims.get(claim) or claims["sub"]
        field = self.UserModel._meta.get_field(self.UserModel.USERNAME_FIELD)
        try:
            field.run_validators(str(username))
            if len(str(username)) > (field.max_length or 150):
                raise ValidationError("too long")
        except ValidationError:
            raise Refused(f"the `{claim}` claim is not a valid username here") from None
        return str(username)

    @staticmethod
    def _email(claims: dict) -> str:
        email = claims.get("email")
        return email if isinstance(email, str) and len(email) <= 254 else ""

    def update_user(self, user, claims):
        changed = []
        values = {
            "email": self._email(claims),
            "first_name": str(claims.get("given_name") or "")[:150],
            "last_name": str(claims.get("family_name") or "")[:150],
        }
        for field, value in values.items():
            if value and getattr(user, field) != value:
                setattr(user, field, value)
                changed.append(field)
        if changed:
            user.save(update_fields=changed)
        return user

    def get_user(self, user_id):
        if not sso.enabled():
            return None  # turning single sign-on off ends its sessions
        user = self.UserModel._default_manager.filter(pk=user_id).first()
        return user if user is not None and user.is_active else None
