"""API plumbing shared by every app's `apis.py`: the error shape, pagination, and the error handlers.

Every 4xx/5xx body under `/api/` is ``{"error": {"code": str, "message": str}}``: DRF errors through
`exception_handler`, anything else through `ApiErrorMiddleware` and `handler404`/`handler500`; a 500 body
says nothing, and its log line never carries the exception's message. Every DRF view under `/api/` is an
`ApiView`, which declares once what every endpoint shares: authentication required (deny by default),
the checks in the order 401 → 400 → 404 → 403, the id limits, the not-found texts (`NOT_FOUND_*`) and
the one shape of a changing POST (`ApiView.submit`). A view states only what it allows.
Details: docs/api.md, *Order of checks* and *Errors*.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig, SuspiciousOperation
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.views import defaults
from drf_spectacular.utils import OpenApiResponse
from rest_framework import exceptions, pagination, serializers, status
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView, set_rollback

from core.errors import ClientRefusal
from core.ids import MAX_ID_CHARS
from core.middleware import ResponseMiddleware

logger = logging.getLogger("api")

API_PREFIX = "/api/"
MESSAGE_CHARS = 500

STATUS_CODES = {
    400: "invalid_request",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "request_too_large",
    415: "unsupported_media_type",
    429: "throttled",
    500: "server_error",
    502: "bad_gateway",
    503: "service_unavailable",
}
DEFAULT_MESSAGES = {
    400: "The request is invalid.",
    401: "Authentication credentials were not provided.",
    403: "You do not have permission to perform this action.",
    404: "Not found.",
    405: "Method not allowed.",
    429: "Request was throttled.",
    413: "The request body is too large.",
    500: "Internal server error.",
}


def error_body(code: str, message: str, **extra) -> dict:
    """The contract's error body; `extra` keys go beside `code` and `message`."""
    return {"error": {"code": code, "message": _clip(message), **extra}}


def _clip(text: str) -> str:
    text = str(text)
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


def _flatten(detail, prefix: str = "") -> list[str]:
    """Readable lines of a DRF ValidationError detail: `field: message`."""
    if isinstance(detail, dict):
        lines: list[str] = []
        for key, value in detail.items():
            name = key if key != "non_field_errors" else ""
            lines += _flatten(value, f"{prefix}.{name}" if prefix and name else (name or prefix))
        return lines
    if isinstance(detail, list):
        return [line for item in detail for line in _flatten(item, prefix)]
    return [f"{prefix}: {detail}" if prefix else str(detail)]


def _origin(exc: BaseException) -> str:
    """file:line of the innermost frame inside the project (no code, no values)."""
    base = Path(settings.BASE_DIR)
    where = "unknown"
    for frame in traceback.extract_tb(exc.__traceback__):
        path = Path(frame.filename)
        if base in path.parents and ".venv" not in path.parts:
            where = f"{path.relative_to(base)}:{frame.lineno}"
    return where


def log_unexpected(exc: BaseException, request_path: str) -> None:
    logger.error("unhandled error path=%s error=%s at=%s", request_path, type(exc).__name__, _origin(exc))


def client_error(exc: BaseException) -> tuple[int, str] | None:
    """(status, code) for exceptions that are the client's fault although they are not DRF's: a body
    over `DATA_UPLOAD_MAX_MEMORY_SIZE` (413), Django's other `SuspiciousOperation`s and a multipart body
    Django's own parser cannot read (no boundary, truncated; 400)."""
    if isinstance(exc, RequestDataTooBig):
        return 413, STATUS_CODES[413]
    if isinstance(exc, (SuspiciousOperation, MultiPartParserError)):
        return 400, STATUS_CODES[400]
    return None


class Refused(exceptions.APIException):
    """A `core.errors.ClientRefusal` as DRF raises it (an authentication class must raise an
    `APIException`, so that DRF records the request as unauthenticated before answering)."""

    def __init__(self, refusal: ClientRefusal) -> None:
        self.status_code = refusal.status_code
        self.wait = refusal.wait
        super().__init__(detail=refusal.detail, code=refusal.code)


