"""Single sign-on against a provider that behaves like the certified ones (issue 50, item 2;
`tests/oidc_server.py`: claims only at userinfo unless requested, `amr` only when requested through
`claims`, PKCE required, its own session ended by its `end_session_endpoint`, a discovery document):

* sign-out ends the provider's session (id_token_hint, post_logout_redirect_uri, state), so the next
  sign-in at a shared computer asks for the provider's password again; `OIDC_LOGOUT=local` or a provider
  without `end_session_endpoint` ends only this session and the signed-out page says so;
* `amr`/`acr` asked for through `claims` only while accepted values are set, read from userinfo when the
  provider puts them only there: an IdP second factor satisfies the step-up with provider defaults;
* endpoints, keys and client authentication from discovery (cached, its issuer checked), explicit
  settings winning; `client_secret_basic` and `client_secret_post`;
* an unreachable provider (refused connection, timeout, 5xx) named so, apart from a refused code.
"""

from __future__ import annotations

import json
import logging
from urllib.parse import parse_qs, urlsplit

import pytest

from access import oidc_provider
from access.checks import check_oidc
from tests.access.conftest import CLIENT_ID, CLIENT_SECRET, SIGNED_OUT, alice, sso_login
from tests.agent.aiops.servers import free_port

pytestmark = pytest.mark.django_db


def login_pages(idp) -> int:
    return len(idp.state()["loginPages"])


def refusal(client) -> str:
    return client.get("/admin/login/").content.decode()


# --------------------------------------------------------------------------------------------------
# Sign-out
# --------------------------------------------------------------------------------------------------
def test_sign_out_ends_the_provider_session_so_the_next_sign_in_asks_again(client, oidc):
    assert sso_login(client, oidc)["Location"] == "/chat/"
    assert login_pages(oidc) == 1
    # Without signing out, the provider's session signs the next sign-in straight in (single sign-on).
    client.logout()
    sso_login(client, oidc)
    assert login_pages(oidc) == 1

    out = client.post("/admin/logout/")  # the chat's and the admin's "Log out": a page that goes on
    target = out.context["target"]  # (meta refresh and a link; CSP form-action forbids a redirect)
    assert out.status_code == 200 and target.startswith(f"{oidc.url}/end_session?")
    assert f'content="0; url={target.replace("&", "&amp;")}"' in out.content.decode()
    sent = parse_qs(urlsplit(target).query)
    assert sent["post_logout_redirect_uri"] == [SIGNED_OUT] and sent["client_id"] == [CLIENT_ID]
    assert sent["id_token_hint"][0].count(".") == 2 and sent["state"][0]
    assert client.get("/api/auth/tokens/").status_code == 401  # this session ended at once

    back = oidc.browser.get(target, allow_redirects=False, timeout=5)  # the browser at the IdP
    assert back.status_code == 302 and back.headers["Location"].startswith(SIGNED_OUT)
    assert oidc.state()["endSessions"] == [
        {"hint": True, "state": sent["state"][0], "redirect": SIGNED_OUT, "ended": True}
    ]
    page = client.get("/oidc/signed-out/", parse_qs(urlsplit(back.headers["Location"]).query))
    assert page.status_code == 200
    assert "You are signed out of this service and of Test IdP." in page.content.decode()
    # The next person at this computer is asked for the provider's password.
    sso_login(client, oidc)
    assert login_pages(oidc) == 2
    assert client.get("/api/auth/tokens/").status_code == 200


@pytest.mark.parametrize(
    ("setup", "words"),
    [
        ({"OIDC_LOGOUT": "local"}, "set to end only its own session"),
        ({"discovery": {"end_session_endpoint": None}}, "offers no sign-out to other applications"),
    ],
    ids=["local", "no-end-session-endpoint"],
)
def test_without_provider_sign_out_only_this_session_ends_and_the_page_says_so(
    client, oidc, settings, setup, words
):
    if "OIDC_LOGOUT" in setup:
        settings.OIDC_LOGOUT = setup["OIDC_LOGOUT"]
    else:
        oidc.configure(**setup)
    sso_login(client, oidc)
    out = client.post("/admin/logout/")
    assert out.status_code == 302 and out["Location"] == SIGNED_OUT
    page = client.get(out["Location"]).content.decode()
    assert "You are signed out of this service only." in page and words in page
    assert "anyone using this browser can sign in again as you" in page
    assert oidc.state()["endSessions"] == []
    assert client.get("/api/auth/tokens/").status_code == 401
    if "OIDC_LOGOUT" in setup:
        sso_login(client, oidc)  # ... and indeed: straight back in, no password asked
        assert login_pages(oidc) == 1


def test_a_sign_out_coming_back_with_another_state_is_not_claimed(client, oidc):
    sso_login(client, oidc)
    client.post("/admin/logout/")
    page = client.get("/oidc/signed-out/", {"state": "forged"}).content.decode()
    assert "did not confirm the sign-out" in page
    # Visited again (or by anyone else), the page claims nothing about the provider.
    again = client.get("/oidc/signed-out/").content.decode()
    assert "You are signed out of this service." in again and "Test IdP." not in again


