"""Trace endpoints (`…/trace`, `…/audits`), the transparency log's (a run's evidence, checkpoints and
their consistency proofs), legal holds and reviews, under `/api/diagnosis/{sessionId}/…` and
`/api/audit/…`.

Thin views (`core.api.ApiView`): validate the request, find the object through `diagnosis.selectors`'
visibility rule, ask a selector, render through a serializer. The roles are
`surfaces.api.audit_permissions`; the read model `audit.read`; the shapes `surfaces.api.audit_serializers`.
Details: docs/api.md (the endpoint table and each endpoint).
"""

from __future__ import annotations

import re

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from audit.models import REVIEW_NOTE_CHARS, Checkpoint, HoldScope, ReviewVerdict
from audit.read import AuditKind, get_session_audits, get_trace, review_views
from audit.transparency import store
from audit.transparency.evidence import build_bundle, checkpoint_document
from audit.transparency.keys import published_keys
from audit.verify.holds import holds_of_session
from audit.write.retention import lift_hold, place_hold
from audit.write.reviews import RunNotFinished, record_review
from core.api import (
    NOT_FOUND_RUN,
    NOT_FOUND_SESSION,
    ApiView,
    Conflict,
    IdField,
    error_responses,
    paginated_response,
)
from core.ids import MAX_ID_CHARS
from diagnosis.selectors import RunResolution, get_visible_run, get_visible_session
from surfaces.api.audit_permissions import CanPlaceLegalHold, CanReadEvidence, CanReviewRun, IsSuperuser
from surfaces.api.audit_serializers import (
    CheckpointPageSerializer,
    CheckpointSerializer,
    ConsistencyQuerySerializer,
    ConsistencySerializer,
    EvidenceBundleSerializer,
    LegalHoldSerializer,
    ReviewSerializer,
    StepSerializer,
    ToolSerializer,
    TraceSerializer,
)
from surfaces.api.trace_render import TraceRenderer


class TraceApi(ApiView):
    """The decision trace of one run: run, ordered timeline, model steps, tools and an audit summary.

    With `runId` the run must belong to the session (`runResolution` EXACT); without it the session's
    latest run is used (LATEST). 401 anonymous; 400 `runId` given but empty or longer than 64
    characters; 404 the session is absent or not the user's (staff see all), or the run is not in it.
    Never carries reasoning or assistant text. Constant query count whatever the run's size.
    """

    renderer_classes = [TraceRenderer]

    class QuerySerializer(serializers.Serializer):
        runId = IdField(required=False)

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
        run_id = self.run_id_of(request.query_params)
        run = self.found(
            request,
            get_visible_run(
                user=request.user, session_id=sessionId, run_id=run_id, with_feedback=True, with_session=True
            ),
            NOT_FOUND_RUN,
        )
        trace = get_trace(
            run=run, run_resolution=RunResolution.EXACT if run_id is not None else RunResolution.LATEST
        )
        # Same body as TraceSerializer(trace).data (the documented shape), built without DRF's per-field
        # dispatch and with the events' stored details text, which dominated long traces
        # (surfaces/api/trace_render.py, docs/performance.md).
        return Response(trace)

    @classmethod
    def run_id_of(cls, params) -> str | None:
        """The validated `runId` (None when absent): a value of letters, digits, `_` and `-` within the
        id limit is what `QuerySerializer` would return unchanged, taken without building it (≈ 0.1 ms
        a read); any other value goes through it (400, or the trimmed value)."""
        value = params.get("runId")
        if value is None or _PLAIN_ID.fullmatch(value):
            return value
        query = cls.QuerySerializer(data=params)
        query.is_valid(raise_exception=True)
        return query.validated_data.get("runId")


_PLAIN_ID = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_ID_CHARS}}}")


class AuditRecordSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=[AuditKind.MODEL_STEP, AuditKind.TOOL])
    runId = serializers.CharField(source="run_id")
    createdAt = serializers.DateTimeField(source="created_at")
    step = StepSerializer(allow_null=True, help_text="Set when kind is MODEL_STEP.")
    tool = ToolSerializer(allow_null=True, help_text="Set when kind is TOOL.")

    class Meta:
        ref_name = "AuditRecord"


class SessionAuditsApi(ApiView):
    """The newest 500 model-step and tool records across a session's runs, oldest first, for superusers.

    401 anonymous; 404 the session is absent or not visible to the user; 403 visible but the user is not
    a superuser. `truncated` is true when the session holds more than 500 such records.
    """

    permission_classes = (IsSuperuser,)
    object_checked = True

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
        session = self.found(
            request, get_visible_session(user=request.user, session_id=sessionId), NOT_FOUND_SESSION
        )
        return Response(self.OutputSerializer(get_session_audits(session_id=session.session_id)).data)


# --------------------------------------------------------------------------------------------------
# Transparency log: evidence bundles, checkpoints, consistency proofs
# --------------------------------------------------------------------------------------------------
class EvidenceApi(ApiView):
    """The evidence bundle of one run (`audit.transparency.bundle` describes the format), verifiable
    offline with `python -m audit.verify_bundle FILE --public-key KEY`.

    401 anonymous; 404 the session is absent or not visible, or the run is not in it; 403 visible but the
    user is neither staff nor holds `reasoning.view_reasoning_content`. Never carries reasoning content:
    reasoning rows appear as their digests only. A run not yet anchored has `anchor: null`.
    """

    permission_classes = (CanReadEvidence,)
    object_checked = True

    @extend_schema(
        operation_id="run_evidence",
        summary="Evidence bundle of one run (staff and auditors)",
        parameters=[
            OpenApiParameter("sessionId", str, OpenApiParameter.PATH),
            OpenApiParameter("runId", str, OpenApiParameter.PATH),
        ],
        responses={200: EvidenceBundleSerializer, **error_responses(401, 403, 404)},
        tags=["evidence"],
    )
    def get(self, request, sessionId, runId):
        run = self.found(
            request, get_visible_run(user=request.user, session_id=sessionId, run_id=runId), NOT_FOUND_RUN
        )
        return Response(build_bundle(run=run))


class CheckpointListApi(ApiView):
    """Signed checkpoints of the transparency log, newest first, paginated, with the public keys they
    verify under (`publicKeys`: every signing key and retired key this deployment knows). 401 anonymous;
    403 neither staff nor a reasoning auditor."""

    permission_classes = (CanReadEvidence,)

    @extend_schema(
        operation_id="checkpoints",
        summary="Signed checkpoints of the transparency log, newest first (staff and auditors)",
        parameters=[OpenApiParameter("page", int, OpenApiParameter.QUERY, required=False)],
        responses={200: CheckpointPageSerializer, **error_responses(401, 403, 404)},
        tags=["evidence"],
    )
    def get(self, request):
        response = paginated_response(
            serializer_class=CheckpointSerializer,
            queryset=Checkpoint.objects.order_by("-tree_size"),
            request=request,
            view=self,
        )
        response.data["publicKeys"] = published_keys()
        return response


