"""`GET /api/diagnosis/{sessionId}/trace/reasoning?runId=R`: an auditor reads a run's reasoning."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle

from access.reasoning_reads import read_reasoning
from core.api import NOT_FOUND_RUN, ApiView, IdField, error_responses
from diagnosis.selectors import get_visible_run
from reasoning.models import AccessChannel, ContentSource
from surfaces.api.reasoning_permissions import CanReadReasoningContent


class ReasoningRecordSerializer(serializers.Serializer):
    stepIndex = serializers.IntegerField(source="step_index")
    agentName = serializers.CharField(source="agent_name")
    reasoningAvailable = serializers.BooleanField(
        source="reasoning_available", help_text="The provider returned non-empty reasoning."
    )
    reasoningContent = serializers.CharField(
        source="reasoning_content", allow_null=True, help_text="Null when none, purged or unreadable."
    )
    assistantText = serializers.CharField(source="assistant_text", allow_null=True)
    contentSource = serializers.ChoiceField(
        source="content_source", choices=ContentSource.values, allow_null=True
    )
    contentBytes = serializers.IntegerField(source="content_bytes")
    purged = serializers.BooleanField(help_text="Content erased by retention or on request.")
    purgedAt = serializers.DateTimeField(source="purged_at", allow_null=True)
    contentReadable = serializers.BooleanField(
        source="content_readable",
        help_text="False when no configured key decrypts the stored content (its key was removed).",
    )
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        ref_name = "ReasoningRecord"


class ReasoningApi(ApiView):
    """Reasoning and assistant text of every model step of one exact run, for auditors.

    Checks, in this order: 401 anonymous; 429 over the per-user rate (`REASONING_THROTTLE_RATE`); 400
    `runId` missing or invalid; 404 the session is absent or not visible to the user, or the run is not in
    it (one body for all); 403 the user lacks `reasoning.view_reasoning_content`. On success, before the
    content is returned, one `reasoning_access_log` row records who read what from where; if that write
    fails the request fails and nothing is returned.
    """

    permission_classes = (CanReadReasoningContent,)
    object_checked = True
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "reasoning"

    class QuerySerializer(serializers.Serializer):
        runId = IdField(help_text="The exact run (required).")

    class OutputSerializer(serializers.Serializer):
        sessionId = serializers.CharField(source="session_id")
        runId = serializers.CharField(source="run_id")
        records = ReasoningRecordSerializer(many=True)

        class Meta:
            ref_name = "Reasoning"

    @extend_schema(
        operation_id="trace_reasoning",
        summary="Reasoning of one run (auditors; every read is logged)",
        parameters=[
            OpenApiParameter("sessionId", str, OpenApiParameter.PATH),
            OpenApiParameter("runId", str, OpenApiParameter.QUERY, required=True),
        ],
        responses={200: OutputSerializer, **error_responses(400, 401, 403, 404, 429)},
        tags=["trace"],
    )
    def get(self, request, sessionId):
        query = self.QuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        run = self.found(
            request,
            get_visible_run(user=request.user, session_id=sessionId, run_id=query.validated_data["runId"]),
            NOT_FOUND_RUN,
        )
        # `read_reasoning` writes the access-log row before the records leave this view.
        records = read_reasoning(user=request.user, run=run, request=request, channel=AccessChannel.API)
        body = {"session_id": run.session_id, "run_id": run.run_id, "records": records}
        return Response(self.OutputSerializer(body).data)
