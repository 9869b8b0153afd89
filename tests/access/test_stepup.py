"""The second factor for reasoning (`REASONING_REQUIRE_OTP` on): a password alone — a session that has
not passed a TOTP check, or a token issued without one — is refused (403 `otp_required`, API; the
verify panel, admin); a verified session and a token issued after verification read reasoning. Off, as
in development, nothing changes. The TOTP page's failures count towards the lockout."""

from __future__ import annotations

import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from access.models import ApiToken
from reasoning.models import ReasoningAccessLog
from tests.factories import REASONING_MARKER, issue_token, totp_code, totp_device

pytestmark = pytest.mark.django_db


@pytest.fixture
def require_otp(settings):
    settings.REASONING_REQUIRE_OTP = True


def _url(run) -> str:
    return f"/api/diagnosis/{run.session_id}/trace/reasoning?runId={run.run_id}"


def _verify_session(client, device) -> None:
    response = client.post("/admin/verify-otp/", {"otp_token": totp_code(device), "next": "/admin/"})
    assert response.status_code == 302 and response["Location"] == "/admin/"


def test_off_by_default_in_development_and_tests(settings, api_client, auditor, traced_run):
    assert settings.REASONING_REQUIRE_OTP is False
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(auditor)}")
    assert api_client.get(_url(traced_run)).status_code == 200


def test_api_refuses_a_password_only_session_and_a_plain_token(
    require_otp, api_client, django_user_model, traced_run
):
    from django.contrib.auth.models import Group

    auditor = django_user_model.objects.create_user("auditor", password="pw-auditor-1", is_staff=True)
    plain = issue_token(auditor)  # issued while they could not read reasoning: carries no TOTP check
    auditor.groups.add(Group.objects.get(name="Reasoning Auditors"))
    api_client.force_login(auditor)
    refused = api_client.get(_url(traced_run))
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "otp_required"
    assert REASONING_MARKER not in refused.content.decode()
    api_client.logout()
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {plain}")
    assert api_client.get(_url(traced_run)).json()["error"]["code"] == "otp_required"
    assert not ReasoningAccessLog.objects.exists()


def test_no_token_for_an_auditor_without_a_totp_check_through_the_api(require_otp, client, auditor, user):
    from audit.models import GovernanceEvent

    client.force_login(auditor)  # a password-only session
    events = GovernanceEvent.objects.count()
    refused = client.post("/api/auth/tokens/", {"name": "audit"}, content_type="application/json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "otp_required"
    assert not ApiToken.objects.exists() and GovernanceEvent.objects.count() == events
    # A user who cannot read reasoning still gets one (it carries no TOTP check).
    client.force_login(user)
    issued = client.post("/api/auth/tokens/", {}, content_type="application/json")
    assert issued.status_code == 201 and issued.json()["otpVerified"] is False


def test_the_rule_covers_the_permission_held_directly_and_superusers(require_otp, user, superuser):
    from django.contrib.auth.models import Permission

    from access.services import TokenNeedsOtp
    from access.services import issue_token as issue

    for holder in (user, superuser):
        if holder is user:
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label="reasoning", codename="view_reasoning_content")
            )
        with pytest.raises(TokenNeedsOtp):
            issue(user=holder, actor="tests")
        assert issue(user=holder, actor="tests", otp_verified=True).token.otp_verified
    assert ApiToken.objects.count() == 2


def test_issue_token_command_refuses_an_auditor_without_otp(require_otp, auditor, user):
    with pytest.raises(CommandError, match=r"may read reasoning and REASONING_REQUIRE_OTP is on.*--otp CODE"):
        call_command("issue_token", "auditor", stdout=StringIO(), stderr=StringIO())
    with pytest.raises(CommandError, match="has no confirmed TOTP device"):
        call_command("issue_token", "auditor", "--otp", "123456", stdout=StringIO(), stderr=StringIO())
    assert not ApiToken.objects.exists()
    out = StringIO()
    call_command("issue_token", user.username, stdout=out, stderr=StringIO())  # not an auditor
    assert ApiToken.objects.get(prefix=out.getvalue().strip()[:8]).otp_verified is False


def test_with_the_step_up_off_an_auditor_gets_a_plain_token(auditor):
    out = StringIO()
    call_command("issue_token", "auditor", stdout=out, stderr=StringIO())
    assert ApiToken.objects.get(prefix=out.getvalue().strip()[:8]).otp_verified is False