def test_a_password_session_signs_out_as_before(client, oidc, staff_user, settings):
    client.force_login(staff_user, backend="access.backends.ModelBackend")
    out = client.post("/admin/logout/")
    assert out.status_code == 200 and "Log in again" in out.content.decode()  # the admin's page
    assert client.get("/api/auth/tokens/").status_code == 401
    assert client.get("/admin/logout/").status_code == 405  # never on a GET (a link, an image)
    settings.OIDC_ENABLED = False
    assert client.get("/oidc/signed-out/").status_code == 404
    assert client.post("/oidc/logout/").status_code == 404


# --------------------------------------------------------------------------------------------------
# amr / acr through the claims parameter
# --------------------------------------------------------------------------------------------------
def test_amr_is_asked_for_only_while_accepted_values_are_set(client, oidc, settings):
    def claims_sent() -> list[str] | None:
        return parse_qs(urlsplit(client.get("/oidc/authenticate/")["Location"]).query).get("claims")

    settings.OIDC_ACCEPTED_ACR = ["urn:example:mfa"]
    wanted = {"amr": None, "acr": None}
    assert [json.loads(c) for c in claims_sent()] == [{"id_token": wanted, "userinfo": wanted}]
    settings.OIDC_ACCEPTED_AMR = []
    assert [json.loads(c) for c in claims_sent()] == [{"id_token": {"acr": None}, "userinfo": {"acr": None}}]
    settings.OIDC_ACCEPTED_ACR = []
    assert claims_sent() is None


def test_an_idp_second_factor_at_userinfo_only_satisfies_the_step_up(client, oidc, settings, traced_run):
    # (In the ID token, as this provider puts it when asked: test_sso.py's step-up tests.)
    settings.REASONING_REQUIRE_OTP = True
    oidc.configure(user=alice(groups=["ai-auditors"], amr=["pwd", "otp"]), amr_at_userinfo_only=True)
    sso_login(client, oidc)
    url = f"/api/diagnosis/{traced_run.session_id}/trace/reasoning?runId={traced_run.run_id}"
    assert client.get(url).status_code == 200
    # Without the claims request this provider releases no amr at all: the step-up still applies.
    client.logout()
    settings.OIDC_ACCEPTED_AMR = []
    settings.OIDC_ACCEPTED_ACR = ["urn:none-of-these"]  # asks for acr only: amr is not released
    sso_login(client, oidc)
    assert client.get(url).status_code == 403


def test_the_pkce_the_provider_requires_is_sent(client, oidc, settings):
    settings.OIDC_USE_PKCE = False
    start = client.get("/oidc/authenticate/")
    back = oidc.approve(start["Location"])
    assert "error=invalid_request" in back.headers["Location"]  # this provider refuses a flow without
    # (With PKCE, the default, every other test signs in.)


# --------------------------------------------------------------------------------------------------
# Discovery and explicit settings
# --------------------------------------------------------------------------------------------------
def test_the_discovery_document_is_cached_and_explicit_settings_win(client, oidc, settings):
    assert oidc_provider.endpoint("token_endpoint") == f"{oidc.url}/token"  # read once
    oidc.configure(discovery={"token_endpoint": f"{oidc.url}/elsewhere"})
    sso_login(client, oidc)
    assert oidc.state()["tokenRequests"][-1]["path"] == "/token"  # the cached document
    oidc_provider.forget()
    assert oidc_provider.endpoint("token_endpoint") == f"{oidc.url}/elsewhere"  # read again
    settings.OIDC_OP_TOKEN_ENDPOINT = f"{oidc.url}/oauth2/token"  # an explicit setting wins over it
    client.logout()
    assert sso_login(client, oidc)["Location"] == "/chat/"
    assert oidc.state()["tokenRequests"][-1]["path"] == "/oauth2/token"


def test_without_discovery_the_explicit_endpoints_serve(client, oidc, settings):
    settings.OIDC_OP_DISCOVERY = False
    oidc.configure(discovery={"issuer": "http://127.0.0.1:9/not-read"})  # would be refused if read
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = f"{oidc.url}/authorize"
    settings.OIDC_OP_TOKEN_ENDPOINT = f"{oidc.url}/oauth2/token"
    settings.OIDC_OP_JWKS_ENDPOINT = f"{oidc.url}/jwks"
    settings.OIDC_OP_USER_ENDPOINT = f"{oidc.url}/userinfo"
    assert sso_login(client, oidc)["Location"] == "/chat/"
    assert oidc.state()["tokenRequests"][-1]["path"] == "/oauth2/token"
    # No end_session_endpoint configured, none discovered: sign-out ends this session only.
    assert client.post("/admin/logout/")["Location"] == SIGNED_OUT


