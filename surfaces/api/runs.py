"""Session, run-list and feedback endpoints (API contract, *Trace*).

`GET /api/diagnosis/sessions/`, `GET /api/diagnosis/{sessionId}/runs/` and
`POST /api/diagnosis/{sessionId}/runs/{runId}/feedback`, and the approvals of tool calls that require a
person: `GET /api/diagnosis/approvals/` and `POST /api/diagnosis/{sessionId}/runs/{runId}/approvals/
{toolCallId}` (over `agent.runtime.approvals`). Thin `core.api.ApiView`s over `diagnosis.selectors`
(reads) and `diagnosis.services` (writes). The chat stream and cancel endpoints live in `surfaces.chat`.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.exceptions import APIException
from rest_framework.response import Response

from agent.runtime import approval_queue, approvals
from audit.write.feedback import RunNotFinished, record_feedback
from core.api import (
    NOT_FOUND_RUN,
    NOT_FOUND_SESSION,
    ApiView,
    Conflict,
    NewestFirstCursorPagination,
    RolePermission,
    cursor_response,
    cursor_serializer,
    error_responses,
)
from diagnosis import selectors, services
from diagnosis.models import FeedbackRating, Intent, ReleaseDecision, RunStatus
from surfaces.api.audit_serializers import FeedbackSerializer, RunCostSerializer, RunIdentitySerializer


class SessionSerializer(serializers.Serializer):
    sessionId = serializers.CharField(source="session_id")
    title = serializers.CharField()
    owner = serializers.CharField(source="owner.get_username", help_text="The owner's username.")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")
    runCount = serializers.IntegerField(source="run_count")
    lastRunAt = serializers.DateTimeField(source="last_run_at", allow_null=True)

    class Meta:
        ref_name = "Session"


class RunSummarySerializer(RunIdentitySerializer):
    createdAt = serializers.DateTimeField(source="created_at")
    startedAt = serializers.DateTimeField(source="started_at", allow_null=True)
    finishedAt = serializers.DateTimeField(source="finished_at", allow_null=True)
    totalDurationMs = serializers.IntegerField(source="total_duration_ms", allow_null=True)
    tokensTotal = serializers.IntegerField(source="tokens_total")
    cost = RunCostSerializer(source="*")
    auditWriteFailures = serializers.IntegerField(source="audit_write_failures")
    feedback = serializers.SerializerMethodField(help_text="The viewer's own feedback on the run, or null.")

    class Meta:
        ref_name = "RunSummary"

    @extend_schema_field(FeedbackSerializer(allow_null=True))
    def get_feedback(self, run):
        view = self.context.get("feedback", {}).get(run.run_id)
        return FeedbackSerializer(view).data if view is not None else None


class SessionListApi(ApiView):
    """The sessions the user may see (own sessions; staff: all), newest first by creation, cursor
    paginated (`?cursor=` from `next`/`previous`, optional `?pageSize=` ≤ 100; no count). `runCount` and
    `lastRunAt` are the session's stored facts. `?mine=true`: only the user's own (the chat's list of
    conversations); `?q=`: only sessions whose title or any question contains the text. 401 anonymous;
    400 an invalid filter; 404 an invalid cursor."""

    class FilterSerializer(serializers.Serializer):
        mine = serializers.BooleanField(required=False, default=False, help_text="Only your own sessions.")
        q = serializers.CharField(
            required=False,
            allow_blank=True,
            max_length=selectors.SESSION_SEARCH_CHARS,
            help_text="Text in the session's title or any of its questions (case-insensitive).",
        )

    @extend_schema(
        operation_id="sessions_list",
        summary="Sessions visible to the user",
        parameters=[
            FilterSerializer,
            OpenApiParameter("cursor", str, OpenApiParameter.QUERY, required=False),
            OpenApiParameter("pageSize", int, OpenApiParameter.QUERY, required=False),
        ],
        responses={200: cursor_serializer(SessionSerializer, "Session"), **error_responses(400, 401, 404)},
        tags=["trace"],
    )
    def get(self, request):
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        return cursor_response(
            serializer_class=SessionSerializer,
            queryset=selectors.session_list(
                user=request.user,
                mine=filters.validated_data["mine"],
                text=filters.validated_data.get("q", ""),
            ),
            request=request,
            view=self,
        )


class RunListApi(ApiView):
    """A session's runs, newest first, cursor paginated (`?cursor=`, optional `?pageSize=` ≤ 100; no
    count), filterable by `status`, `releaseDecision`, `intent`, `createdAfter` (inclusive) and
    `createdBefore` (exclusive), ISO 8601 times. 401 anonymous; 400 an invalid filter value; 404 the
    session is absent or not visible (same body), or an invalid cursor."""

    class FilterSerializer(serializers.Serializer):
        status = serializers.ChoiceField(choices=RunStatus.values, required=False)
        releaseDecision = serializers.ChoiceField(choices=ReleaseDecision.values, required=False)
        intent = serializers.ChoiceField(choices=Intent.values, required=False)
        createdAfter = serializers.DateTimeField(required=False)
        createdBefore = serializers.DateTimeField(required=False)

        def validate(self, attrs):
            after, before = attrs.get("createdAfter"), attrs.get("createdBefore")
            if after and before and after > before:
                raise serializers.ValidationError({"createdAfter": "must not be later than createdBefore"})
            return attrs

    @extend_schema(
        operation_id="runs_list",
        summary="Runs of a session",
        parameters=[
            OpenApiParameter("sessionId", str, OpenApiParameter.PATH),
            FilterSerializer,
            OpenApiParameter("cursor", str, OpenApiParameter.QUERY, required=False),
            OpenApiParameter("pageSize", int, OpenApiParameter.QUERY, required=False),
        ],
        responses={
            200: cursor_serializer(RunSummarySerializer, "RunSummary"),
            **error_responses(400, 401, 404),
        },
        tags=["trace"],
    )
    def get(self, request, sessionId):
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        session = self.found(
            request, selectors.get_visible_session(user=request.user, session_id=sessionId), NOT_FOUND_SESSION
        )
        data = filters.validated_data
        runs = selectors.run_list(
            session=session,
            filters=selectors.RunFilters(
                status=data.get("status"),
                release_decision=data.get("releaseDecision"),
                intent=data.get("intent"),
                created_after=data.get("createdAfter"),
                created_before=data.get("createdBefore"),
            ),
        )
        # One page of runs, then the viewer's feedback on them in one query (the chat shows it on replay).
        paginator = NewestFirstCursorPagination()
        page = paginator.paginate_queryset(runs, request, view=self)
        votes = selectors.feedback_of(run_ids=[run.run_id for run in page], user=request.user)
        return paginator.get_paginated_response(
            RunSummarySerializer(page, many=True, context={"feedback": votes}).data
        )


NOT_FINISHED_FEEDBACK = "The run has not finished; feedback is given on a finished run."


class RunFeedbackApi(ApiView):
    """The user's verdict on a run they may see: `{"rating": "up" | "down", "comment"?: str ≤ 2000}` → 201.
    One feedback per user and run; a second submission replaces the first, and each one is chained into
    the run's record as `FEEDBACK_RECORDED` (`audit.write.feedback`). 401 anonymous; 403 a
    session-authenticated request without a valid CSRF token; 400 invalid body; 404 the session or run is
    absent or not visible (same body); 409 the run has not finished yet."""

    class InputSerializer(serializers.Serializer):
        rating = serializers.ChoiceField(choices=FeedbackRating.values)
        comment = serializers.CharField(
            max_length=services.FEEDBACK_COMMENT_CHARS, required=False, allow_blank=True, default=""
        )

        class Meta:
            ref_name = "FeedbackInput"

    class OutputSerializer(serializers.Serializer):
        runId = serializers.CharField(source="run_id")
        rating = serializers.ChoiceField(choices=FeedbackRating.values)
        comment = serializers.CharField()
        createdAt = serializers.DateTimeField(source="created_at")

        class Meta:
            ref_name = "FeedbackCreated"

    @extend_schema(
        operation_id="run_feedback",
        summary="Give feedback on a run",
        parameters=[
            OpenApiParameter("sessionId", str, OpenApiParameter.PATH),
            OpenApiParameter("runId", str, OpenApiParameter.PATH),
        ],
        request=InputSerializer,
        responses={201: OutputSerializer, **error_responses(400, 401, 403, 404, 409)},
        tags=["trace"],
    )
    def post(self, request, sessionId, runId):
        return self.submit(
            request,
            find=lambda data: selectors.get_visible_run(
                user=request.user, session_id=sessionId, run_id=runId
            ),
            not_found=NOT_FOUND_RUN,
            act=lambda run, data: record_feedback(run=run, user=request.user, **data),
            refusals={RunNotFinished: lambda exc: Conflict(NOT_FINISHED_FEEDBACK)},
            output=lambda feedback: self.OutputSerializer(feedback).data,
            status=status.HTTP_201_CREATED,
        )


# ---------------------------------------------------------------------------------------------------
# Approvals of tool calls that require a person (docs/aiops.md, *Approvals*)
# ---------------------------------------------------------------------------------------------------
class CanDecideToolCalls(RolePermission):
    """Deciding tool calls that wait for approval: `diagnosis.approve_tool_call` (group "Approvers"),
    `agent.runtime.approvals.may_approve`."""

    message = "You may not decide tool calls (diagnosis.approve_tool_call)."

    def allows(self, user) -> bool:
        return approvals.may_approve(user)


class ApprovalError(APIException):
    """A refused decision in the contract's error shape, with the decision service's status and code."""

    def __init__(self, exc: approvals.ApprovalError) -> None:
        self.status_code = exc.status
        super().__init__(detail=str(exc), code=exc.code)


def _refused_decision(exc: approvals.ApprovalError) -> ApprovalError:
    """A refused decision as the API answers it; one refused as expired, its expiry recorded, is said so
    live too."""
    if exc.decided is not None:
        approvals.publish_decision(exc.decided)
    return ApprovalError(exc)


class ApprovalActionSerializer(serializers.Serializer):
    executedBy = serializers.CharField(
        help_text="Who executes it: the service's identity (a silence's createdBy)."
    )
    where = serializers.CharField(help_text="Where: the backend's host, e.g. 'Alertmanager at am:9093'.")
    executeBefore = serializers.DateTimeField(
        help_text="The approval deadline: an approved call starts before it or is never made."
    )
    endsBy = serializers.DateTimeField(
        allow_null=True, help_text="The latest end of a lasting effect (a silence's end), or null."
    )
    text = serializers.CharField(help_text="All of it in one sentence, as the pages show it.")

    class Meta:
        ref_name = "ApprovalAction"


class WaitingApprovalSerializer(serializers.Serializer):
    runId = serializers.CharField(source="run_id")
    sessionId = serializers.CharField(source="session_id")
    toolCallId = serializers.CharField(source="tool_call_id")
    toolName = serializers.CharField(source="tool_name")
    arguments = serializers.JSONField(help_text="The call's effective input as recorded (bounded).")
    argumentsDigest = serializers.CharField(
        source="arguments_digest",
        help_text="sha256 of the arguments' canonical JSON: send it back to decide.",
    )
    requester = serializers.CharField(help_text="The run's requester (its session's owner).")
    requestedAt = serializers.DateTimeField(source="requested_at")
    expiresAt = serializers.DateTimeField(source="expires_at")
    action = ApprovalActionSerializer(
        allow_null=True,
        help_text="What the request stated an approved call will do; null when it stated nothing.",
    )

    class Meta:
        ref_name = "WaitingApproval"


class ApprovalListApi(ApiView):
    """The tool calls waiting for a decision in runs the user may see, oldest first (at most 100), for
    users with `diagnosis.approve_tool_call`. 401 anonymous; 403 without the permission."""

    permission_classes = (CanDecideToolCalls,)

    class OutputSerializer(serializers.Serializer):
        approvals = WaitingApprovalSerializer(many=True)

        class Meta:
            ref_name = "WaitingApprovals"

    @extend_schema(
        operation_id="approvals_list",
        summary="Tool calls waiting for approval",
        responses={200: OutputSerializer, **error_responses(401, 403)},
        tags=["trace"],
    )
    def get(self, request):
        waiting = approval_queue.waiting_approvals(user=request.user)
        return Response(self.OutputSerializer({"approvals": waiting}).data)


class ApprovalDecisionApi(ApiView):
    """Decide a tool call that waits for approval: `{"decision": "approve" | "reject", "note"?: str ≤ 1000,
    "argumentsDigest"?: str}` → 200 with the recorded decision (APPROVAL_DECIDED); approving resumes the
    run (a queue worker executes the call under the same id). `argumentsDigest` is the digest of the
    arguments the decider saw (as listed); when given it must be the recorded one.

    401 anonymous; 403 without `diagnosis.approve_tool_call` (`permission_denied`), or approving one's own
    run's request unless `APPROVAL_ALLOW_SELF` (`self_approval`), or a session-authenticated request
    without a valid CSRF token; 400 invalid body; 404 the session, run or call is absent or not visible
    (same body); 409 a call whose deadline (`expiresAt`) has passed (`expired`: the decision is not
    taken and the call's expiry is recorded instead, as the sweeper would have, if it was not already),
    a call that is not waiting — decided already, cancelled, or its run not interrupted (`not_waiting`)
    — or arguments that changed (`arguments_changed`); 503 the decision could not be recorded (nothing
    changed)."""

    permission_classes = (CanDecideToolCalls,)
    object_checked = True

    class InputSerializer(serializers.Serializer):
        decision = serializers.ChoiceField(choices=sorted(approvals.DECISIONS))
        note = serializers.CharField(
            max_length=approvals.NOTE_CHARS, required=False, allow_blank=True, default=""
        )
        argumentsDigest = serializers.RegexField(r"^[0-9a-f]{64}\Z", required=False)

        class Meta:
            ref_name = "ApprovalDecisionInput"

    class OutputSerializer(serializers.Serializer):
        runId = serializers.CharField(source="run_id")
        toolCallId = serializers.CharField(source="tool_call_id")
        decision = serializers.ChoiceField(choices=[approvals.APPROVED, approvals.REJECTED])
        decidedBy = serializers.CharField(source="decided_by")
        argumentsDigest = serializers.CharField(source="arguments_digest")
        sequenceNo = serializers.IntegerField(source="sequence_no", help_text="APPROVAL_DECIDED's sequence.")

        class Meta:
            ref_name = "ApprovalDecided"

    @extend_schema(
        operation_id="run_approval_decide",
        summary="Approve or reject a tool call that waits for approval",
        parameters=[
            OpenApiParameter("sessionId", str, OpenApiParameter.PATH),
            OpenApiParameter("runId", str, OpenApiParameter.PATH),
            OpenApiParameter("toolCallId", str, OpenApiParameter.PATH),
        ],
        request=InputSerializer,
        responses={200: OutputSerializer, **error_responses(400, 401, 403, 404, 409, 503)},
        tags=["trace"],
    )
    def post(self, request, sessionId, runId, toolCallId):
        def decide(run, data):
            decided = approvals.decide(
                run=run,
                tool_call_id=toolCallId,
                decision=approvals.DECISIONS[data["decision"]],
                user=request.user,
                note=data["note"],
                arguments_digest_seen=data.get("argumentsDigest"),
            )
            approvals.publish_decision(decided)
            return decided

        return self.submit(
            request,
            find=lambda data: selectors.get_visible_run(
                user=request.user, session_id=sessionId, run_id=runId
            ),
            not_found=NOT_FOUND_RUN,
            act=decide,
            refusals={approvals.ApprovalError: _refused_decision},
            output=lambda decided: self.OutputSerializer(decided).data,
        )
