"""What the record's MCP endpoint answers, as synchronous reads for one authenticated user.

Each tool validates its arguments with DRF serializers (the REST API's fields and filters) and reads
through the REST API's selectors and read model (`diagnosis.selectors`, `audit.read`, `build_bundle`,
`verify_run`, `diagnosis.review_queue`): the same visibility, the same 404 text for absent and not yours,
the same roles after it (evidence: `CanReadEvidence`; the review queue: staff, as the admin's page).
Nothing here reads reasoning: the trace and the bundle never carry it. Refusals raise `Refused`.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from agent.knowledge.selectors import get_runbook
from audit.read import get_trace
from audit.transparency.evidence import build_bundle
from audit.verify.runs import verify_run
from core.api import NOT_FOUND_RUN, NOT_FOUND_SESSION, IdField
from diagnosis import review_queue, selectors
from diagnosis.models import KnowledgeDocument
from surfaces.api.audit_permissions import CanReadEvidence
from surfaces.api.runs import RunListApi, RunSummarySerializer
from surfaces.api.trace_render import trace_json

MAX_RESULTS = 50
MAX_RUNBOOKS = 500
NOT_FOUND_RUNBOOK = "No such runbook."
STAFF_ONLY = "The review queue is for staff."


class Refused(Exception):
    """A read refused: `kind` is `not_found`, `permission_denied` or `invalid_request`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _valid(serializer_class: type[serializers.Serializer], arguments: dict[str, Any]) -> dict[str, Any]:
    checked = serializer_class(data=arguments)
    if not checked.is_valid():
        fields = "; ".join(f"{name}: {' '.join(map(str, errors))}" for name, errors in checked.errors.items())
        raise Refused("invalid_request", f"Invalid arguments: {fields}"[:500])
    return checked.validated_data


def _filters(data: dict[str, Any]) -> selectors.RunFilters:
    return selectors.RunFilters(
        status=data.get("status"),
        release_decision=data.get("releaseDecision"),
        intent=data.get("intent"),
        created_after=data.get("createdAfter"),
        created_before=data.get("createdBefore"),
    )


# --------------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------------
class SearchArguments(RunListApi.FilterSerializer):
    text = serializers.CharField(required=False, allow_blank=True, max_length=selectors.SESSION_SEARCH_CHARS)
    sessionId = IdField(required=False)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_RESULTS, default=20)


def search_runs(user, arguments: dict[str, Any]) -> dict[str, Any]:
    """The visible runs, newest first: of one session (`sessionId`, as `GET …/runs/`) or of every
    visible session, narrowed by the run list's filters and `text` (a run or session id or its
    beginning, or words of the question: the admin's run search)."""
    data = _valid(SearchArguments, arguments)
    if data.get("sessionId"):
        session = selectors.get_visible_session(user=user, session_id=data["sessionId"])
        if session is None:
            raise Refused("not_found", NOT_FOUND_SESSION)
        runs = selectors.run_list(session=session, filters=_filters(data))
    else:
        runs = selectors.visible_runs(user=user, filters=_filters(data))
    if data.get("text"):
        runs = selectors.search_runs(queryset=runs, term=data["text"]).order_by("-created_at", "-id")
    page = list(runs[: data["limit"] + 1])
    shown = page[: data["limit"]]
    votes = selectors.feedback_of(run_ids=[run.run_id for run in shown], user=user)
    return {
        "runs": RunSummarySerializer(shown, many=True, context={"feedback": votes}).data,
        "more": len(page) > len(shown),
    }


class RunArguments(serializers.Serializer):
    sessionId = IdField(required=False)
    runId = IdField(required=False)

    def validate(self, attrs):
        if not attrs.get("sessionId") and not attrs.get("runId"):
            raise serializers.ValidationError({"runId": "give runId, sessionId or both"})
        return attrs


def _visible_run(user, data: dict[str, Any], **kwargs: Any):
    run = selectors.get_visible_run(
        user=user, session_id=data.get("sessionId"), run_id=data.get("runId"), **kwargs
    )
    if run is None:
        raise Refused("not_found", NOT_FOUND_RUN)
    return run


