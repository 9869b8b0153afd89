"""`make run` shows the product as it is deployed (issue 45 item 6): its environment
(scripts/run-env.sh, sourced by scripts/run.sh) turns the TOTP step-up for reading reasoning on, and
`REASONING_REQUIRE_OTP=false` turns it off explicitly; under it the demo auditor reads reasoning only
after a code of the TOTP secret `bootstrap_demo` printed.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.test import Client
from django_otp.oath import totp

from reasoning.models import ReasoningAccessLog
from tests.factories import REASONING_MARKER

PRINT_SETTINGS = (
    "import django; django.setup(); from django.conf import settings; "
    "print(settings.DEBUG, settings.REASONING_REQUIRE_OTP)"
)


def _settings_under_make_run(**given: str) -> str:
    """DEBUG and REASONING_REQUIRE_OTP as a process started the way scripts/run.sh starts one reads them."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DEBUG", "REASONING_REQUIRE_OTP", "DATABASE_URL") and not k.startswith("PYTEST")
    }
    env.update(DJANGO_SETTINGS_MODULE="config.settings", **given)
    command = f'source scripts/run-env.sh && exec "{sys.executable}" -c "{PRINT_SETTINGS}"'
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=django_settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_make_run_turns_the_step_up_on_and_development_can_turn_it_off():
    assert _settings_under_make_run() == "True True"
    assert _settings_under_make_run(REASONING_REQUIRE_OTP="false") == "True False"


@pytest.mark.django_db
def test_the_demo_auditor_reads_reasoning_only_after_a_code_of_the_printed_secret(settings, traced_run):
    settings.DEBUG = True
    settings.REASONING_REQUIRE_OTP = True  # as make run's environment sets it (the test above)
    printed = StringIO()
    call_command("bootstrap_demo", stdout=printed)
    out = printed.getvalue()
    assert "The step-up is on, as in production" in out
    password = re.search(r"^\s+auditor\s+(\S+)$", out, re.MULTILINE).group(1)
    secret = re.search(r"secret ([A-Z2-7]+)", out).group(1)

    client = Client()
    signed_in = client.post("/admin/login/", {"username": "auditor", "password": password})
    assert signed_in.status_code == 302
    panel = f"/admin/diagnosis/diagnosisrun/{traced_run.pk}/reasoning/"
    refused = client.post(panel, HTTP_X_REQUESTED_WITH="fetch")
    assert refused.status_code == 403 and refused["X-Step-Up"] == "otp"  # a password alone is not enough
    assert REASONING_MARKER.encode() not in refused.content and not ReasoningAccessLog.objects.exists()

    key = base64.b32decode(secret + "=" * (-len(secret) % 8))
    assert client.post("/admin/verify-otp/", {"otp_token": f"{totp(key):06d}"}).status_code == 302
    shown = client.post(panel, HTTP_X_REQUESTED_WITH="fetch")
    assert shown.status_code == 200 and REASONING_MARKER in shown.content.decode()

    again = StringIO()
    call_command("bootstrap_demo", stdout=again)
    assert "secret" not in again.getvalue()  # printed once, and the next start says where it went
    assert "reads reasoning after a TOTP code (REASONING_REQUIRE_OTP is on)" in again.getvalue()
