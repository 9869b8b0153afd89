"""The two views of the OpenID Connect flow (`/oidc/authenticate/`, `/oidc/callback/`): mozilla-django-oidc's,
answering 404 while `OIDC_ENABLED` is off, with a readable reason on the login page when the callback
fails, and the callback marking the session with the second factor the IdP asserted (`access.sso`)."""

from __future__ import annotations

import re

from django.core.exceptions import SuspiciousOperation
from django.http import Http404
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from access import sso
from access.oidc import refuse_message

_ERROR_CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class AuthenticateView(OIDCAuthenticationRequestView):
    """`GET /oidc/authenticate/?next=…`: to the provider's authorization endpoint (state, nonce, PKCE)."""

    def dispatch(self, request, *args, **kwargs):
        if not sso.enabled():
            raise Http404
        return super().dispatch(request, *args, **kwargs)


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
        sso.mark_session(self.request, self.user, getattr(self.user, "sso_second_factor", None))
        return response