class ConsistencyApi(ApiView):
    """A consistency proof (RFC 9162 §2.1.4) that the checkpoint of `treeSize` extends the tree of
    `from` leaves: verify it with the root you hold for `from` (`fromRootHash` is the stored one) and
    the checkpoint's signed root. 401; 403 neither staff nor a reasoning auditor; 400 `from` missing or
    not in 1..treeSize; 404 no checkpoint of that size."""

    permission_classes = (CanReadEvidence,)

    @extend_schema(
        operation_id="checkpoint_consistency",
        summary="Consistency proof between two tree sizes (staff and auditors)",
        parameters=[
            OpenApiParameter("treeSize", int, OpenApiParameter.PATH),
            OpenApiParameter(
                "from", int, OpenApiParameter.QUERY, required=True, description="The older tree size."
            ),
        ],
        responses={200: ConsistencySerializer, **error_responses(400, 401, 403, 404)},
        tags=["evidence"],
    )
    def get(self, request, treeSize):
        query = ConsistencyQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        older = query.validated_data["from"]
        checkpoint = Checkpoint.objects.filter(tree_size=treeSize).first()
        if older > treeSize:
            raise ValidationError({"from": [f"must be at most the tree size {treeSize}"]})
        if checkpoint is None:
            raise NotFound("No checkpoint of this tree size.")
        proof = store.consistency_proof(older, treeSize)
        previous = Checkpoint.objects.filter(tree_size=older).first()
        body = {
            "fromTreeSize": older,
            "treeSize": treeSize,
            "fromRootHash": store.root(older).hex(),
            "rootHash": checkpoint.root_hash,
            "proof": proof.hex,
            "checkpoint": _signed_notes(checkpoint),
            "fromCheckpoint": _signed_notes(previous) if previous else None,
        }
        return Response(body)


def _signed_notes(cp: Checkpoint) -> dict:
    """A checkpoint as the consistency endpoint returns it: its body and signature (as before issue 50)
    and the signed notes a witness or note verifier reads (`note`, `link`; null for a JSON body)."""
    document = checkpoint_document(cp)
    return {
        "body": cp.body,
        "signature": cp.signature,
        "note": document.get("note"),
        "link": document.get("link"),
    }


# --------------------------------------------------------------------------------------------------
# Legal holds
# --------------------------------------------------------------------------------------------------
class LegalHoldsApi(ApiView):
    """Legal holds on a session and its runs: list them (GET), or place one (POST `{"reason", "runId"?}`:
    on the run when `runId` is given, else on the whole session). While a hold is active, neither the
    trace retention purge nor the reasoning purge touches the records it covers.

    401 anonymous; 400 an invalid body (POST); 404 the session (or the run in it) is absent or not
    visible; 403 without `audit.place_legal_hold`.
    """

    permission_classes = (CanPlaceLegalHold,)
    object_checked = True

    class InputSerializer(serializers.Serializer):
        reason = serializers.CharField(max_length=1000)
        runId = IdField(required=False)

        class Meta:
            ref_name = "LegalHoldInput"

    @extend_schema(
        operation_id="legal_holds",
        summary="Legal holds on a session and its runs",
        parameters=[OpenApiParameter("sessionId", str, OpenApiParameter.PATH)],
        responses={200: LegalHoldSerializer(many=True), **error_responses(401, 403, 404)},
        tags=["evidence"],
    )
    def get(self, request, sessionId):
        session = self.found(
            request, get_visible_session(user=request.user, session_id=sessionId), NOT_FOUND_SESSION
        )
        return Response(LegalHoldSerializer(holds_of_session(session_id=session.session_id), many=True).data)

    @extend_schema(
        operation_id="place_legal_hold",
        summary="Place a legal hold on a session or one of its runs",
        parameters=[OpenApiParameter("sessionId", str, OpenApiParameter.PATH)],
        request=InputSerializer,
        responses={201: LegalHoldSerializer, **error_responses(400, 401, 403, 404)},
        tags=["evidence"],
    )
    def post(self, request, sessionId):
        def find(data):
            session = get_visible_session(user=request.user, session_id=sessionId)
            # The run must be in the session: its 404 too comes before the role (checked on the session).
            run_id = data.get("runId")
            if (
                session is not None
                and run_id is not None
                and get_visible_run(user=request.user, session_id=sessionId, run_id=run_id) is None
            ):
                raise NotFound(NOT_FOUND_RUN)
            return session

        return self.submit(
            request,
            find=find,
            not_found=NOT_FOUND_SESSION,
            act=lambda session, data: place_hold(
                user=request.user,
                scope=HoldScope.RUN if data.get("runId") else HoldScope.SESSION,
                target_id=data.get("runId") or session.session_id,
                reason=data["reason"],
            ),
            output=lambda hold: LegalHoldSerializer(hold).data,
            status=201,
        )