def test_a_user_without_the_permission_is_still_plain_permission_denied(
    require_otp, api_client, user, traced_run
):
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(user, otp_verified=True)}")
    assert api_client.get(_url(traced_run)).json()["error"]["code"] == "permission_denied"


def test_api_allows_a_verified_session_and_the_token_it_issues(require_otp, client, auditor, traced_run):
    device = totp_device(auditor)
    client.force_login(auditor)
    _verify_session(client, device)
    response = client.get(_url(traced_run))
    assert response.status_code == 200 and REASONING_MARKER in response.content.decode()

    issued = client.post("/api/auth/tokens/", {"name": "audit"}, content_type="application/json").json()
    assert issued["otpVerified"] is True
    from rest_framework.test import APIClient

    script = APIClient()
    script.credentials(HTTP_AUTHORIZATION=f"Token {issued['token']}")
    assert script.get(_url(traced_run)).status_code == 200
    assert ReasoningAccessLog.objects.count() == 2


def test_issue_token_with_a_totp_code_carries_the_verification(require_otp, api_client, auditor, traced_run):
    device = totp_device(auditor)
    with pytest.raises(CommandError, match="not valid"):
        call_command(
            "issue_token", "auditor", "--otp", "000000" if totp_code(device) != "000000" else "111111"
        )
    device.refresh_from_db()
    device.throttle_reset()  # django-otp delays a device's next check after a failure
    out = StringIO()
    call_command("issue_token", "auditor", "--otp", totp_code(device), stdout=out, stderr=StringIO())
    token = out.getvalue().strip()
    assert ApiToken.objects.get(prefix=token[:8]).otp_verified
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert api_client.get(_url(traced_run)).status_code == 200


def test_admin_panel_asks_for_the_second_factor_then_shows_reasoning(
    require_otp, client, auditor, traced_run
):
    from tests.surfaces.admin.support import grant_console

    grant_console(auditor)
    device = totp_device(auditor)
    client.force_login(auditor)
    panel = f"/admin/diagnosis/diagnosisrun/{traced_run.pk}/reasoning/"
    refused = client.post(panel, HTTP_X_REQUESTED_WITH="fetch")
    assert refused.status_code == 403 and refused["X-Step-Up"] == "otp"
    assert b"dc-verify-otp" in refused.content and REASONING_MARKER.encode() not in refused.content
    assert not ReasoningAccessLog.objects.exists()
    _verify_session(client, device)
    shown = client.post(panel, HTTP_X_REQUESTED_WITH="fetch")
    assert shown.status_code == 200 and REASONING_MARKER in shown.content.decode()
    assert ReasoningAccessLog.objects.get().channel == "ADMIN"


def test_wrong_totp_codes_are_counted_and_lock_out(settings, client, auditor):
    settings.LOCKOUT_FAILURE_LIMIT = 3
    settings.OTP_TOTP_THROTTLE_FACTOR = 0  # django-otp's delay: tests/access/test_credentials.py
    device = totp_device(auditor)
    client.force_login(auditor)
    wrong = "123456" if totp_code(device) != "123456" else "654321"
    for _ in range(2):
        page = client.post("/admin/verify-otp/", {"otp_token": wrong})
        assert page.status_code == 200 and b"not valid" in page.content
    assert client.post("/admin/verify-otp/", {"otp_token": wrong}).status_code == 429
    # Locked out: even the right code is refused now.
    assert (
        client.post("/admin/verify-otp/", {"otp_token": totp_code(device, at=time.time())}).status_code == 429
    )


def test_bootstrap_demo_prints_the_auditors_totp_secret_once(settings, user):
    import base64
    import re

    from django_otp.oath import totp

    from tests.factories import make_recorded_run

    settings.DEBUG = True
    make_recorded_run(user)  # a database with runs: no demo runs are added
    first, second = StringIO(), StringIO()
    call_command("bootstrap_demo", stdout=first)
    call_command("bootstrap_demo", stdout=second)
    secret = re.search(r"secret ([A-Z2-7]+)", first.getvalue()).group(1)
    assert "secret" not in second.getvalue()  # shown once
    from django_otp.plugins.otp_totp.models import TOTPDevice

    device = TOTPDevice.objects.get(user__username="auditor")
    key = base64.b32decode(secret + "=" * (-len(secret) % 8))
    assert device.verify_token(f"{totp(key):06d}")  # what an authenticator app computes from it
