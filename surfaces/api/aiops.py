"""AI Ops endpoints: Alertmanager's webhook, staff analyses, the analyses list (API contract, *AI Ops*).

`POST /api/aiops/alertmanager` accepts only `Authorization: Bearer <AIOPS_WEBHOOK_TOKEN>`
(`WebhookTokenAuthentication`, constant-time, its own lock-out counter; never a session): 202 with the
run a notification started or duplicates, 200 with `run: null` when nothing fires. `POST` and `GET
/api/aiops/analyses` let staff start an analysis and list them. Runs are queued; the report is the run's
released content, read through the trace or followed live.
Details: docs/aiops.md, *Starting analyses* and *The webhook*; docs/api.md.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import authentication, exceptions, serializers, status
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response

from access import lockout
from agent.aiops import intake
from core.api import ApiView, Refused, error_responses, paginated_response, paginated_serializer
from diagnosis import selectors, services
from diagnosis.models import ReleaseDecision, RunStatus

MAX_ALERTS = 1000
MAX_TRUNCATED_ALERTS = 2**31 - 1 - MAX_ALERTS
ALERT_STATUSES = ["firing", "resolved"]
MAX_GROUP_KEY_CHARS = 4000


class WebhookTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <AIOPS_WEBHOOK_TOKEN>`, compared in constant time; authenticates as the
    AI Ops service user. A missing header, another scheme, a wrong token, or no configured token fail."""

    keyword = "Bearer"

    def authenticate(self, request):
        configured = str(settings.AIOPS_WEBHOOK_TOKEN or "")
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            raise exceptions.NotAuthenticated("Send Authorization: Bearer <AIOPS_WEBHOOK_TOKEN>.")
        raw = getattr(request, "_request", request)
        # Guessing the webhook token is bounded in its own counter per address (access.lockout): while it
        # is locked every webhook call from that address is 429, uncounted, the right token too (no guess
        # is confirmed); nobody's API token or login is refused because of it.
        if lockout.is_locked(raw, username=lockout.WEBHOOK):
            raise Refused(lockout.LockedOut(raw, lockout.WEBHOOK))
        given = header[1] if len(header) == 2 else b""
        if not configured or not hmac.compare_digest(given, configured.encode()):
            if lockout.record_failure(raw, username=lockout.WEBHOOK):
                raise Refused(lockout.LockedOut(raw, lockout.WEBHOOK))
            raise exceptions.AuthenticationFailed("Invalid webhook token.")
        return intake.service_user(), None

    def authenticate_header(self, request):
        return 'Bearer realm="aiops"'


class WebhookTokenScheme(OpenApiAuthenticationExtension):
    """The webhook's bearer token in the OpenAPI schema."""

    target_class = WebhookTokenAuthentication
    name = "aiopsWebhookToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "AIOPS_WEBHOOK_TOKEN"}


# ---------------------------------------------------------------------------------------------------
# Alertmanager's webhook
# ---------------------------------------------------------------------------------------------------
class _LabelsField(serializers.DictField):
    child = serializers.CharField(allow_blank=True, max_length=intake.VALUE_CHARS * 4)


class AlertSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=ALERT_STATUSES)
    labels = _LabelsField()
    annotations = _LabelsField(required=False, default=dict)
    startsAt = serializers.CharField(required=False, allow_blank=True, default="", max_length=64)
    endsAt = serializers.CharField(required=False, allow_blank=True, default="", max_length=64)
    generatorURL = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)
    fingerprint = serializers.CharField(required=False, allow_blank=True, default="", max_length=64)

    class Meta:
        ref_name = "AlertmanagerAlert"


class AlertmanagerNotificationSerializer(serializers.Serializer):
    version = serializers.ChoiceField(choices=["4"])
    # An opaque key: kept exactly as sent (never trimmed), so dedupe sees what Alertmanager sent.
    groupKey = serializers.CharField(min_length=1, max_length=MAX_GROUP_KEY_CHARS, trim_whitespace=False)
    # The alerts Alertmanager left out (its `max_alerts`); with the ones sent it must fit the stored alert
    # count, a 32-bit column.
    truncatedAlerts = serializers.IntegerField(
        required=False, default=0, min_value=0, max_value=MAX_TRUNCATED_ALERTS
    )
    status = serializers.ChoiceField(choices=ALERT_STATUSES)
    receiver = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    groupLabels = _LabelsField(required=False, default=dict)
    commonLabels = _LabelsField(required=False, default=dict)
    commonAnnotations = _LabelsField(required=False, default=dict)
    externalURL = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)
    alerts = serializers.ListField(child=AlertSerializer(), max_length=MAX_ALERTS)

    class Meta:
        ref_name = "AlertmanagerNotification"

    def to_notification(self) -> intake.Notification:
        data = self.validated_data
        return intake.Notification(
            group_key=data["groupKey"],
            status=data["status"],
            receiver=data["receiver"],
            group_labels=data["groupLabels"],
            common_labels=data["commonLabels"],
            common_annotations=data["commonAnnotations"],
            external_url=data["externalURL"],
            truncated_alerts=data["truncatedAlerts"],
            alerts=[
                intake.Alert(
                    status=a["status"],
                    labels=a["labels"],
                    annotations=a["annotations"],
                    starts_at=a["startsAt"],
                    ends_at=a["endsAt"],
                    fingerprint=a["fingerprint"],
                    generator_url=a["generatorURL"],
                )
                for a in data["alerts"]
            ],
        )