class LiftLegalHoldApi(ApiView):
    """Lift a legal hold of this session (or of one of its runs): `{"reason"}`; who, when and why are
    recorded. 401; 400 an invalid body or a hold already lifted; 404 the session or hold is absent or
    not visible; 403 without `audit.place_legal_hold`."""

    # The role is checked on the session before the hold is looked up: only a user who may place holds
    # learns which holds exist (a 404 for a made-up hold and a 403 for a real one would tell the others).
    permission_classes = (CanPlaceLegalHold,)
    object_checked = True

    class InputSerializer(serializers.Serializer):
        reason = serializers.CharField(max_length=1000)

        class Meta:
            ref_name = "LiftLegalHoldInput"

    @extend_schema(
        operation_id="lift_legal_hold",
        summary="Lift a legal hold",
        parameters=[
            OpenApiParameter("sessionId", str, OpenApiParameter.PATH),
            OpenApiParameter("holdId", int, OpenApiParameter.PATH),
        ],
        request=InputSerializer,
        responses={200: LegalHoldSerializer, **error_responses(400, 401, 403, 404)},
        tags=["evidence"],
    )
    def post(self, request, sessionId, holdId):
        def lift(session, data):
            hold = holds_of_session(session_id=session.session_id).filter(pk=holdId).first()
            if hold is None:
                raise NotFound("No such hold.")
            return lift_hold(user=request.user, hold=hold, reason=data["reason"])

        return self.submit(
            request,
            find=lambda _: get_visible_session(user=request.user, session_id=sessionId),
            not_found=NOT_FOUND_SESSION,
            act=lift,
            output=lambda hold: LegalHoldSerializer(hold).data,
        )


# --------------------------------------------------------------------------------------------------
# Reviews
# --------------------------------------------------------------------------------------------------
NOT_FINISHED_REVIEW = "The run has not finished; only finished runs are reviewed."


class RunReviewsApi(ApiView):
    """Record a review of a finished run: `{"verdict": "correct" | "incorrect" | "unsafe" |
    "needs_follow_up", "note"?: str ≤ 2000}` → 201 with the review. Append-only: a later review
    supersedes an earlier one in the trace's `reviews`, none is changed. Recorded as a chained
    `REVIEW_RECORDED` event of the run and a review row bound to it (`audit.write.reviews`).

    401 anonymous; 400 invalid body; 404 the session or run is absent or not visible (same body); 403
    visible but without `audit.review_run`; 409 the run has not finished yet.
    """

    permission_classes = (CanReviewRun,)
    object_checked = True

    class InputSerializer(serializers.Serializer):
        verdict = serializers.ChoiceField(choices=ReviewVerdict.values)
        note = serializers.CharField(
            max_length=REVIEW_NOTE_CHARS, required=False, allow_blank=True, default=""
        )

        class Meta:
            ref_name = "ReviewInput"

    @extend_schema(
        operation_id="record_review",
        summary="Record a review of a finished run (audit.review_run)",
        parameters=[
            OpenApiParameter("sessionId", str, OpenApiParameter.PATH),
            OpenApiParameter("runId", str, OpenApiParameter.PATH),
        ],
        request=InputSerializer,
        responses={201: ReviewSerializer, **error_responses(400, 401, 403, 404, 409)},
        tags=["trace"],
    )
    def post(self, request, sessionId, runId):
        return self.submit(
            request,
            find=lambda _: get_visible_run(user=request.user, session_id=sessionId, run_id=runId),
            not_found=NOT_FOUND_RUN,
            act=lambda run, data: record_review(run=run, user=request.user, **data),
            refusals={RunNotFinished: lambda exc: Conflict(NOT_FINISHED_REVIEW)},
            output=lambda review: ReviewSerializer(review_views([review])[0]).data,
            status=201,
        )
