"""What single sign-on decides from an identity provider's claims (`access.oidc` verifies them first).

* `apply_claims`: on every sign-in the groups claim, mapped through `OIDC_GROUP_MAP`, sets the user's
  governed groups (added when asserted, removed when no longer asserted; other groups never touched),
  and `is_staff` follows; a superuser's flags are never changed. Each change is a governance event.
* `claims_request` / `second_factor` / `mark_session`: `amr`/`acr` are asked for (the `claims`
  parameter) while accepted values are set; an accepted one makes the session count as step-up
  verified, bound to that user and the single sign-on backend; any other sign-in clears it.
Details: docs/security.md, *7. Single sign-on* (groups, sign-out) and *3. Step-up* (the second factor).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY
from django.contrib.auth.models import Group
from django.contrib.auth.signals import user_logged_in
from django.dispatch import receiver

from access.middleware import acting_as
from core.groups import GOVERNED

logger = logging.getLogger(__name__)

ACTOR = "(single sign-on)"  # parentheses and a space: no Django username can be spelled so
BACKEND = "access.oidc.OidcBackend"
SECOND_FACTOR_KEY = "access_sso_second_factor"
ID_TOKEN_KEY = "access_sso_id_token"  # noqa: S105 (a session key) — the sign-in's ID token: the `id_token_hint` of the sign-out


def enabled() -> bool:
    return bool(settings.OIDC_ENABLED)


def group_map() -> dict[str, tuple[str, ...]]:
    """`OIDC_GROUP_MAP` as IdP group → governed groups (the check access.E004 refuses other targets)."""
    raw = settings.OIDC_GROUP_MAP or {}
    mapped: dict[str, tuple[str, ...]] = {}
    for idp_group, targets in raw.items():
        names = (targets,) if isinstance(targets, str) else tuple(targets)
        mapped[str(idp_group)] = tuple(name for name in names if name in GOVERNED)
    return mapped


def asserted_groups(claims: dict) -> list[str]:
    value = claims.get(settings.OIDC_GROUPS_CLAIM or "groups")
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [str(item) for item in value if isinstance(item, str | int)]
    return []


def granted_groups(claims: dict) -> dict[str, list[str]]:
    """Governed group → the asserted IdP groups that map to it."""
    mapping = group_map()
    granted: dict[str, list[str]] = {}
    for idp_group in asserted_groups(claims):
        for name in mapping.get(idp_group, ()):
            granted.setdefault(name, []).append(idp_group)
    return granted


def apply_claims(user, claims: dict) -> dict[str, list[str]]:
    """Make `user`'s governed groups and staff flag what `claims` assert (see the module); the changes,
    as {"added": [...], "removed": [...]}. Call inside the sign-in's transaction."""
    granted = granted_groups(claims)
    source = {
        "kind": "oidc",
        "issuer": str(claims.get("iss", ""))[:200],
        "subject": str(claims.get("sub", ""))[:200],
        "claim": settings.OIDC_GROUPS_CLAIM,
    }
    held = {g.name: g for g in user.groups.filter(name__in=GOVERNED)}
    groups = {g.name: g for g in Group.objects.filter(name__in=list(granted))}
    added, removed = [], []
    for name in sorted(set(granted) - set(held)):
        if name not in groups:  # made after every migrate (access.groups): absent only mid-setup
            logger.warning("single sign-on: governed group %r does not exist; not granted", name)
            continue
        with acting_as(ACTOR, source={**source, "idpGroups": granted[name]}):
            user.groups.add(groups[name])
        added.append(name)
    for name in sorted(set(held) - set(granted)):
        with acting_as(ACTOR, source={**source, "idpGroups": []}):
            user.groups.remove(held[name])
        removed.append(name)
    staff = bool((set(held) - set(removed)) | set(added)) or user.is_superuser
    if user.is_staff != staff:
        user.is_staff = staff
        with acting_as(ACTOR, source={**source, "idpGroups": sorted(asserted_groups(claims))[:50]}):
            user.save(update_fields=["is_staff"])
    if added or removed:
        logger.info("single sign-on groups user=%s added=%s removed=%s", user.pk, added, removed)
    return {"added": added, "removed": removed}


def claims_request() -> dict | None:
    """The OpenID Connect `claims` request parameter (Core 5.5) asking for `amr` and/or `acr` in the ID
    token and at userinfo while `OIDC_ACCEPTED_AMR` / `OIDC_ACCEPTED_ACR` name values to accept (many
    certified providers release `amr` only when asked so); None when neither is set."""
    wanted = {}
    if settings.OIDC_ACCEPTED_AMR:
        wanted["amr"] = None
    if settings.OIDC_ACCEPTED_ACR:
        wanted["acr"] = None
    return {"id_token": dict(wanted), "userinfo": dict(wanted)} if wanted else None


def second_factor(id_token_claims: dict, userinfo: dict | None = None) -> dict | None:
    """The accepted second factor asserted ({"amr": [...], "acr": ...}), or None: each of `amr` and
    `acr` from the signed ID token, else from the provider's userinfo answer (same `sub`, checked)."""
    accepted_amr = {str(v) for v in settings.OIDC_ACCEPTED_AMR or ()}
    accepted_acr = {str(v) for v in settings.OIDC_ACCEPTED_ACR or ()}
    userinfo = userinfo or {}
    amr = id_token_claims["amr"] if "amr" in id_token_claims else userinfo.get("amr")
    amr = [str(v) for v in amr] if isinstance(amr, list) else []
    acr = id_token_claims["acr"] if "acr" in id_token_claims else userinfo.get("acr")
    acr = str(acr) if isinstance(acr, str | int) else ""
    matched = sorted(accepted_amr.intersection(amr))
    if matched or (acr and acr in accepted_acr):
        return {"amr": matched, "acr": acr if acr in accepted_acr else ""}
    return None


def mark_session(request, user, factor: dict | None, id_token: str | None = None) -> None:
    """After a single sign-on login: record (or clear) the second factor the IdP asserted, and keep the
    ID token for the provider's sign-out (`access.sso_logout`)."""
    if factor:
        request.session[SECOND_FACTOR_KEY] = {"user": user.pk, **factor}
    else:
        request.session.pop(SECOND_FACTOR_KEY, None)
    if id_token:
        request.session[ID_TOKEN_KEY] = id_token
    else:
        request.session.pop(ID_TOKEN_KEY, None)


def session_second_factor(request) -> bool:
    """Whether this session's user signed in through the IdP with an accepted second factor."""
    session = getattr(request, "session", None)
    user = getattr(request, "user", None)
    if session is None or user is None or not getattr(user, "is_authenticated", False):
        return False
    marked = session.get(SECOND_FACTOR_KEY)
    return bool(
        enabled()
        and isinstance(marked, dict)
        and marked.get("user") == user.pk
        and session.get(BACKEND_SESSION_KEY) == BACKEND
    )


@receiver(user_logged_in, dispatch_uid="access.sso_clear_second_factor")
def _clear_on_login(sender, request=None, user=None, **kwargs) -> None:
    # Any login starts without the IdP's second factor; the single sign-on callback marks it afterwards.
    session = getattr(request, "session", None)
    if session is not None:
        session.pop(SECOND_FACTOR_KEY, None)
        session.pop(ID_TOKEN_KEY, None)