class AcceptedRunSerializer(serializers.Serializer):
    sessionId = serializers.CharField(source="session_id")
    runId = serializers.CharField(source="run_id")
    status = serializers.ChoiceField(choices=RunStatus.values)
    deduplicated = serializers.BooleanField()

    class Meta:
        ref_name = "AiOpsAcceptedRun"


class WebhookResponseSerializer(serializers.Serializer):
    run = AcceptedRunSerializer(allow_null=True)

    class Meta:
        ref_name = "AlertmanagerWebhookResponse"


class AlertmanagerWebhookApi(ApiView):
    """Alertmanager's webhook (see the module docstring): 202 a run was started or found for the
    group's firing alerts; 200 nothing fires; 400 not a version 4 payload; 401 no or a wrong token; 429
    the client address is locked out after repeated wrong tokens."""

    # Not anonymous: its own authentication (the webhook token, as the AI Ops service user) instead of
    # sessions and user tokens; ApiView then requires it like any other.
    authentication_classes = [WebhookTokenAuthentication]

    @extend_schema(
        operation_id="aiops_alertmanager_webhook",
        summary="Alertmanager webhook: start an AI Ops analysis per firing alert group",
        request=AlertmanagerNotificationSerializer,
        responses={
            200: WebhookResponseSerializer,
            202: WebhookResponseSerializer,
            **error_responses(400, 401, 429),
        },
        tags=["aiops"],
    )
    def post(self, request):
        body = AlertmanagerNotificationSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        accepted = intake.accept_notification(body.to_notification())
        data = WebhookResponseSerializer({"run": accepted}).data
        return Response(data, status=status.HTTP_200_OK if accepted is None else status.HTTP_202_ACCEPTED)


# ---------------------------------------------------------------------------------------------------
# Staff analyses
# ---------------------------------------------------------------------------------------------------
# The request bodies Swagger UI offers (its default is the first): each one is accepted as it stands
# (tests/surfaces/api/test_aiops_examples.py posts every example of the schema and expects 202).
ANALYSIS_EXAMPLES = [
    OpenApiExample(
        "An Alertmanager alert",
        request_only=True,
        value={
            "alert": {
                "labels": {"alertname": "HighLatency", "severity": "critical", "job": "api"},
                "annotations": {"summary": "p99 latency of api above 2 s for 10 minutes"},
            }
        },
    ),
    OpenApiExample(
        "An alert as text",
        request_only=True,
        value={"alert": "HighLatency firing on api: p99 above 2 s"},
    ),
    OpenApiExample(
        "A question",
        request_only=True,
        value={"query": "Why is the p99 latency of api above 2 s since 14:00?"},
    ),
]


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "maxLength": services.QUERY_MAX_CHARS},
            {
                "type": "object",
                "properties": {
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                    "startsAt": {"type": "string"},
                },
                "required": ["labels"],
            },
        ]
    }
)
class AlertInputField(serializers.Field):
    """An alert as text, or as an object with `labels` (string to string) and optional `annotations`."""

    def to_internal_value(self, data):
        if isinstance(data, str):
            try:
                return services.validate_query(data)
            except services.InvalidQuery as exc:
                raise serializers.ValidationError(str(exc)) from None
        if isinstance(data, dict):
            labels = _LabelsField().run_validation(data.get("labels", serializers.empty))
            annotations = _LabelsField().run_validation(data.get("annotations") or {})
            starts = data.get("startsAt") or ""
            if not isinstance(starts, str):
                raise serializers.ValidationError("startsAt must be a string.")
            return {"labels": labels, "annotations": annotations, "startsAt": starts}
        raise serializers.ValidationError("alert must be a string or an object with labels.")

    def to_representation(self, value):
        return value


