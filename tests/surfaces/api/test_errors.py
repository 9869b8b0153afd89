"""Errors under /api/ are always `{"error": {"code", "message"}}`, without traces, SQL or reasoning, in the
response and in the logs; throttling of the reasoning endpoint."""

import logging

import pytest
from django.core.cache import cache
from django.test import AsyncClient, Client, RequestFactory

from core.api import handler404, handler500
from reasoning.models import ReasoningAccessLog
from tests.factories import REASONING_MARKER

pytestmark = pytest.mark.django_db


def _assert_error_shape(response, status, code):
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code and isinstance(body["error"]["message"], str)
    return body


@pytest.mark.parametrize("debug", [False, True])
def test_unknown_api_path_is_a_json_404(api_client, user, settings, debug):
    settings.DEBUG = debug
    api_client.force_login(user)
    body = _assert_error_shape(api_client.get("/api/no/such/thing"), 404, "not_found")
    assert body == {"error": {"code": "not_found", "message": "Not found."}}
    _assert_error_shape(Client().get("/api/nothing-here/"), 404, "not_found")


def test_wrong_method_is_405_with_allow(api_client, user):
    api_client.force_login(user)
    response = api_client.delete("/api/diagnosis/sessions/")
    _assert_error_shape(response, 405, "method_not_allowed")
    assert "GET" in response["Allow"]


@pytest.mark.urls("tests.surfaces.api.urls_errors")
@pytest.mark.parametrize("path", ["/api/test-errors/drf", "/api/test-errors/sql", "/api/test-errors/plain"])
@pytest.mark.parametrize("debug", [False, True])
def test_unexpected_errors_are_opaque_500s_and_log_no_content(user, caplog, settings, path, debug):
    settings.DEBUG = debug
    client = Client(raise_request_exception=False)
    client.force_login(user)
    with caplog.at_level(logging.DEBUG):
        response = client.get(path)
    body = _assert_error_shape(response, 500, "server_error")
    assert body["error"]["message"] == "Internal server error."
    text = response.content.decode()
    for secret in (REASONING_MARKER, "Traceback", "no_such_table", "SELECT"):
        assert secret not in text
        assert secret not in caplog.text, secret
    assert any(
        "unhandled error" in r.getMessage() and "tests/surfaces/api/urls_errors.py" in r.getMessage()
        for r in caplog.records
    )


@pytest.mark.asyncio
@pytest.mark.urls("tests.surfaces.api.urls_errors")
async def test_async_view_errors_are_opaque_too(caplog):
    with caplog.at_level(logging.DEBUG):
        response = await AsyncClient(raise_request_exception=False).get("/api/test-errors/async")
    _assert_error_shape(response, 500, "server_error")
    assert REASONING_MARKER not in response.content.decode() and REASONING_MARKER not in caplog.text


@pytest.mark.urls("tests.surfaces.api.urls_errors")
def test_non_api_paths_keep_djangos_pages():
    response = Client(raise_request_exception=False).get("/elsewhere/plain")
    assert response.status_code == 500
    assert not response["Content-Type"].startswith("application/json")


def test_django_handlers_answer_json_under_api_only():
    factory = RequestFactory()
    api404 = handler404(factory.get("/api/x"), Exception("no"))
    assert api404.status_code == 404 and b'"not_found"' in api404.content
    api500 = handler500(factory.get("/api/x"))
    assert api500.status_code == 500 and b'"server_error"' in api500.content
    assert not handler500(factory.get("/page"))["Content-Type"].startswith("application/json")


def test_reasoning_reads_are_throttled_per_user(api_client, auditor, traced_run, settings):
    cache.clear()
    limit = int(settings.REASONING_THROTTLE_RATE.split("/")[0])
    api_client.force_login(auditor)
    url = f"/api/diagnosis/{traced_run.session_id}/trace/reasoning?runId={traced_run.run_id}"
    for _ in range(limit):
        assert api_client.get(url).status_code == 200
    throttled = api_client.get(url)
    body = _assert_error_shape(throttled, 429, "throttled")
    assert int(throttled["Retry-After"]) > 0 and "throttled" in body["error"]["message"]
    assert ReasoningAccessLog.objects.count() == limit
    # the trace endpoint is not throttled by the reasoning scope
    assert api_client.get(f"/api/diagnosis/{traced_run.session_id}/trace").status_code == 200
    cache.clear()