def exception_handler(exc, context) -> Response:
    """DRF's exception handler in the contract's shape; never returns None (no HTML 500 from DRF)."""
    if isinstance(exc, ClientRefusal):
        exc = Refused(exc)
    refused = client_error(exc)
    if refused is not None:
        set_rollback()
        return Response(error_body(refused[1], DEFAULT_MESSAGES[refused[0]]), status=refused[0])
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )

    if not isinstance(exc, exceptions.APIException):
        request = context.get("request")
        log_unexpected(exc, getattr(request, "path", "?"))
        set_rollback()
        return Response(error_body("server_error", DEFAULT_MESSAGES[500]), status=500)

    headers: dict[str, str] = {}
    status_code = exc.status_code
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        status_code = status.HTTP_401_UNAUTHORIZED
        headers["WWW-Authenticate"] = getattr(exc, "auth_header", None) or "Token"
    if getattr(exc, "wait", None):
        headers["Retry-After"] = str(int(exc.wait))

    if isinstance(exc, exceptions.ValidationError):
        detail = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        body = error_body(
            "invalid_request",
            "; ".join(_flatten(detail)) or DEFAULT_MESSAGES[400],
            fields=detail,
        )
    else:
        code = exc.get_codes()
        code = code if isinstance(code, str) else STATUS_CODES.get(status_code, "error")
        if isinstance(exc, exceptions.ParseError):
            code = "invalid_request"
        message = exc.detail if isinstance(exc.detail, str) else "; ".join(_flatten(exc.detail))
        body = error_body(code, message)
    set_rollback()
    return Response(body, status=status_code, headers=headers)


# --------------------------------------------------------------------------------------------------
# The base class of every DRF view under /api/
# --------------------------------------------------------------------------------------------------
# What a user may not see is answered exactly like what does not exist: one text per kind of thing.
NOT_FOUND_SESSION = "No such session."
NOT_FOUND_RUN = "No such session or run."


class Conflict(exceptions.APIException):
    """409: the resource is not in a state that allows the change (`conflict`)."""

    status_code = 409
    default_code = "conflict"
    default_detail = "Conflict."


class IdField(serializers.CharField):
    """A `sessionId` or `runId` in a query or body: 1..`MAX_ID_CHARS` characters, else 400."""

    def __init__(self, **kwargs) -> None:
        super().__init__(max_length=MAX_ID_CHARS, **kwargs)


class RolePermission(BasePermission):
    """A role an `ApiView` allows, checked where the view's order puts it: on the object once the view
    found it visible (`ApiView.found`) when the view declares `object_checked`, so 404 comes before 403;
    else right after authentication (endpoints without an object). Subclasses say who holds the role in
    `allows`, which may also raise `PermissionDenied` with its own code (e.g. `otp_required`)."""

    def allows(self, user) -> bool:
        raise NotImplementedError

    def has_permission(self, request, view) -> bool:
        return getattr(view, "object_checked", False) or self.allows(request.user)

    def has_object_permission(self, request, view, obj) -> bool:
        return self.allows(request.user)


