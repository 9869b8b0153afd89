"""Trace endpoints: `GET /api/diagnosis/{sessionId}/trace` and `GET /api/diagnosis/{sessionId}/audits`.

Thin views: validate the request, ask a selector, render through a serializer. Visibility and 404s come
from `diagnosis.selectors`; the read model from `audit.selectors`; the shapes from `audit.serializers`.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.permissions import IsSuperuser
from audit.selectors import AuditKind, get_session_audits, get_trace
from audit.serializers import StepSerializer, ToolSerializer, TraceSerializer
from audit.trace_render import trace_data
from config.api import error_responses
from diagnosis.selectors import RunResolution, get_visible_run, get_visible_session

NOT_FOUND_RUN = "No such session or run."
NOT_FOUND_SESSION = "No such session."


class TraceApi(APIView):
    """The decision trace of one run: run, ordered timeline, model steps, tools and an audit summary.

    With `runId` the run must belong to the session (`runResolution` EXACT); without it the session's
    latest run is used (LATEST). 401 anonymous; 400 `runId` given but empty or longer than 64
    characters; 404 the session is absent or not the user's (staff see all), or the run is not in it.
    Never carries reasoning or assistant text. Constant query count whatever the run's size.
    """

    class QuerySerializer(serializers.Serializer):
        runId = serializers.CharField(max_length=64, required=False)

    @extend_schema(
        operation_id="trace",
        summary="Decision trace of one run",
        parameters=[
            OpenApiParameter("sessionId", str, OpenApiParameter.PATH),
            OpenApiParameter(
                "runId",
                str,
                OpenApiParameter.QUERY,
                required=False,
                description="The exact run; omitted: the session's latest run (runResolution LATEST).",
            ),
        ],
        responses={200: TraceSerializer, **error_responses(400, 401, 404)},
        tags=["trace"],
    )
    def get(self, request, sessionId):
        query = self.QuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        run_id = query.validated_data.get("runId")
        run = get_visible_run(user=request.user, session_id=sessionId, run_id=run_id, with_feedback=True)
        if run is None:
            raise NotFound(NOT_FOUND_RUN)
        trace = get_trace(
            run=run, run_resolution=RunResolution.EXACT if run_id is not None else RunResolution.LATEST
        )
        # Same body as TraceSerializer(trace).data (the documented shape), built without DRF's per-field
        # dispatch, which dominated long traces (audit/trace_render.py, docs/performance.md).
        return Response(trace_data(trace))


class AuditRecordSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=[AuditKind.MODEL_STEP, AuditKind.TOOL])
    runId = serializers.CharField(source="run_id")
    createdAt = serializers.DateTimeField(source="created_at")
    step = StepSerializer(allow_null=True, help_text="Set when kind is MODEL_STEP.")
    tool = ToolSerializer(allow_null=True, help_text="Set when kind is TOOL.")

    class Meta:
        ref_name = "AuditRecord"


class SessionAuditsApi(APIView):
    """The newest 500 model-step and tool records across a session's runs, oldest first, for superusers.

    401 anonymous; 404 the session is absent or not visible to the user; 403 visible but the user is not
    a superuser. `truncated` is true when the session holds more than 500 such records.
    """

    permission_classes = [IsSuperuser]

    class OutputSerializer(serializers.Serializer):
        audits = AuditRecordSerializer(many=True)
        truncated = serializers.BooleanField()

        class Meta:
            ref_name = "SessionAudits"

    @extend_schema(
        operation_id="session_audits",
        summary="Newest 500 model-step and tool records of a session (superusers)",
        parameters=[OpenApiParameter("sessionId", str, OpenApiParameter.PATH)],
        responses={200: OutputSerializer, **error_responses(401, 403, 404)},
        tags=["trace"],
    )
    def get(self, request, sessionId):
        session = get_visible_session(user=request.user, session_id=sessionId)
        if session is None:
            raise NotFound(NOT_FOUND_SESSION)
        self.check_object_permissions(request, session)
        return Response(self.OutputSerializer(get_session_audits(session_id=session.session_id)).data)
