"""The views of the OpenID Connect flow (`/oidc/authenticate/`, `/oidc/callback/`, `/oidc/signed-out/`):
mozilla-django-oidc's, answering 404 while `OIDC_ENABLED` is off, with the provider's endpoints from
`access.oidc_provider`, a readable reason on the login page when a step fails (the provider unreachable
among them), the callback marking the session with the IdP's second factor (`access.sso`), and the
sign-out (`/admin/logout/`, `/oidc/logout/`) ending the provider's session too (`access.sso_logout`)."""

from __future__ import annotations

import json
import re

from django.contrib import admin
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render, resolve_url
from django.urls import reverse
from django.views.decorators.http import require_POST
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from access import oidc_provider, sso, sso_logout
from access.oidc import Refused, refuse_message
from access.passwords import provider_name

_ERROR_CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class AuthenticateView(OIDCAuthenticationRequestView):
    """`GET /oidc/authenticate/?next=…`: to the provider's authorization endpoint (state, nonce, PKCE, and
    the `claims` request for `amr`/`acr` when accepted values are set)."""

    def dispatch(self, request, *args, **kwargs):
        if not sso.enabled():
            raise Http404
        return super().dispatch(request, *args, **kwargs)

    def get(self, request):
        try:
            self.OIDC_OP_AUTH_ENDPOINT = oidc_provider.endpoint("authorization_endpoint")
            if not self.OIDC_OP_AUTH_ENDPOINT:
                raise Refused("the identity provider's authorization endpoint is not known")
        except Refused as exc:
            refuse_message(request, str(exc))
            return HttpResponseRedirect(resolve_url(self.get_settings("LOGIN_REDIRECT_URL_FAILURE", "/")))
        return super().get(request)

    def get_extra_params(self, request):
        params = dict(super().get_extra_params(request))
        claims = sso.claims_request()
        if claims:
            params["claims"] = json.dumps(claims, separators=(",", ":"))
        return params


class CallbackView(OIDCAuthenticationCallbackView):
    """`GET /oidc/callback/?code=…&state=…`: signs the user in (`access.oidc.OidcBackend`) or back to the
    login page with the reason."""

    def dispatch(self, request, *args, **kwargs):
        if not sso.enabled():
            raise Http404
        return super().dispatch(request, *args, **kwargs)

    def get(self, request):
        error = request.GET.get("error")
        if error:
            shown = error if _ERROR_CODE.fullmatch(error) else "error"
            refuse_message(request, f"the identity provider answered `{shown}`")
        try:
            return super().get(request)
        except SuspiciousOperation:
            refuse_message(request, "this sign-in was not started in this browser, or was used already")
            return self.login_failure()

    def login_failure(self):
        if not getattr(self.request, "sso_refused", ""):
            refuse_message(self.request, "the sign-in could not be completed")
        return super().login_failure()

    def login_success(self):
        response = super().login_success()
        sso.mark_session(
            self.request,
            self.user,
            getattr(self.user, "sso_second_factor", None),
            getattr(self.user, "sso_id_token", None),
        )
        return response


@require_POST
def sign_out(request):
    """`POST /admin/logout/` (the admin's and the chat's "Log out") and `/oidc/logout/`: a single sign-on
    session ends here and at the provider (`access.sso_logout`); any other is the admin's own logout."""
    if not sso_logout.is_sso_session(request):
        if request.path.startswith("/oidc/") and not sso.enabled():
            raise Http404
        return admin.site.logout(request)
    back = request.build_absolute_uri(reverse("oidc-signed-out"))
    target = sso_logout.sign_out(request, return_url=back)
    if not target:
        return HttpResponseRedirect(back)
    # A page that goes on to the provider, not a redirect: CSP `form-action 'self'` stops a form's
    # redirect to another origin (templates/access/signing_out.html).
    context = {**admin.site.each_context(request), "title": "Signing out", "provider": provider_name()}
    return render(request, "access/signing_out.html", {**context, "target": target})


def signed_out(request):
    """`GET /oidc/signed-out/` (the provider's `post_logout_redirect_uri`): says whether the provider's
    session ended too, and what to do when it may not have."""
    if not sso.enabled():
        raise Http404
    why = sso_logout.signed_out(request, request.GET.get("state"))
    context = {
        **admin.site.each_context(request),
        "title": "Signed out",
        "provider": provider_name(),
        "why": why,
        "sign_in_url": reverse("oidc_authentication_init"),
    }
    return render(request, "access/signed_out.html", context)