class ApiView(APIView):
    """The base class of every DRF view under `/api/` (`tests/surfaces/api/test_base_view.py` walks
    the URLconf to hold every one to it). What it declares, once:

    * **Deny by default.** Authentication is required: `IsAuthenticated` comes before whatever the view
      allows, so an anonymous request is 401 (`WWW-Authenticate`, `exception_handler`) on every
      endpoint. A view open to anonymous requests must say so with `anonymous = True` (none is today;
      the Alertmanager webhook is not anonymous, it declares its own `authentication_classes`).
    * **What a view allows** is its `permission_classes` (roles, usually `RolePermission`s), checked
      after authentication; by default nothing beyond it (any authenticated, active user).
    * **The order 401 → 429 → 400 → 404 → 403.** Authentication and throttles run before the handler;
      the handler validates its query and body (400, depending on the request only), then finds its
      object through a visibility selector and hands it to `found`: absent or not visible is one 404
      with the kind's `NOT_FOUND_*` text, identical in both cases; a found object is then checked
      against the roles (403). A view whose roles are checked on that object declares
      `object_checked = True`, and a successful response that did not pass `found` is then a 500, never
      an answer without the check.
    * **Id limits** (`core.ids.MAX_ID_CHARS`): the visibility selectors find nothing for a longer path
      id (404 as for any unknown id); query and body ids are `IdField`s (400).
    * **The error shape**: `exception_handler` renders every refusal.
    """

    anonymous: bool = False
    permission_classes: tuple[type[BasePermission], ...] = ()
    object_checked: bool = False

    def get_permissions(self) -> list[BasePermission]:
        allowed = [permission() for permission in self.permission_classes]
        return allowed if self.anonymous else [IsAuthenticated(), *allowed]

    def initial(self, request, *args, **kwargs) -> None:
        self._object_permissions_checked = False
        super().initial(request, *args, **kwargs)

    def check_object_permissions(self, request, obj) -> None:
        super().check_object_permissions(request, obj)
        self._object_permissions_checked = True

    def found(self, request, obj, not_found: str):
        """`obj` as a visibility selector returned it: None (absent or not visible) is 404 with
        `not_found`; else the roles are checked on it (403) and it is returned."""
        if obj is None:
            raise exceptions.NotFound(not_found)
        self.check_object_permissions(request, obj)
        return obj

    def submit(
        self,
        request,
        *,
        act: Callable[[Any, dict], Any],
        output: Callable[[Any], Any],
        find: Callable[[dict], Any] | None = None,
        not_found: str = "",
        refusals: Mapping[type[Exception], Callable[[Any], Exception]] | None = None,
        status: int = 200,
    ) -> Response:
        """The shape of a POST that changes something, in the order above: the body is validated by the
        view's `InputSerializer` (400); `find(validated data)`, a visibility selector's call, finds the
        object the change is made to (None: 404 with `not_found`; then the roles on it: 403; no `find`:
        no object, None is passed on); `act(object, validated data)` calls the service; an exception of
        a class in `refusals` is raised as the API error its function makes of it (e.g. 409);
        `output(result)` is the body, answered with `status`."""
        body = self.InputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        obj = self.found(request, find(data), not_found) if find is not None else None
        try:
            result = act(obj, data)
        except tuple(refusals or ()) as exc:
            refused = next(make for kind, make in refusals.items() if isinstance(exc, kind))
            raise refused(exc) from exc
        return Response(output(result), status=status)

    def finalize_response(self, request, response, *args, **kwargs):
        if (
            self.object_checked
            and response.status_code < 400
            and request.method != "OPTIONS"
            and not getattr(self, "_object_permissions_checked", False)
        ):
            response = self.handle_exception(
                ImproperlyConfigured(f"{type(self).__name__} answered without checking its object")
            )
        return super().finalize_response(request, response, *args, **kwargs)


# --------------------------------------------------------------------------------------------------
# Django-level error paths under /api/
# --------------------------------------------------------------------------------------------------
def _is_api(request) -> bool:
    return request.path.startswith(API_PREFIX)


def json_error(status_code: int, message: str | None = None, code: str | None = None) -> JsonResponse:
    return JsonResponse(
        error_body(
            code or STATUS_CODES.get(status_code, "error"),
            message or DEFAULT_MESSAGES.get(status_code, "Request failed."),
        ),
        status=status_code,
    )


def handler404(request, exception=None):
    if _is_api(request):
        return json_error(404)
    return defaults.page_not_found(request, exception)


def handler500(request):
    if _is_api(request):
        return json_error(500)
    return defaults.server_error(request)


class ApiErrorMiddleware(ResponseMiddleware):
    """Under `/api/`: exceptions escaping a view become a JSON 500 (class logged, never the message or
    traceback); any other error response that is not JSON (resolver 404, CSRF 403, a plain view's
    HttpResponseNotAllowed …) is rewritten into the contract's error shape. Streams are left alone.
    Works for sync and async views."""

    def process_exception(self, request, exception):
        if not _is_api(request) or isinstance(exception, (Http404, DjangoPermissionDenied)):
            return None  # Django turns these into 404/403, which `process` then shapes
        refused = client_error(exception)
        if refused is not None:
            return json_error(refused[0], code=refused[1])
        log_unexpected(exception, request.path)
        return json_error(500)

    @staticmethod
    def process(request, response):
        if (
            response.status_code < 400
            or not _is_api(request)
            or getattr(response, "streaming", False)
            or not isinstance(response, HttpResponse)
        ):
            return response
        content_type = response.get("Content-Type", "")
        if content_type.startswith("application/json") and _has_error_shape(response):
            return response
        shaped = json_error(response.status_code)
        for header in ("Allow", "Retry-After", "WWW-Authenticate", "Vary"):
            if header in response:
                shaped[header] = response[header]
        return shaped