def trace(user, arguments: dict[str, Any]) -> str:
    """The run's decision trace as `GET …/trace` renders it (JSON text); without `runId` the session's
    latest run (`runResolution: LATEST`)."""
    data = _valid(RunArguments, arguments)
    run = _visible_run(user, data, with_feedback=True, with_session=True)
    resolution = selectors.RunResolution.EXACT if data.get("runId") else selectors.RunResolution.LATEST
    return trace_json(get_trace(run=run, run_resolution=resolution)).decode("utf-8")


def evidence_bundle(user, arguments: dict[str, Any]) -> dict[str, Any]:
    """The run's evidence bundle (`GET …/evidence`): staff and reasoning auditors, 404 before 403."""
    data = _valid(RunArguments, arguments)
    run = _visible_run(user, data)
    if not CanReadEvidence().allows(user):
        raise Refused("permission_denied", CanReadEvidence.message)
    return build_bundle(run=run)


def verification(user, arguments: dict[str, Any]) -> dict[str, Any]:
    """`verify_audit --run` of a visible run: its chain, bound rows, anchoring and stored facts."""
    data = _valid(RunArguments, arguments)
    run = _visible_run(user, data)
    result = verify_run(run.run_id)
    return {
        "runId": result.run_id,
        "ok": result.ok,
        "events": result.events,
        "chainValid": result.chain_valid,
        "rowsVerified": result.rows_verified,
        "invalid": result.invalid,
        "incomplete": result.incomplete,
        "facts": result.facts,
        "notes": result.notes,
        "leafIndex": result.leaf_index,
        "unanchored": result.unanchored,
    }


class QueueArguments(serializers.Serializer):
    reason = serializers.ChoiceField(choices=review_queue.REASON_KEYS, required=False)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_RESULTS, default=20)


def review_queue_page(user, arguments: dict[str, Any]) -> dict[str, Any]:
    """The review queue, oldest first, with its capped counts per reason (the admin's queue page)."""
    data = _valid(QueueArguments, arguments)
    if not (user.is_active and user.is_staff):
        raise Refused("permission_denied", STAFF_ONLY)
    runs = review_queue.queued_runs(reason_key=data.get("reason")).filter(
        selectors.visibility(user=user, session_path="session")
    )
    total, counts = review_queue.queue_counts()
    return {
        "total": total.count,
        "totalCapped": total.capped,
        "counts": [{"reason": c.key, "label": c.label, "count": c.count, "capped": c.capped} for c in counts],
        "runs": [
            {
                "runId": run.run_id,
                "sessionId": run.session_id,
                "createdAt": run.created_at.isoformat(),
                "status": run.status,
                "agentFlow": run.agent_flow,
                "releaseDecision": run.release_decision,
                "reasons": [r.key for r in review_queue.reasons_of(run)],
            }
            for run in runs[: data["limit"]]
        ],
    }


# --------------------------------------------------------------------------------------------------
# Resources: the runbooks
# --------------------------------------------------------------------------------------------------
def runbooks() -> list[dict[str, str]]:
    """The runbooks of the knowledge base by slug (at most `MAX_RUNBOOKS`)."""
    return list(KnowledgeDocument.objects.order_by("slug").values("slug", "title", "summary")[:MAX_RUNBOOKS])


def runbook_markdown(slug: str) -> str:
    """The runbook as markdown, each section headed by the evidence id that cites it (`kb:<slug>#<n>`)."""
    view = get_runbook(slug=slug)
    if view is None:
        raise Refused("not_found", NOT_FOUND_RUNBOOK)
    parts = [f"# {view.document.title}\n"]
    if view.document.summary:
        parts.append(f"{view.document.summary}\n")
    for chunk in view.chunks:
        parts.append(f"## {chunk.heading or view.document.title} [{chunk.evidence_id}]\n\n{chunk.text}\n")
    return "\n".join(parts)
