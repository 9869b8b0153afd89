"""The transparency log keys page, the admin page added by following docs/contributing.md's recipe (a
view module in surfaces/admin/, its path on the run admin, a template, a link on the index): every public
key with its id and role, the newest checkpoint, and the same access rule as every page of the run admin."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.test import Client

from audit.models import Checkpoint
from audit.transparency import keys
from tests.surfaces.admin.support import grant_console

pytestmark = pytest.mark.django_db

URL = "/admin/diagnosis/diagnosisrun/keys/"


@pytest.fixture
def two_keys(settings):
    """A signing key and a retired one that still verifies older checkpoints."""
    signing, retired = keys.generate_key_text(), keys.generate_key_text()
    settings.AUDIT_SIGNING_KEYS = [signing, retired]
    settings.AUDIT_VERIFY_KEYS = []
    return keys.published_keys()


def test_staff_see_every_key_with_its_id_and_role_and_the_newest_checkpoint(staff_user, two_keys, traced_run):
    call_command("audit_checkpoint", stdout=io.StringIO())
    client = Client()
    client.force_login(grant_console(staff_user))
    page = client.get(URL)
    assert page.status_code == 200
    html = page.content.decode()
    assert len(two_keys) == 2
    for key in two_keys:
        assert key["keyId"] in html and key["publicKey"] in html
    assert html.count("signs new checkpoints") == 1 and html.count("verifies older checkpoints") == 1
    newest = Checkpoint.objects.order_by("-tree_size").first()
    assert f"Newest checkpoint: {newest.tree_size} leaves, signed by <code>{newest.key_id}</code>" in html
    # One key id everywhere (issue 50): the signing key's id on the page is the one the checkpoint names
    # (its signed-note key id, 8 hex), and its vkey is shown for witness operators.
    [signing] = [k for k in two_keys if k["signing"]]
    assert signing["keyId"] == newest.key_id and len(newest.key_id) == 8
    assert f"<code>{signing['vkey']}</code>" in html and signing["legacyKeyId"] not in html
    # The admin index links the page.
    assert URL in client.get("/admin/").content.decode()


def test_before_the_first_checkpoint_the_page_says_so(staff_user, two_keys):
    client = Client()
    client.force_login(grant_console(staff_user))
    html = client.get(URL).content.decode()
    assert "No checkpoint has been signed yet." in html and two_keys[0]["keyId"] in html


def test_the_run_admins_access_rule(user, staff_user, two_keys):
    assert Client().get(URL).status_code == 302  # to the login
    client = Client()
    client.force_login(user)  # not staff
    assert client.get(URL).status_code == 302
    client.force_login(staff_user)  # staff without the view permission
    assert client.get(URL).status_code == 403
