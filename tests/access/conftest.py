"""Single sign-on's test provider (`tests/oidc_server.py`, its own process on 127.0.0.1) and the flow
through it, shared by the single sign-on tests: `idp` (one provider per test session and worker), `oidc`
(OIDC on and pointed at it by its issuer alone, everything else from its discovery document; the
provider reset to a well-behaved configuration for alice and a fresh browser), `sso_login` (the whole
authorization code flow through the browser's hops, signing in at the provider when it asks)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from access import oidc_provider
from tests.agent.aiops.servers import _die_with_parent, free_port

SERVER = Path(__file__).resolve().parents[1] / "oidc_server.py"
CLIENT_ID, CLIENT_SECRET = "diagnosis-test", "test-client-secret-of-the-rp"
CALLBACK = "http://testserver/oidc/callback/"
SIGNED_OUT = "http://testserver/oidc/signed-out/"
OP_PASSWORD = "op-password-of-alice"
GROUP_MAP = {
    "sre-oncall": "Staff viewers",
    "ai-auditors": ["Reasoning Auditors"],
    "change-board": "Approvers",
    "qa": "Reviewers",
}
ACTOR = "(single sign-on)"
_TICKET = re.compile(r"name=ticket value=([A-Za-z0-9_-]+)")


class Idp:
    """The provider process, its control endpoint, and the browser's cookies at the provider."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.browser = requests.Session()
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER), str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.url}/.well-known/openid-configuration", timeout=1).ok:
                    return
            except requests.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("the OpenID provider did not start")

    def configure(self, **body) -> None:
        assert requests.post(f"{self.url}/control", json=body, timeout=5).ok

    def state(self) -> dict:
        return requests.get(f"{self.url}/control", timeout=5).json()

    def approve(self, authorize: str) -> requests.Response:
        """The browser at the provider's authorization URL: its redirect back, after signing in at the
        provider's login page when it shows one (no provider session in this browser)."""
        answer = self.browser.get(authorize, allow_redirects=False, timeout=5)
        if answer.status_code == 200 and "/login" in answer.text:
            ticket = _TICKET.search(answer.text).group(1)
            form = {"ticket": ticket, "username": "alice", "password": OP_PASSWORD}
            answer = self.browser.post(f"{self.url}/login", data=form, allow_redirects=False, timeout=5)
        return answer

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture(scope="session")
def idp():
    server = Idp()
    yield server
    server.close()


@pytest.fixture
def oidc(settings, idp):
    """OIDC on, pointed at the provider by its issuer (every endpoint from its discovery document), which
    is reset to a well-behaved configuration for the user alice; a browser with no provider session."""
    settings.OIDC_ENABLED = True
    settings.OIDC_PROVIDER_NAME = "Test IdP"
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    settings.OIDC_OP_ISSUER = idp.url
    for name in oidc_provider.ENDPOINTS.values():
        setattr(settings, name, "")
    settings.OIDC_TOKEN_AUTH_METHOD = ""
    settings.OIDC_LOGOUT = "provider"
    settings.OIDC_GROUP_MAP = GROUP_MAP
    settings.OIDC_ACCEPTED_AMR = ["otp", "mfa", "hwk"]
    settings.OIDC_ACCEPTED_ACR = []
    idp.configure(
        reset=True,
        client={
            "id": CLIENT_ID,
            "secret": CLIENT_SECRET,
            "redirect_uris": [CALLBACK],
            "post_logout_redirect_uris": [SIGNED_OUT],
        },
        user=alice(),
        password=OP_PASSWORD,
    )
    idp.browser = requests.Session()
    oidc_provider.forget()
    yield idp
    oidc_provider.forget()


def alice(**claims) -> dict:
    return {
        "sub": "idp-user-0001",
        "preferred_username": "alice",
        "email": "alice@example.test",
        "given_name": "Alice",
        "groups": ["sre-oncall"],
        "amr": ["pwd"],
        **claims,
    }


def sso_login(client, idp, next_url: str = "/chat/"):
    """The whole flow through the browser's hops: Django → provider (its login page when the browser has
    no provider session) → Django's callback."""
    start = client.get("/oidc/authenticate/", {"next": next_url})
    assert start.status_code == 302, start
    authorize = start["Location"]
    assert authorize.startswith(f"{idp.url}/authorize?")
    query = parse_qs(urlsplit(authorize).query)
    assert query["nonce"][0] and query["state"][0] and query["code_challenge_method"] == ["S256"]
    approved = idp.approve(authorize)
    assert approved.status_code == 302, approved.text
    back = urlsplit(approved.headers["Location"])
    assert f"{back.scheme}://{back.netloc}{back.path}" == CALLBACK
    return client.get(back.path, parse_qs(back.query))
