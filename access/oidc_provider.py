"""The identity provider as this service meets it over HTTP (`OIDC_ENABLED`): its discovery document
(`OIDC_OP_ISSUER` + `/.well-known/openid-configuration`, cached, its `issuer` checked), each endpoint from
an explicit `OIDC_OP_*` setting or else the document, its JWKS, the token request with the chosen client
authentication, and userinfo. No connection, a timeout or a 5xx is `Unreachable` (one content-free log
line); any other failure is `Refused` with a reason that may be shown to the person signing in.
Details: docs/security.md, *7. Single sign-on (OpenID Connect) and break-glass passwords*.
"""

from __future__ import annotations

import base64
import logging
import re
import threading
import time
from urllib.parse import quote

import requests
from django.conf import settings

from access.passwords import provider_name

logger = logging.getLogger(__name__)

WELL_KNOWN = "/.well-known/openid-configuration"
# discovery member → the setting that overrides it when set
ENDPOINTS = {
    "authorization_endpoint": "OIDC_OP_AUTHORIZATION_ENDPOINT",
    "token_endpoint": "OIDC_OP_TOKEN_ENDPOINT",
    "userinfo_endpoint": "OIDC_OP_USER_ENDPOINT",
    "jwks_uri": "OIDC_OP_JWKS_ENDPOINT",
    "end_session_endpoint": "OIDC_OP_END_SESSION_ENDPOINT",
}
AUTH_METHODS = ("client_secret_basic", "client_secret_post")  # what this client can do, in our order
_ERROR_CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")

_cache: dict[str, tuple[float, dict]] = {}  # URL → (monotonic deadline, document): discovery and JWKS
_lock = threading.Lock()


class Refused(Exception):
    """A sign-in refused for a reason that may be shown to the person signing in."""


class Unreachable(Refused):
    """The provider did not answer (no connection, a timeout) or answered with a server error."""

    def __init__(self) -> None:
        super().__init__(
            f"{provider_name()} is unreachable (no answer, a timeout or a server error); try again in a "
            "few minutes"
        )


def forget() -> None:
    """Drop the cached discovery documents and key sets (the next use fetches them again)."""
    with _lock:
        _cache.clear()


def call(what: str, method: str, url: str, **kwargs) -> requests.Response:
    """One request to the provider; `Unreachable` (logged by `what` and kind only) when it does not answer
    or answers 5xx. Redirects are not followed."""
    try:
        response = requests.request(
            method, url, timeout=float(settings.OIDC_TIMEOUT), allow_redirects=False, **kwargs
        )
    except requests.Timeout:
        kind = "timeout"
    except requests.RequestException as exc:
        kind = type(exc).__name__
    else:
        if response.status_code < 500:
            return response
        kind = f"HTTP {response.status_code}"
    logger.warning("single sign-on: identity provider unreachable at its %s endpoint (%s)", what, kind)
    raise Unreachable()


def _json(response: requests.Response, what: str) -> dict:
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code != 200 or not isinstance(body, dict):
        raise Refused(f"the identity provider's {what} did not answer with a JSON object")
    return body


def _cached(url: str) -> dict | None:
    with _lock:
        hit = _cache.get(url)
    return hit[1] if hit is not None and hit[0] > time.monotonic() else None


def _keep(url: str, document: dict) -> None:
    with _lock:
        _cache[url] = (time.monotonic() + max(0, int(settings.OIDC_DISCOVERY_CACHE_SECONDS)), document)


def discovery() -> dict:
    """The provider's discovery document (cached `OIDC_DISCOVERY_CACHE_SECONDS`); {} with discovery off.
    Refused when its `issuer` is not exactly `OIDC_OP_ISSUER` (OpenID Connect Discovery 4.3)."""
    if not settings.OIDC_OP_DISCOVERY:
        return {}
    issuer = str(settings.OIDC_OP_ISSUER)
    url = issuer.rstrip("/") + WELL_KNOWN
    document = _cached(url)
    if document is None:
        document = _json(call("discovery", "GET", url), "discovery document")
        if document.get("issuer") != issuer:
            raise Refused(
                "the identity provider's discovery document names another issuer than the one configured"
            )
        _keep(url, document)
    return document


def endpoint(member: str) -> str:
    """The provider's `member` endpoint: the explicit setting when set, else the discovery document's
    ("" when neither names one)."""
    explicit = getattr(settings, ENDPOINTS[member])
    if explicit:
        return str(explicit)
    value = discovery().get(member)
    return value if isinstance(value, str) and value.startswith(("https://", "http://")) else ""


def token_auth_method() -> str:
    """`OIDC_TOKEN_AUTH_METHOD` when set; else the first of the document's
    `token_endpoint_auth_methods_supported` this client can do (`client_secret_basic` when it lists none,
    the specification's default)."""
    if settings.OIDC_TOKEN_AUTH_METHOD:
        return str(settings.OIDC_TOKEN_AUTH_METHOD)
    advertised = discovery().get("token_endpoint_auth_methods_supported")
    if not isinstance(advertised, list) or not advertised:
        return "client_secret_basic"
    for method in advertised:
        if method in AUTH_METHODS:
            return method
    raise Refused("the identity provider offers no client authentication this service supports")


def redeem(form: dict) -> dict:
    """The token response for an authorization code `form` (grant, code, redirect_uri, verifier), the
    client authenticated as `token_auth_method` says."""
    url = endpoint("token_endpoint")
    if not url:
        raise Refused("the identity provider's token endpoint is not known")
    client_id, secret = str(settings.OIDC_RP_CLIENT_ID), str(settings.OIDC_RP_CLIENT_SECRET)
    headers = {"Accept": "application/json"}
    data = dict(form)
    if token_auth_method() == "client_secret_post":
        data.update(client_id=client_id, client_secret=secret)
    else:  # RFC 6749 2.3.1: each part form-encoded, then Basic
        pair = f"{quote(client_id, safe='')}:{quote(secret, safe='')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
    response = call("token", "POST", url, data=data, headers=headers)
    if response.status_code != 200:
        try:
            code = response.json().get("error", "")
        except (ValueError, AttributeError):
            code = ""
        shown = code if isinstance(code, str) and _ERROR_CODE.fullmatch(code) else "-"
        logger.warning("single sign-on token request refused: HTTP %s %s", response.status_code, shown)
        raise Refused("the identity provider did not accept the sign-in code")
    return _json(response, "token endpoint")


def jwks(*, fresh: bool = False) -> list[dict]:
    """The provider's signing keys (cached like the document; `fresh` fetches them again, for a key id
    not seen yet)."""
    url = endpoint("jwks_uri")
    if not url:
        raise Refused("the identity provider's JWKS endpoint is not known")
    document = None if fresh else _cached(url)
    if document is None:
        document = _json(call("jwks", "GET", url), "JWKS endpoint")
        _keep(url, document)
    keys = document.get("keys")
    return [key for key in keys if isinstance(key, dict)] if isinstance(keys, list) else []


def userinfo(access_token: str) -> dict | None:
    """The userinfo answer for `access_token`; None when the provider has no userinfo endpoint."""
    url = endpoint("userinfo_endpoint")
    if not url:
        return None
    response = call("userinfo", "GET", url, headers={"Authorization": f"Bearer {access_token}"})
    return _json(response, "userinfo endpoint")
