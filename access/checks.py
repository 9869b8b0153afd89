"""System checks of sign-in settings (errors stop `runserver`, `migrate` and `check --deploy`).

`access.E001`–`E002`: the local password policy (`LOCAL_PASSWORD_LOGIN`, `BREAK_GLASS_USERNAMES`);
`access.E003`–`E006`: single sign-on's settings (client, issuer and, without discovery, endpoints;
`OIDC_GROUP_MAP`; an asymmetric `OIDC_RP_SIGN_ALGO`; `OIDC_LOGOUT`, `OIDC_TOKEN_AUTH_METHOD`);
`access.W001`: a non-https OIDC URL with DEBUG off. A typo never picks a policy, and nobody is left
unable to sign in when the identity provider is down. Nothing is fetched from the provider here.
Details: docs/security.md, *7. Single sign-on (OpenID Connect) and break-glass passwords*.
"""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Warning, register

from access.oidc_provider import AUTH_METHODS
from access.passwords import MODES
from access.sso_logout import MODES as LOGOUT_MODES
from core.groups import GOVERNED

ASYMMETRIC = {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"}
REQUIRED = ("OIDC_RP_CLIENT_ID", "OIDC_RP_CLIENT_SECRET", "OIDC_OP_ISSUER")
# without discovery (OIDC_OP_DISCOVERY=false) these must be set too
WITHOUT_DISCOVERY = ("OIDC_OP_AUTHORIZATION_ENDPOINT", "OIDC_OP_TOKEN_ENDPOINT", "OIDC_OP_JWKS_ENDPOINT")
URLS = ("OIDC_OP_ISSUER", *WITHOUT_DISCOVERY, "OIDC_OP_USER_ENDPOINT", "OIDC_OP_END_SESSION_ENDPOINT")


@register()
def check_password_policy(app_configs=None, **kwargs) -> list[Error]:
    mode = str(settings.LOCAL_PASSWORD_LOGIN or "").strip().lower()
    if mode not in MODES:
        return [
            Error(
                f"LOCAL_PASSWORD_LOGIN={mode!r} is not a password policy.",
                hint="Use `all` (default) or `breakglass` (only BREAK_GLASS_USERNAMES superusers).",
                id="access.E001",
            )
        ]
    if mode == "breakglass" and not settings.BREAK_GLASS_USERNAMES:
        return [
            Error(
                "LOCAL_PASSWORD_LOGIN=breakglass names no break-glass account.",
                hint="Set BREAK_GLASS_USERNAMES to the superuser(s) who may sign in with a password.",
                id="access.E002",
            )
        ]
    return []


def _map_errors(raw) -> list[str]:
    if not isinstance(raw, dict):
        return ["OIDC_GROUP_MAP must be a JSON object"]
    bad = []
    for idp_group, targets in raw.items():
        names = [targets] if isinstance(targets, str) else targets
        if not isinstance(names, list) or not names:
            bad.append(f"{idp_group!r} maps to no group")
            continue
        bad.extend(f"{idp_group!r} → {name!r}" for name in names if name not in GOVERNED)
    return bad


@register()
def check_oidc(app_configs=None, **kwargs) -> list:
    if not settings.OIDC_ENABLED:
        return []
    problems: list = []
    required = REQUIRED if settings.OIDC_OP_DISCOVERY else (*REQUIRED, *WITHOUT_DISCOVERY)
    missing = [name for name in required if not getattr(settings, name)]
    if missing:
        problems.append(
            Error(
                f"OIDC_ENABLED is on but these are not set: {', '.join(missing)}.",
                hint="The client is registered at the provider; the issuer and (with OIDC_OP_DISCOVERY off) "
                "the endpoints are in its /.well-known/openid-configuration.",
                id="access.E003",
            )
        )
    bad = _map_errors(settings.OIDC_GROUP_MAP)
    if bad:
        problems.append(
            Error(
                "OIDC_GROUP_MAP has entries that are not governed groups: " + "; ".join(bad) + ".",
                hint=f"Map IdP group names to one or more of: {', '.join(GOVERNED)}.",
                id="access.E004",
            )
        )
    if settings.OIDC_RP_SIGN_ALGO not in ASYMMETRIC:
        problems.append(
            Error(
                f"OIDC_RP_SIGN_ALGO={settings.OIDC_RP_SIGN_ALGO!r} is not an asymmetric JWS algorithm.",
                hint="Use the provider's signing algorithm, e.g. RS256 (its keys come from the JWKS).",
                id="access.E005",
            )
        )
    problems.extend(_choice_errors())
    if not settings.DEBUG:
        plain = [name for name in URLS if str(getattr(settings, name)).startswith("http://")]
        if plain:
            problems.append(
                Warning(
                    f"{', '.join(plain)} {'is' if len(plain) == 1 else 'are'} not https.",
                    hint="Tokens and the client secret travel over them: use the provider's https URLs.",
                    id="access.W001",
                )
            )
    return problems


def _choice_errors() -> list[Error]:
    choices = {"OIDC_LOGOUT": LOGOUT_MODES, "OIDC_TOKEN_AUTH_METHOD": ("", *AUTH_METHODS)}
    return [
        Error(
            f"{name}={getattr(settings, name)!r} is not one of: {', '.join(v for v in allowed if v)}.",
            hint="docs/configuration.md, Single sign-on (OpenID Connect).",
            id="access.E006",
        )
        for name, allowed in choices.items()
        if getattr(settings, name) not in allowed
    ]