def test_a_discovery_document_of_another_issuer_is_refused(client, oidc):
    oidc.configure(discovery={"issuer": "https://idp.example.com/an-impostor"})
    start = client.get("/oidc/authenticate/")
    assert start.status_code == 302 and start["Location"] == "/admin/login/"
    assert "discovery document names another issuer than the one configured" in refusal(client)


# --------------------------------------------------------------------------------------------------
# Client authentication at the token endpoint
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("registered", "setting", "advertised"),
    [  # (the first of the document's, client_secret_basic: test_sso.py's first test)
        ("client_secret_post", "", ["private_key_jwt", "client_secret_post", "client_secret_basic"]),
        ("client_secret_basic", "client_secret_basic", ["client_secret_post"]),
        ("client_secret_basic", "", "absent"),
    ],
    ids=["post-discovered", "basic-set-wins", "basic-by-default"],
)
def test_both_client_authentication_methods(client, oidc, settings, registered, setting, advertised):
    secret = "a secret: with/odd%chars+" + CLIENT_SECRET  # form-encoded inside Basic (RFC 6749 2.3.1)
    settings.OIDC_RP_CLIENT_SECRET = secret
    settings.OIDC_TOKEN_AUTH_METHOD = setting
    members = {"token_endpoint_auth_methods_supported": None if advertised == "absent" else advertised}
    oidc.configure(
        client={**oidc.state()["client"], "secret": secret, "token_endpoint_auth_method": registered},
        discovery=members if advertised else {},
    )
    assert sso_login(client, oidc)["Location"] == "/chat/"
    assert oidc.state()["tokenRequests"][-1]["auth"] == registered


def test_a_method_the_provider_does_not_accept_is_a_refused_code(client, oidc, settings):
    settings.OIDC_TOKEN_AUTH_METHOD = "client_secret_post"  # the client is registered for basic
    assert sso_login(client, oidc)["Location"] == "/admin/login/"
    page = refusal(client)
    assert "did not accept the sign-in code" in page and "unreachable" not in page


# --------------------------------------------------------------------------------------------------
# An unreachable provider
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "broken",
    [{"fail": {"token": 503}}, {"fail": {"jwks": 502}}, {"delay": {"token": 1.5}}],
    ids=["token-503", "jwks-502", "token-timeout"],
)
def test_an_unreachable_provider_is_named_so(client, oidc, settings, caplog, broken):
    settings.OIDC_TIMEOUT = 0.5
    start = client.get("/oidc/authenticate/")
    approved = oidc.approve(start["Location"])
    oidc.configure(**broken)
    back = urlsplit(approved.headers["Location"])
    with caplog.at_level(logging.WARNING, logger="access"):
        done = client.get(back.path, parse_qs(back.query))
    assert done["Location"] == "/admin/login/"
    page = refusal(client)
    assert "Sign-in with Test IdP failed: Test IdP is unreachable" in page
    assert "did not accept" not in page and client.get("/api/auth/tokens/").status_code == 401
    lines = [r.getMessage() for r in caplog.records if "unreachable at its" in r.getMessage()]
    assert len(lines) == 1 and ("(timeout)" in lines[0] or "(HTTP 5" in lines[0])
    code = parse_qs(back.query)["code"][0]
    assert not any(code in r.getMessage() or CLIENT_SECRET in r.getMessage() for r in caplog.records)


def test_a_provider_refusing_connections_is_named_unreachable(client, oidc, settings):
    settings.OIDC_OP_ISSUER = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    start = client.get("/oidc/authenticate/")
    assert start.status_code == 302 and start["Location"] == "/admin/login/"
    assert "Test IdP is unreachable" in refusal(client)
    # Signing out while it is down: this session ends, and the page says the provider's may not have.
    settings.OIDC_OP_ISSUER = oidc.url
    sso_login(client, oidc)
    oidc_provider.forget()
    settings.OIDC_OP_ISSUER = f"http://127.0.0.1:{free_port()}"
    out = client.post("/admin/logout/")
    assert out["Location"] == SIGNED_OUT
    assert "could not be reached to end your session there" in client.get(SIGNED_OUT).content.decode()


# --------------------------------------------------------------------------------------------------
# Settings checks (in process; check --deploy in a production process: test_sso_settings.py)
# --------------------------------------------------------------------------------------------------
def test_the_checks_need_endpoints_only_without_discovery_and_refuse_unknown_choices(oidc, settings):
    def codes() -> set[str]:
        return {m.id for m in check_oidc() if m.id.startswith("access.E")}  # http here: W001 aside

    assert codes() == set()  # the issuer and the client are enough with discovery
    settings.OIDC_OP_DISCOVERY = False
    assert codes() == {"access.E003"}
    settings.OIDC_OP_DISCOVERY = True
    settings.OIDC_LOGOUT = "everywhere"
    assert codes() == {"access.E006"}
    settings.OIDC_LOGOUT = "provider"
    settings.OIDC_TOKEN_AUTH_METHOD = "private_key_jwt"
    assert codes() == {"access.E006"}
