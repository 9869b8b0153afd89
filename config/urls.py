"""URL map: admin, REST API (trace, reasoning, chat), the OpenAPI schema with Swagger UI, the chat page,
the runbook view, the service metrics and the readiness probe."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from surfaces.admin.stepup import verify_otp
from surfaces.api.aiops import AlertmanagerWebhookApi, AnalysesApi
from surfaces.api.audit import (
    CheckpointListApi,
    ConsistencyApi,
    EvidenceApi,
    LegalHoldsApi,
    LiftLegalHoldApi,
    RunReviewsApi,
    SessionAuditsApi,
    TraceApi,
)
from surfaces.api.reasoning import ReasoningApi
from surfaces.api.runs import ApprovalDecisionApi, ApprovalListApi, RunFeedbackApi, RunListApi, SessionListApi
from surfaces.api.tokens import ApiTokensApi, RevokeApiTokenApi
from surfaces.chat import pages as chat_pages
from surfaces.chat import sse as chat_sse
from surfaces.health import healthz
from surfaces.oidc_views import sign_out, signed_out
from telemetry import views as telemetry_views

urlpatterns = [
    path("", chat_pages.front_door, name="front-door"),
    path("favicon.ico", chat_pages.favicon, name="favicon"),
    # The admin's TOTP step-up for reading reasoning (surfaces/admin/stepup.py), before the admin's own URLs.
    path("admin/verify-otp/", verify_otp, name="verify-otp"),
    # Log out (the admin's and the chat's): a single sign-on session ends at the provider too
    # (surfaces/oidc_views.py); any other is the admin's own logout.
    path("admin/logout/", sign_out, name="sign-out"),
    path("admin/", admin.site.urls),
    # OpenID Connect sign-in and sign-out (surfaces/oidc_views.py): 404 while OIDC_ENABLED is off.
    path("oidc/logout/", sign_out, name="oidc-logout"),
    path("oidc/signed-out/", signed_out, name="oidc-signed-out"),
    path("oidc/", include("mozilla_django_oidc.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's init script as its own request: no inline script (core/csp.py).
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="swagger-ui"),
    # Trace and reasoning API. Path parameters are named as in the API contract.
    path("api/diagnosis/sessions/", SessionListApi.as_view(), name="api-session-list"),
    path("api/diagnosis/approvals/", ApprovalListApi.as_view(), name="api-approvals"),
    path(
        "api/diagnosis/<str:sessionId>/runs/<str:runId>/approvals/<str:toolCallId>",
        ApprovalDecisionApi.as_view(),
        name="api-run-approval",
    ),
    path("api/diagnosis/<str:sessionId>/runs/", RunListApi.as_view(), name="api-run-list"),
    path("api/diagnosis/<str:sessionId>/trace", TraceApi.as_view(), name="api-trace"),
    path("api/diagnosis/<str:sessionId>/trace/reasoning", ReasoningApi.as_view(), name="api-trace-reasoning"),
    path("api/diagnosis/<str:sessionId>/audits", SessionAuditsApi.as_view(), name="api-session-audits"),
    path(
        "api/diagnosis/<str:sessionId>/runs/<str:runId>/feedback",
        RunFeedbackApi.as_view(),
        name="api-run-feedback",
    ),
    path(
        "api/diagnosis/<str:sessionId>/runs/<str:runId>/evidence",
        EvidenceApi.as_view(),
        name="api-run-evidence",
    ),
    path(
        "api/diagnosis/<str:sessionId>/runs/<str:runId>/reviews",
        RunReviewsApi.as_view(),
        name="api-run-reviews",
    ),
    path("api/diagnosis/<str:sessionId>/holds", LegalHoldsApi.as_view(), name="api-legal-holds"),
    path(
        "api/diagnosis/<str:sessionId>/holds/<int:holdId>/lift",
        LiftLegalHoldApi.as_view(),
        name="api-legal-hold-lift",
    ),
    # The user's own API tokens (surfaces/api/tokens.py).
    path("api/auth/tokens/", ApiTokensApi.as_view(), name="api-tokens"),
    path("api/auth/tokens/<int:tokenId>/revoke", RevokeApiTokenApi.as_view(), name="api-token-revoke"),
    # The transparency log (docs/audit-integrity.md).
    path("api/audit/checkpoints/", CheckpointListApi.as_view(), name="api-checkpoints"),
    path(
        "api/audit/checkpoints/<int:treeSize>/consistency",
        ConsistencyApi.as_view(),
        name="api-checkpoint-consistency",
    ),
    # AI Ops analyses (docs/aiops.md): Alertmanager's webhook and staff requests queue runs.
    path("api/aiops/alertmanager", AlertmanagerWebhookApi.as_view(), name="api-aiops-alertmanager"),
    path("api/aiops/analyses", AnalysesApi.as_view(), name="api-aiops-analyses"),
    # Chat stream, run events and cancel: async views, Server-Sent Events (docs/chat.md).
    path("api/chat", chat_sse.chat_stream, name="api-chat"),
    path("api/diagnosis/<str:sessionId>/runs/<str:runId>/events", chat_sse.run_events, name="api-run-events"),
    path("api/diagnosis/<str:sessionId>/runs/<str:runId>/cancel", chat_sse.cancel_run, name="api-run-cancel"),
    path("chat/", chat_pages.chat_page, name="chat"),
    path("chat/runs/<str:run_id>/admin/", chat_pages.run_admin_redirect, name="chat-run-admin"),
    # The runbook a citation names, read-only, the cited chunk highlighted (surfaces.answers links here).
    path("knowledge/<slug:slug>/", chat_pages.knowledge_document, name="knowledge-document"),
    # Service metrics for Prometheus (docs/observability.md): bearer METRICS_TOKEN, or internal only.
    path("metrics", telemetry_views.metrics, name="metrics"),
    # Readiness for the proxy and the process manager (surfaces/health.py): no authentication, no data.
    path("healthz", healthz, name="healthz"),
]

# Errors under /api/ in the contract's JSON shape (core.api); other paths keep Django's pages.
handler404 = "core.api.handler404"
handler500 = "core.api.handler500"