class AnalysisAlertSerializer(serializers.Serializer):
    source = serializers.CharField()
    alertname = serializers.CharField()
    severity = serializers.CharField()
    alertCount = serializers.IntegerField(source="alert_count")
    labels = serializers.DictField(child=serializers.CharField())
    annotations = serializers.DictField(child=serializers.CharField())
    notifications = serializers.IntegerField()
    lastNotifiedAt = serializers.DateTimeField(source="last_notified_at")
    resolvedAt = serializers.DateTimeField(source="resolved_at", allow_null=True)

    class Meta:
        ref_name = "AiOpsAlert"


class AnalysisSerializer(serializers.Serializer):
    """One analysis, read from its `AiOpsAlert` row and the run it names."""

    runId = serializers.CharField(source="run.run_id")
    sessionId = serializers.CharField(source="run.session_id")
    status = serializers.ChoiceField(source="run.status", choices=RunStatus.values)
    releaseDecision = serializers.ChoiceField(
        source="run.release_decision", choices=ReleaseDecision.values, allow_null=True
    )
    createdAt = serializers.DateTimeField(source="created_at")
    finishedAt = serializers.DateTimeField(source="run.finished_at", allow_null=True)
    alert = AnalysisAlertSerializer(source="*")

    class Meta:
        ref_name = "AiOpsAnalysis"


class AnalysesApi(ApiView):
    """Staff only (401 anonymous; 403 not staff). `POST`: start an AI Ops analysis of `{"query": str}` or
    `{"alert": str | {"labels", "annotations"?}}` (exactly one): 202 the queued run, 400 an invalid
    body. `GET`: AI Ops analyses newest first with their alert, filterable by `alertname`, `severity`,
    `status` and `releaseDecision`, paginated (`?page=`, `?pageSize=` ≤ 100): 400 an invalid filter, 404 a
    page beyond the last."""

    permission_classes = (IsAdminUser,)

    class FilterSerializer(serializers.Serializer):
        alertname = serializers.CharField(required=False, max_length=200)
        severity = serializers.CharField(required=False, max_length=32)
        status = serializers.ChoiceField(choices=RunStatus.values, required=False)
        releaseDecision = serializers.ChoiceField(choices=ReleaseDecision.values, required=False)

    class InputSerializer(serializers.Serializer):
        query = serializers.CharField(required=False, max_length=services.QUERY_MAX_CHARS)
        alert = AlertInputField(required=False)

        class Meta:
            ref_name = "AiOpsAnalysisInput"

        def validate(self, attrs):
            if ("query" in attrs) == ("alert" in attrs):
                raise serializers.ValidationError("Give exactly one of query and alert.")
            if "query" in attrs:
                try:
                    services.validate_query(attrs["query"])
                except services.InvalidQuery as exc:
                    raise serializers.ValidationError({"query": str(exc)}) from None
            return attrs

    class OutputSerializer(serializers.Serializer):
        sessionId = serializers.CharField(source="session_id")
        runId = serializers.CharField(source="run_id")
        status = serializers.ChoiceField(choices=RunStatus.values)
        agentFlow = serializers.CharField(source="agent_flow")

        class Meta:
            ref_name = "AiOpsAnalysisCreated"

    @extend_schema(
        operation_id="aiops_analysis_create",
        summary="Start an AI Ops analysis",
        request=InputSerializer,
        examples=ANALYSIS_EXAMPLES,
        responses={202: OutputSerializer, **error_responses(400, 401, 403)},
        tags=["aiops"],
    )
    def post(self, request):
        return self.submit(
            request,
            act=lambda _, data: intake.start_staff_analysis(user=request.user, **data),
            refusals={services.InvalidQuery: lambda exc: exceptions.ValidationError({"query": str(exc)})},
            output=lambda run: self.OutputSerializer(run).data,
            status=status.HTTP_202_ACCEPTED,
        )

    @extend_schema(
        operation_id="aiops_analysis_list",
        summary="AI Ops analyses",
        parameters=[
            FilterSerializer,
            OpenApiParameter("page", int, OpenApiParameter.QUERY, required=False),
            OpenApiParameter("pageSize", int, OpenApiParameter.QUERY, required=False),
        ],
        responses={
            200: paginated_serializer(AnalysisSerializer, "AiOpsAnalysis"),
            **error_responses(400, 401, 403, 404),
        },
        tags=["aiops"],
    )
    def get(self, request):
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        data = filters.validated_data
        return paginated_response(
            serializer_class=AnalysisSerializer,
            queryset=selectors.aiops_analyses(
                alertname=data.get("alertname"),
                severity=data.get("severity"),
                status=data.get("status"),
                release_decision=data.get("releaseDecision"),
            ),
            request=request,
            view=self,
        )
