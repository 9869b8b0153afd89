"""Deny by default (`core.api.ApiView`): every DRF view under /api/ is an ApiView, every endpoint refuses
anonymous requests with 401 unless its view says otherwise, and a view whose role is checked on its
object cannot answer without that check. Walks the real URLconf, so a new endpoint is held to it."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission
from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.response import Response
from rest_framework.test import APIClient, APIRequestFactory, force_authenticate
from rest_framework.views import APIView

from audit.write.retention import place_hold
from core.api import NOT_FOUND_RUN, ApiView, RolePermission
from surfaces.chat import sse
from tests.factories import issue_token, make_recorded_run

pytestmark = pytest.mark.django_db

# DRF views under /api/ that are not ApiViews, each with its reason: drf-spectacular's schema and
# Swagger UI describe the API and hold no data (public by `SPECTACULAR_SETTINGS`, docs/api.md).
PUBLIC_THIRD_PARTY = (SpectacularAPIView, SpectacularSwaggerSplitView)
# Plain (async) Django views under /api/: the chat stream, events and cancel. DRF has no async or
# streaming views; `surfaces.chat.sse` says how they keep the same rules.
CHAT_VIEWS = {sse.chat_stream: "post", sse.run_events: "get", sse.cancel_run: "post"}
METHODS = ("get", "post", "put", "patch", "delete")


def _api_routes(patterns=None, prefix: str = ""):
    """(route, callback) of every URL pattern under /api/ in the real URLconf."""
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _api_routes(entry.url_patterns, route)
        elif isinstance(entry, URLPattern) and route.startswith("api/"):
            yield route, entry.callback


def _url(route: str) -> str:
    """A concrete path for `route`: ints are 1, strings an id that exists nowhere."""
    return "/" + re.sub(
        r"<(?:(\w+):)?(\w+)>", lambda m: "1" if m.group(1) == "int" else "nosuch_1", route
    ).lstrip("^").rstrip("$")


def _drf_routes():
    return [
        (route, callback.cls)
        for route, callback in _api_routes()
        if isinstance(getattr(callback, "cls", None), type) and issubclass(callback.cls, APIView)
    ]


def test_every_view_under_api_is_an_api_view_or_named_here():
    routes = list(_api_routes())
    assert len(routes) > 20
    for route, callback in routes:
        cls = getattr(callback, "cls", None)
        if cls is not None and issubclass(cls, APIView):
            assert issubclass(cls, ApiView) or issubclass(cls, PUBLIC_THIRD_PARTY), (
                f"{route}: {cls.__name__} must subclass core.api.ApiView"
            )
        else:
            assert callback in CHAT_VIEWS, f"{route}: a plain view under /api/ ({callback!r})"


def test_no_view_is_anonymous_and_every_one_refuses_anonymous_requests_with_401():
    client = APIClient()
    checked = 0
    for route, cls in _drf_routes():
        if issubclass(cls, PUBLIC_THIRD_PARTY):
            continue
        assert cls.anonymous is False, f"{route}: {cls.__name__} admits anonymous requests"
        for method in METHODS:
            if hasattr(cls, method):
                response = getattr(client, method)(_url(route), {}, format="json")
                assert response.status_code == 401, (route, method, response.status_code)
                assert response.json()["error"]["code"] == "not_authenticated", (route, method)
                assert response.has_header("WWW-Authenticate"), (route, method)
                checked += 1
    for route, callback in _api_routes():
        if callback in CHAT_VIEWS:
            response = getattr(client, CHAT_VIEWS[callback])(_url(route), {}, format="json")
            assert response.status_code == 401, (route, response.status_code)
            assert response.json()["error"]["code"] == "not_authenticated", route
            checked += 1
    assert checked >= 20


def test_anonymous_must_be_declared_and_then_admits_anonymous_requests():
    class Open(ApiView):
        anonymous = True

        def get(self, request):
            return Response({"ok": True})

    class Closed(ApiView):
        def get(self, request):
            return Response({"ok": True})

    request = APIRequestFactory().get("/api/x")
    assert Open.as_view()(request).status_code == 200
    assert Closed.as_view()(APIRequestFactory().get("/api/x")).status_code == 401


class _Nobody(RolePermission):
    message = "Nobody may."

    def allows(self, user) -> bool:
        return False


def test_a_view_checked_on_its_object_cannot_answer_without_finding_it(user):
    class Forgetful(ApiView):
        permission_classes = (_Nobody,)
        object_checked = True

        def get(self, request):
            return Response({"leaked": True})

    request = APIRequestFactory().get("/api/x")
    force_authenticate(request, user=user)
    response = Forgetful.as_view()(request)
    assert response.status_code == 500
    assert response.data == {"error": {"code": "server_error", "message": "Internal server error."}}


def test_found_answers_404_before_the_role_and_403_after_it(user):
    class Checked(ApiView):
        permission_classes = (_Nobody,)
        object_checked = True

        def get(self, request, exists):
            return Response(self.found(request, object() if exists == "yes" else None, NOT_FOUND_RUN))

    def call(exists):
        request = APIRequestFactory().get("/api/x")
        force_authenticate(request, user=user)
        return Checked.as_view()(request, exists=exists)

    missing = call("no")
    assert missing.status_code == 404
    assert missing.data == {"error": {"code": "not_found", "message": NOT_FOUND_RUN}}
    denied = call("yes")
    assert denied.status_code == 403 and denied.data["error"]["message"] == "Nobody may."


def test_lifting_a_hold_without_the_role_is_403_whether_or_not_the_hold_exists(
    user, staff_user, django_user_model
):
    """The role is checked on the visible session before the hold is looked up: a user who may not
    place holds cannot tell a real hold id from a made-up one (it was 404 for one and 403 for the other)."""
    keeper = django_user_model.objects.create_user("keeper-b", password="pw-x-1")
    keeper.user_permissions.add(Permission.objects.get(codename="place_legal_hold"))
    run = make_recorded_run(user)
    hold = place_hold(user=keeper, scope="SESSION", target_id=run.session_id, reason="case")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(staff_user)}")
    base = f"/api/diagnosis/{run.session_id}/holds"
    for hold_id in (hold.pk, 999999):
        response = client.post(f"{base}/{hold_id}/lift", {"reason": "x"}, format="json")
        assert response.status_code == 403, hold_id
    keeper_client = APIClient()
    keeper_client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(keeper)}")
    assert keeper_client.post(f"{base}/999999/lift", {"reason": "x"}, format="json").status_code == 404
