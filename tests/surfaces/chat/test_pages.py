"""The front door and the chat page's links."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_the_front_door_sends_anonymous_visitors_to_the_login_that_leads_to_the_chat():
    response = Client().get("/")
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('admin:login')}?next=/chat/"


def test_the_front_door_sends_a_signed_in_user_to_the_chat(user):
    client = Client()
    client.force_login(user)
    response = client.get("/")
    assert response.status_code == 302 and response["Location"] == "/chat/"
    assert client.get(response["Location"]).status_code == 200


def test_the_chat_page_links_staff_to_the_run_list(staff_user, user):
    client = Client()
    client.force_login(staff_user)
    html = client.get("/chat/").content.decode()
    assert f'href="{reverse("admin:diagnosis_diagnosisrun_changelist")}" id="run-list-link"' in html
    client.force_login(user)
    assert 'id="run-list-link"' not in client.get("/chat/").content.decode()


def test_the_front_door_answers_get_only():
    assert Client().post("/").status_code == 405


def test_every_page_has_the_products_icon_and_the_login_page_its_name():
    client = Client()
    icon = client.get("/favicon.ico")
    assert icon.status_code == 302 and icon["Location"].endswith("surfaces/favicon.svg")
    login = client.get(reverse("admin:login")).content.decode()
    assert "Diagnosis agent" in login and "Django administration" not in login
    assert 'rel="icon"' in login and "surfaces/favicon.svg" in login
