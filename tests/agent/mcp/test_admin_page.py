"""The read-only MCP servers page lists each configured server, its tools, which need approval, and the
last error of one that is down; staff who may view runs only (issue 46 item 1)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

pytestmark = pytest.mark.django_db(transaction=True)
URL = reverse("admin:diagnosis_diagnosisrun_mcp")


def test_the_page_lists_servers_tools_approval_and_the_last_error(
    client, django_user_model, use_mcp, binaries
):
    use_mcp(
        {
            "name": "ev",
            "command": binaries["everything"],
            "args": ["stdio"],
            "trusted": True,
            "allow": ["get-*"],
        },
        {"name": "gone", "command": "/nonexistent/mcp-server"},
    )
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_diagnosisrun"))
    client.force_login(viewer)
    page = client.get(URL).content.decode()
    assert "<code>ev__get-sum</code>" in page and "<code>ev__toggle-simulated-logging</code>" in page
    assert "no (not allowed)" in page and "needs a person's approval" in page and "none (read-only)" in page
    assert "FileNotFoundError" in page
    assert URL in client.get(reverse("admin:index")).content.decode()


def test_only_staff_who_may_view_runs_see_it(client, django_user_model):
    assert client.get(URL).status_code == 302
    staff = django_user_model.objects.create_user("plain", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get(URL).status_code == 403
