"""Each kind of credential is counted apart (issue 45 item 4, docs/security.md section 1).

Wrong passwords, wrong TOTP codes and failed tokens of one account lock only their own counter (per
account and address): a locked password never refuses the account's valid token or TOTP code, and so
on. The step-up page says what happened to a code: wrong, already used, or not checked during
django-otp's delay (and then not counted). All through real requests and the real axes backend.
"""

from __future__ import annotations

import html
import time
from io import StringIO

import pytest
from axes.models import AccessAttempt
from django.core.management import CommandError, call_command
from django.test import Client
from rest_framework.test import APIClient

from access.models import ApiToken
from audit.models import GovernanceEvent, GovernanceEventType
from tests.factories import issue_token, totp_code, totp_device

LIMIT = 5
SESSIONS = "/api/diagnosis/sessions/"
NAT = "203.0.113.7"
VERIFY = "/admin/verify-otp/"


@pytest.fixture(autouse=True)
def _limits(settings):
    settings.LOCKOUT_FAILURE_LIMIT = LIMIT
    settings.OTP_TOTP_THROTTLE_FACTOR = 0  # django-otp's own delay: its test turns it back on


def _token_status(token: str) -> int:
    client = APIClient(REMOTE_ADDR=NAT)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client.get(SESSIONS).status_code


def _login(username: str, password: str) -> tuple[Client, object]:
    client = Client(REMOTE_ADDR=NAT)
    return client, client.post("/admin/login/", {"username": username, "password": password})


def _verify(client: Client, code: str):
    return client.post(VERIFY, {"otp_token": code}, REMOTE_ADDR=NAT)


def _signed_in_auditor(auditor) -> Client:
    client = Client(REMOTE_ADDR=NAT)
    client.force_login(auditor)
    return client


def _text(response) -> str:
    return html.unescape(response.content.decode())


def _wrong(device) -> str:
    return "123456" if totp_code(device) != "123456" else "654321"


def _counters() -> dict[str, str]:
    """The lockout events' counters by subject, in order."""
    events = GovernanceEvent.objects.filter(event_type=GovernanceEventType.LOCKED_OUT).order_by("sequence_no")
    return {e.details["counter"]: e.subject_user for e in events}


def test_wrong_passwords_lock_the_password_only_the_token_and_the_code_still_work(auditor):
    device = totp_device(auditor)
    token = issue_token(auditor)
    statuses = [_login("auditor", "wrong")[1].status_code for _ in range(LIMIT)]
    assert statuses == [200] * (LIMIT - 1) + [429]
    client, right = _login("auditor", "pw-auditor-1")
    assert right.status_code == 429 and "_auth_user_id" not in client.session  # the password is locked
    # The integration that never typed anything keeps working from the same address ...
    assert _token_status(token) == 200
    # ... and a signed-in session's TOTP step-up too.
    verified = _verify(_signed_in_auditor(auditor), totp_code(device))
    assert verified.status_code == 302
    assert _counters() == {"password": "auditor"}
    assert AccessAttempt.objects.get().username == "auditor"


def test_wrong_totp_codes_lock_the_codes_only_the_password_and_the_token_still_work(auditor):
    device = totp_device(auditor)
    token = issue_token(auditor)
    session = _signed_in_auditor(auditor)
    pages = [_verify(session, _wrong(device)) for _ in range(LIMIT)]
    assert [p.status_code for p in pages] == [200] * (LIMIT - 1) + [429]
    assert "1 try left before this account's authenticator codes are refused" in _text(pages[-2])
    assert "authenticator codes from this address" in _text(pages[-1])
    assert _verify(session, totp_code(device)).status_code == 429  # the codes are locked
    client, right = _login("auditor", "pw-auditor-1")
    assert right.status_code == 302 and "_auth_user_id" in client.session
    assert _token_status(token) == 200
    assert _counters() == {"totp": "auditor"}


def test_failed_tokens_lock_the_tokens_only_the_password_and_the_code_still_work(auditor):
    device = totp_device(auditor)
    revoked = issue_token(auditor)
    ApiToken.objects.filter(prefix=revoked[:8]).update(revoked_at="2026-01-01T00:00:00Z")
    assert [_token_status(revoked) for _ in range(LIMIT)] == [401] * (LIMIT - 1) + [429]
    assert _token_status(issue_token(auditor)) == 429  # the same kind: no guess is confirmed
    client, right = _login("auditor", "pw-auditor-1")
    assert right.status_code == 302 and "_auth_user_id" in client.session
    assert _verify(client, totp_code(device)).status_code == 302
    assert _counters() == {"token": "auditor"}


def test_a_username_naming_another_counter_is_refused_unchecked_and_uncounted(auditor):
    device = totp_device(auditor)
    for _ in range(LIMIT + 1):
        _, page = _login("auditor (totp code)", "wrong")
        assert page.status_code == 200 and "Please enter the correct username" in _text(page)
    assert not AccessAttempt.objects.exists()
    assert _verify(_signed_in_auditor(auditor), totp_code(device)).status_code == 302


def test_a_reused_code_is_already_used_and_counted(auditor):
    device = totp_device(auditor)
    code = totp_code(device)
    assert _verify(_signed_in_auditor(auditor), code).status_code == 302
    again = _verify(_signed_in_auditor(auditor), code)
    page = _text(again)
    assert again.status_code == 200 and "That code was already used" in page and "not valid" not in page
    assert f"{LIMIT - 1} tries left" in page
    assert AccessAttempt.objects.get().username == "auditor (totp code)"
    with pytest.raises(CommandError, match="already used"):
        call_command("issue_token", "auditor", otp=code, stdout=StringIO(), stderr=StringIO())


def test_a_code_during_django_otps_delay_is_not_checked_nor_counted(settings, auditor):
    settings.OTP_TOTP_THROTTLE_FACTOR = 30  # a wrong code delays the next check by 30 s
    device = totp_device(auditor)
    session = _signed_in_auditor(auditor)
    assert "not valid" in _text(_verify(session, _wrong(device)))
    held = _text(_verify(session, totp_code(device, at=time.time())))
    assert "try again in 30 seconds" in held or "try again in 29 seconds" in held
    assert "This code was not checked and not counted" in held
    assert AccessAttempt.objects.get().failures_since_start == 1  # the wrong code only
    device.refresh_from_db()
    device.throttling_failure_timestamp = device.throttling_failure_timestamp.replace(year=2020)
    device.save()
    assert _verify(session, totp_code(device, at=time.time())).status_code == 302
