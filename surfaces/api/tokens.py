"""The owner's API tokens: `GET/POST /api/auth/tokens/`, `POST /api/auth/tokens/{tokenId}/revoke`.

A token is shown once, in the response that issues it (`token`); lists show its prefix, name, times,
state and whether it carries a TOTP verification, never its text or digest. Issuing needs a session
(the admin login): a token cannot mint further tokens, so a stolen one cannot outlive its own expiry.
The new token carries `otpVerified` when that session passed a TOTP check (`access.stepup`); a user who
may read reasoning gets one only then while `REASONING_REQUIRE_OTP` is on (403 `otp_required`). Another
user's token is 404, as if it did not exist.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.response import Response

from access.models import ApiToken
from access.selectors import tokens_of
from access.services import MAX_TTL_HOURS, TokenNeedsOtp, issue_token, revoke_token
from access.stepup import OTP_REQUIRED, session_verified
from core.api import ApiView, error_responses


class ApiTokenSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    prefix = serializers.CharField(help_text="The token's first 8 characters, to recognise it.")
    name = serializers.CharField()
    otpVerified = serializers.BooleanField(
        source="otp_verified", help_text="Issued after a TOTP check: satisfies REASONING_REQUIRE_OTP."
    )
    active = serializers.BooleanField()
    createdAt = serializers.DateTimeField(source="created_at")
    expiresAt = serializers.DateTimeField(source="expires_at")
    revokedAt = serializers.DateTimeField(source="revoked_at", allow_null=True)

    class Meta:
        ref_name = "ApiToken"


class IssuedTokenSerializer(ApiTokenSerializer):
    token = serializers.CharField(help_text="The token itself: shown only in this response.")

    class Meta:
        ref_name = "IssuedApiToken"


class ApiTokensApi(ApiView):
    """List the user's tokens (any authentication), or issue one (session only: 403 with a token)."""

    # Allows any authenticated user (ApiView's default): each sees and issues only their own tokens.

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=100, required=False, default="", allow_blank=True)
        ttlHours = serializers.FloatField(
            required=False, min_value=0.01, max_value=MAX_TTL_HOURS, help_text="Default API_TOKEN_TTL_HOURS."
        )

        class Meta:
            ref_name = "IssueApiTokenInput"

    @extend_schema(
        operation_id="list_api_tokens",
        summary="The user's API tokens (never their text)",
        responses={200: ApiTokenSerializer(many=True), **error_responses(401)},
        tags=["auth"],
    )
    def get(self, request):
        return Response(ApiTokenSerializer(tokens_of(user=request.user), many=True).data)

    @extend_schema(
        operation_id="issue_api_token",
        summary="Issue an API token (session only; shown once; auditors: TOTP-verified session)",
        request=InputSerializer,
        responses={201: IssuedTokenSerializer, **error_responses(400, 401, 403)},
        tags=["auth"],
    )
    def post(self, request):
        if isinstance(request.auth, ApiToken):
            raise PermissionDenied("Tokens are issued to a logged-in session, not to another token.")
        body = self.InputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            issued = issue_token(
                user=request.user,
                actor=request.user.get_username(),
                ttl_hours=body.validated_data.get("ttlHours"),
                name=body.validated_data["name"],
                otp_verified=session_verified(request),
            )
        except TokenNeedsOtp as exc:
            raise PermissionDenied(str(exc), code=OTP_REQUIRED) from exc
        data = ApiTokenSerializer(issued.token).data
        data["token"] = issued.plaintext
        return Response(data, status=status.HTTP_201_CREATED)


class RevokeApiTokenApi(ApiView):
    """Revoke one of the user's tokens (idempotent); another user's token is 404."""

    # Allows any authenticated user (ApiView's default): `tokens_of` finds only their own.

    @extend_schema(
        operation_id="revoke_api_token",
        summary="Revoke one of the user's API tokens",
        parameters=[OpenApiParameter("tokenId", int, OpenApiParameter.PATH)],
        request=None,
        responses={200: ApiTokenSerializer, **error_responses(401, 404)},
        tags=["auth"],
    )
    def post(self, request, tokenId):
        token = tokens_of(user=request.user).filter(pk=tokenId).first()
        if token is None:
            raise NotFound("No such token.")
        revoke_token(token=token, actor=request.user.get_username())
        token.refresh_from_db()
        return Response(ApiTokenSerializer(token).data)
