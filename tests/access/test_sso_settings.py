"""Single sign-on's settings in a production process (DEBUG off): `manage.py check --deploy
--fail-level WARNING` stays clean with OIDC on (an https issuer whose discovery document names the
endpoints, nothing fetched by the check; a group map of governed groups; provider sign-out) and
`LOCAL_PASSWORD_LOGIN=breakglass`, and the sign-in checks stop a configuration that would fail open or
lock everyone out (access/checks.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.core.test_settings import BASE_DIR, _production_env

IDP = "https://idp.example.com/realms/ops"
OIDC = {
    "OIDC_ENABLED": "true",
    "OIDC_PROVIDER_NAME": "Example SSO",
    "OIDC_RP_CLIENT_ID": "diagnosis",
    "OIDC_RP_CLIENT_SECRET": "a-client-secret-from-the-environment",
    "OIDC_OP_ISSUER": IDP,
    "OIDC_LOGOUT": "provider",
    "OIDC_GROUP_MAP": json.dumps({"sre": "Staff viewers", "ai-audit": ["Reasoning Auditors", "Reviewers"]}),
    "OIDC_ACCEPTED_AMR": "otp,mfa,hwk",
    "LOCAL_PASSWORD_LOGIN": "breakglass",
    "BREAK_GLASS_USERNAMES": "breakglass-admin",
}


def _check(**extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=BASE_DIR,
        env=_production_env(**extra),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_check_deploy_is_clean_with_single_sign_on_and_break_glass():
    done = _check(**OIDC)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"LOCAL_PASSWORD_LOGIN": "sso-only"}, "access.E001"),
        ({"BREAK_GLASS_USERNAMES": ""}, "access.E002"),
        ({"OIDC_OP_DISCOVERY": "false", "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{IDP}/auth"}, "access.E003"),
        ({"OIDC_GROUP_MAP": json.dumps({"sre": "Superusers"})}, "access.E004"),
        ({"OIDC_RP_SIGN_ALGO": "HS256"}, "access.E005"),
        ({"OIDC_OP_TOKEN_ENDPOINT": "http://idp.example.com/token"}, "access.W001"),
    ],
    ids=[
        "policy-typo",
        "no-break-glass-account",
        "no-discovery-no-endpoints",
        "ungoverned-group",
        "symmetric-alg",
        "http",
    ],
)
def test_the_sign_in_checks_stop_an_unsafe_configuration(change, code):
    done = _check(**{**OIDC, **change})
    assert done.returncode != 0 and code in done.stdout + done.stderr