def _has_error_shape(response) -> bool:
    try:
        body = json.loads(response.content)
    except (ValueError, TypeError):
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


# --------------------------------------------------------------------------------------------------
# OpenAPI helpers and pagination
# --------------------------------------------------------------------------------------------------
class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Machine-readable code, e.g. `not_found`, `invalid_request`.")
    message = serializers.CharField(help_text="Human-readable; never contains content, SQL or traces.")
    fields = serializers.DictField(
        required=False, help_text="Only on `invalid_request`: the messages per request field."
    )

    class Meta:
        ref_name = "ErrorDetail"


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()

    class Meta:
        ref_name = "Error"


ERROR_DESCRIPTIONS = {
    400: "Invalid request (`invalid_request`).",
    401: "Not authenticated (`not_authenticated`, `authentication_failed`).",
    403: (
        "Authenticated but not allowed (`permission_denied`; `otp_required` for reasoning without a "
        "second factor)."
    ),
    404: "No such resource, or one the user may not see (`not_found`; identical in both cases).",
    409: (
        "The resource is not in a state that allows this (`conflict`: a review of a run that has not "
        "finished; `not_waiting`: an approval decided already or expired; `arguments_changed`)."
    ),
    429: (
        "Too many requests (`throttled`), or too many failed authentications (`locked_out`); see "
        "`Retry-After`."
    ),
    503: "The decision could not be recorded; nothing changed (`service_unavailable`).",
}


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    """`extend_schema(responses=...)` entries for the given error statuses, all in the error shape."""
    return {
        code: OpenApiResponse(response=ErrorSerializer, description=ERROR_DESCRIPTIONS[code])
        for code in codes
    }


class PageNumberPagination(pagination.PageNumberPagination):
    """`?page=` (1-based) and optional `?pageSize=` (≤ 100); body `count`, `next`, `previous`, `results`."""

    page_size = 20
    page_size_query_param = "pageSize"
    max_page_size = 100


def paginated_response(*, serializer_class, queryset, request, view) -> Response:
    """HackSoft-style pagination for an APIView: one page of `queryset` through `serializer_class`."""
    paginator = PageNumberPagination()
    page = paginator.paginate_queryset(queryset, request, view=view)
    return paginator.get_paginated_response(serializer_class(page, many=True).data)


class NewestFirstCursorPagination(pagination.CursorPagination):
    """`?cursor=` (opaque, from `next`/`previous`) and optional `?pageSize=` (≤ 100); body `next`,
    `previous`, `results`, no count. Newest first by `(-created_at, -id)`: each page is one range of an
    index whose key starts with `created_at` (after the list's equality filters), whatever the page's
    depth, and a cursor keeps its place while new rows arrive (they sort before it). An invalid cursor
    is a 404."""

    page_size = 20
    page_size_query_param = "pageSize"
    max_page_size = 100
    ordering = ("-created_at", "-id")


def cursor_response(*, serializer_class, queryset, request, view) -> Response:
    """One cursor page of `queryset` (see `NewestFirstCursorPagination`) through `serializer_class`."""
    paginator = NewestFirstCursorPagination()
    page = paginator.paginate_queryset(queryset, request, view=view)
    return paginator.get_paginated_response(serializer_class(page, many=True).data)


def cursor_serializer(serializer_class, name: str) -> type[serializers.Serializer]:
    """The schema of a cursor page of `serializer_class` (for `extend_schema`)."""
    return type(
        f"{name}CursorPageSerializer",
        (serializers.Serializer,),
        {
            "next": serializers.URLField(allow_null=True, help_text="The next (older) page, or null."),
            "previous": serializers.URLField(allow_null=True, help_text="The previous (newer) page."),
            "results": serializer_class(many=True),
            "Meta": type("Meta", (), {"ref_name": f"{name}CursorPage"}),
        },
    )


def paginated_serializer(serializer_class, name: str) -> type[serializers.Serializer]:
    """The schema of a page of `serializer_class` (for `extend_schema`)."""
    return type(
        f"{name}PageSerializer",
        (serializers.Serializer,),
        {
            "count": serializers.IntegerField(),
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "results": serializer_class(many=True),
            "Meta": type("Meta", (), {"ref_name": f"{name}Page"}),
        },
    )
