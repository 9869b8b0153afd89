"""Single sign-on (issue 33, item 3) against a real OpenID Connect provider in its own process
(`tests/oidc_server.py`, on 127.0.0.1): every login is the whole authorization code flow — Django's
`/oidc/authenticate/` redirects to the provider, the provider approves and redirects back with a code,
the callback redeems it at the provider's token endpoint over HTTP, fetches its JWKS and userinfo.

* the first login creates the user, links (iss, sub), maps the IdP's groups to the governed groups and
  grants staff, each change a governance event by `(single sign-on)`;
* a group removed at the IdP is removed at the next login (an event), other groups untouched, and staff
  goes with the last governed group;
* an ID token from another issuer, an expired one, one for another audience or with another nonce is
  refused: nobody is signed in or created, the login page says why, the lockout counts nothing;
* the reasoning step-up: an accepted `amr`/`acr` counts as the second factor, another still needs TOTP;
* `LOCAL_PASSWORD_LOGIN=breakglass`: a normal user's right password is refused with a clear error, the
  break-glass superuser's admitted, a password session from before ends; the login page offers
  "Sign in with …" when OIDC is on; with OIDC off the views are 404 and nothing else changes.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import Group

from access.models import OidcIdentity
from audit.models import GovernanceEvent, GovernanceEventType
from audit.verify.governance_chain import verify_governance
from tests.access.conftest import ACTOR, alice, sso_login

pytestmark = pytest.mark.django_db


def sso_events(username: str) -> list[tuple[str, str]]:
    return [
        (e.event_type, e.group)
        for e in GovernanceEvent.objects.filter(subject_user=username, actor=ACTOR).order_by("sequence_no")
    ]


def governed(user) -> set[str]:
    return set(user.groups.values_list("name", flat=True))


# --------------------------------------------------------------------------------------------------
# Login, group mapping, removal
# --------------------------------------------------------------------------------------------------
def test_first_login_creates_the_user_links_the_identity_and_maps_groups(client, oidc, django_user_model):
    oidc.configure(user=alice(groups=["sre-oncall", "qa", "unmapped-team"]))
    done = sso_login(client, oidc)
    assert done.status_code == 302 and done["Location"] == "/chat/"
    user = django_user_model.objects.get(username="alice")
    assert governed(user) == {"Staff viewers", "Reviewers"}
    assert user.is_staff and not user.is_superuser and not user.has_usable_password()
    assert (user.email, user.first_name) == ("alice@example.test", "Alice")
    assert OidcIdentity.objects.get(user=user).issuer == oidc.url
    assert OidcIdentity.objects.get(user=user).subject == "idp-user-0001"
    # Each change is a governance event, by single sign-on, saying which IdP group asserted it.
    assert sso_events("alice") == [
        ("GROUP_MEMBER_ADDED", "Reviewers"),
        ("GROUP_MEMBER_ADDED", "Staff viewers"),
        ("STAFF_GRANTED", ""),
    ]
    reviewers = GovernanceEvent.objects.get(subject_user="alice", group="Reviewers")
    assert reviewers.details["source"]["idpGroups"] == ["qa"]
    assert reviewers.details["source"]["issuer"] == oidc.url
    # Signed in: the session reaches the API and the admin; the code was redeemed with PKCE.
    assert client.get("/api/auth/tokens/").status_code == 200
    assert client.get("/admin/").status_code == 200
    assert oidc.state()["tokenRequests"][-1] == {
        "grant_type": "authorization_code",
        "pkce": True,
        "auth": "client_secret_basic",  # the first method of the discovery document's
        "path": "/token",
    }


def test_a_group_removed_at_the_idp_is_removed_at_the_next_login(client, oidc, django_user_model):
    oidc.configure(user=alice(groups=["sre-oncall", "ai-auditors"]))
    sso_login(client, oidc)
    user = django_user_model.objects.get(username="alice")
    assert governed(user) == {"Staff viewers", "Reasoning Auditors"}
    night = Group.objects.create(name="Night shift")  # not governed: single sign-on never touches it
    user.groups.add(night)

    client.logout()
    oidc.configure(user=alice(groups=["sre-oncall"]))
    sso_login(client, oidc)
    assert governed(user) == {"Staff viewers", "Night shift"}
    removed = GovernanceEvent.objects.get(
        subject_user="alice", event_type="GROUP_MEMBER_REMOVED", group="Reasoning Auditors"
    )
    assert removed.actor == ACTOR and removed.details["source"]["kind"] == "oidc"
    assert OidcIdentity.objects.filter(user=user).count() == 1  # the same account, found by (iss, sub)

    client.logout()
    oidc.configure(user=alice(groups=[]))
    sso_login(client, oidc)
    user.refresh_from_db()
    assert governed(user) == {"Night shift"} and not user.is_staff
    assert sso_events("alice")[-2:] == [("GROUP_MEMBER_REMOVED", "Staff viewers"), ("STAFF_REVOKED", "")]
    # A login that changes nothing writes nothing; the chain with the source details verifies.
    client.logout()
    before = GovernanceEvent.objects.count()
    sso_login(client, oidc)
    assert GovernanceEvent.objects.count() == before
    checked, problems = verify_governance()
    assert checked == before and problems == []


# --------------------------------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("wrong", "reason"),
    [
        ({"issuer": "http://127.0.0.1:9/another-issuer"}, "issued by another issuer"),
        ({"expires_in": -600}, "has expired"),
        ({"audience": "another-client"}, "not addressed to this application"),
        ({"nonce": "a-nonce-of-another-sign-in"}, "nonce"),
    ],
    ids=["issuer", "expired", "audience", "nonce"],
)
def test_a_bad_id_token_is_refused(client, oidc, django_user_model, wrong, reason):
    oidc.configure(user=alice(groups=["ai-auditors"]), **wrong)
    refused = sso_login(client, oidc)
    assert refused.status_code == 302 and refused["Location"] == "/admin/login/"
    assert not django_user_model.objects.filter(username="alice").exists()
    assert not OidcIdentity.objects.exists() and not sso_events("alice")
    assert client.get("/api/auth/tokens/").status_code == 401
    page = client.get("/admin/login/").content.decode()
    assert "Sign-in with Test IdP failed" in page and reason in page
    assert not AccessAttempt.objects.exists()  # a callback is not a guess: nothing counted


def test_a_replayed_callback_and_an_idp_error_are_refused(client, oidc, django_user_model):
    start = client.get("/oidc/authenticate/")
    approved = oidc.approve(start["Location"])
    back = urlsplit(approved.headers["Location"])
    assert client.get(back.path, parse_qs(back.query))["Location"] == "/"  # LOGIN_REDIRECT_URL
    client.logout()
    # The same code and state again (a stolen callback URL): the state is gone from the session.
    replayed = client.get(back.path, parse_qs(back.query))
    assert replayed.status_code == 302 and replayed["Location"] == "/admin/login/"
    assert "Sign-in with Test IdP failed" in client.get("/admin/login/").content.decode()
    assert client.get("/api/auth/tokens/").status_code == 401
    # The provider answering an error: refused with its code, nobody signed in.
    client.get("/oidc/authenticate/")
    denied = client.get("/oidc/callback/", {"error": "access_denied", "state": "whatever"})
    assert denied.status_code == 302 and denied["Location"] == "/admin/login/"
    page = client.get("/admin/login/").content.decode()
    assert "answered `access_denied`" in page
    assert client.get("/api/auth/tokens/").status_code == 401
    assert not AccessAttempt.objects.exists()


def test_a_local_account_of_the_same_name_is_not_taken_over(client, oidc, superuser):
    oidc.configure(user=alice(preferred_username=superuser.username, groups=["sre-oncall"]))
    assert sso_login(client, oidc)["Location"] == "/admin/login/"
    assert "already exists here and is not linked" in client.get("/admin/login/").content.decode()
    assert not OidcIdentity.objects.exists() and client.get("/api/auth/tokens/").status_code == 401


def test_with_oidc_off_the_views_are_404_and_the_login_page_has_no_button(client, settings):
    assert settings.OIDC_ENABLED is False
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404
    assert "Sign in with" not in client.get("/admin/login/").content.decode()


# --------------------------------------------------------------------------------------------------
# The reasoning step-up
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("amr", "acr", "satisfied"),
    [
        (["pwd", "otp"], None, True),
        (["hwk"], None, True),
        ([], "urn:example:mfa", True),
        (["pwd"], "urn:example:password", False),
    ],
    ids=["amr-otp", "amr-hwk", "acr-accepted", "password-only"],
)
def test_an_accepted_second_factor_satisfies_the_step_up(
    client, oidc, settings, traced_run, amr, acr, satisfied
):
    settings.REASONING_REQUIRE_OTP = True
    settings.OIDC_ACCEPTED_ACR = ["urn:example:mfa"]
    claims = alice(groups=["ai-auditors"], amr=amr)
    if acr:
        claims["acr"] = acr
    oidc.configure(user=claims)
    sso_login(client, oidc)
    url = f"/api/diagnosis/{traced_run.session_id}/trace/reasoning?runId={traced_run.run_id}"
    response = client.get(url)
    if satisfied:
        assert response.status_code == 200, response.content
        issued = client.post("/api/auth/tokens/", {}, content_type="application/json")
        assert issued.status_code == 201 and issued.json()["otpVerified"] is True
    else:
        assert response.status_code == 403 and response.json()["error"]["code"] == "otp_required"
        verify = client.get("/admin/verify-otp/")
        assert verify.status_code == 200 and verify.context["verified"] is False


def test_a_later_login_without_the_second_factor_clears_it(client, oidc, settings, traced_run):
    settings.REASONING_REQUIRE_OTP = True
    oidc.configure(user=alice(groups=["ai-auditors"], amr=["otp"]))
    sso_login(client, oidc)
    url = f"/api/diagnosis/{traced_run.session_id}/trace/reasoning?runId={traced_run.run_id}"
    assert client.get(url).status_code == 200
    oidc.configure(user=alice(groups=["ai-auditors"], amr=["pwd"]))
    sso_login(client, oidc)  # the same session, signed in again by the IdP with a password only
    assert client.get(url).status_code == 403


# --------------------------------------------------------------------------------------------------
# Break-glass password policy
# --------------------------------------------------------------------------------------------------
def _password_login(client, username: str, password: str):
    return client.post("/admin/login/?next=/admin/", {"username": username, "password": password})


def test_breakglass_refuses_a_normal_users_password_and_admits_the_break_glass_superuser(
    client, oidc, settings, superuser, staff_user
):
    settings.LOCAL_PASSWORD_LOGIN = "breakglass"
    settings.BREAK_GLASS_USERNAMES = [superuser.username]
    page = client.get("/admin/login/?next=/admin/").content.decode()
    assert 'id="sso-login-button"' in page and "Sign in with Test IdP" in page
    assert "/oidc/authenticate/?next=/admin/" in page

    refused = _password_login(client, "staff", "pw-staff-1")  # the right password
    assert refused.status_code == 200
    assert "Password sign-in is turned off for this account" in refused.content.decode()
    assert client.get("/api/auth/tokens/").status_code == 401
    assert not AccessAttempt.objects.exists()  # refused before the password was checked: not counted

    admitted = _password_login(client, superuser.username, "pw-root-1")
    assert admitted.status_code == 302 and admitted["Location"] == "/admin/"
    # The break-glass account's use is a governance event in the signed chain, not only a log line.
    used = GovernanceEvent.objects.get(event_type=GovernanceEventType.BREAK_GLASS_SIGN_IN)
    assert used.subject_user == superuser.username and used.details["channel"] == "password"
    assert used.details["address"] == "127.0.0.1"
    assert client.get("/admin/").status_code == 200
    client.logout()
    # The team still signs in, through the IdP.
    assert sso_login(client, oidc, next_url="/admin/")["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200


def test_breakglass_refuses_a_listed_name_that_is_not_a_superuser(client, settings, staff_user):
    settings.LOCAL_PASSWORD_LOGIN = "breakglass"
    settings.BREAK_GLASS_USERNAMES = ["staff"]
    refused = _password_login(client, "staff", "pw-staff-1")
    assert refused.status_code == 200 and "Password sign-in is turned off" in refused.content.decode()
    assert not AccessAttempt.objects.exists()  # a right password is never counted as a failure


def test_a_password_session_ends_when_breakglass_is_switched_on(client, settings, staff_user):
    assert _password_login(client, "staff", "pw-staff-1").status_code == 302
    assert client.get("/api/auth/tokens/").status_code == 200
    settings.LOCAL_PASSWORD_LOGIN = "breakglass"
    settings.BREAK_GLASS_USERNAMES = ["root"]
    assert client.get("/api/auth/tokens/").status_code == 401


def test_superusers_see_which_account_each_identity_signs_in_to(client, oidc, superuser):
    sso_login(client, oidc)
    assert client.get("/admin/access/oidcidentity/").status_code == 403  # alice is staff, not superuser
    client.force_login(superuser)
    page = client.get("/admin/access/oidcidentity/")
    assert page.status_code == 200 and "idp-user-0001" in page.content.decode()
