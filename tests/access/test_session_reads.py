"""The compiled session and user reads (access/sessions.py, access/backends.py) answer exactly what
Django's database session store and `ModelBackend` answer, in one query each, for live, expired and
missing sessions and for active, inactive and deleted users; and a logged-in request is authenticated
through them."""

from __future__ import annotations

import datetime as dt

import pytest
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, SESSION_KEY
from django.contrib.auth.backends import ModelBackend as DjangoModelBackend
from django.contrib.sessions.backends.db import SessionStore as DjangoStore
from django.contrib.sessions.models import Session
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from access.backends import ModelBackend
from access.sessions import SessionStore

pytestmark = pytest.mark.django_db


def test_the_settings_use_them():
    assert settings.SESSION_ENGINE == "access.sessions"
    assert "access.backends.ModelBackend" in settings.AUTHENTICATION_BACKENDS
    assert "django.contrib.auth.backends.ModelBackend" not in settings.AUTHENTICATION_BACKENDS


def _session(data, *, expires_in: dt.timedelta) -> str:
    store = DjangoStore()
    store.update(data)
    store.create()
    Session.objects.filter(session_key=store.session_key).update(expire_date=timezone.now() + expires_in)
    return store.session_key


@pytest.mark.parametrize(
    "expires_in", [dt.timedelta(hours=1), dt.timedelta(seconds=-1), dt.timedelta(days=-30)], ids=str
)
def test_a_session_loads_as_djangos_store_loads_it(expires_in):
    key = _session({"a": 1, "b": ["x", "ü"]}, expires_in=expires_in)
    ours, django = SessionStore(key), DjangoStore(key)
    with CaptureQueriesContext(connection) as queries:
        loaded = ours.load()
    assert loaded == django.load()
    assert ours.session_key == django.session_key  # None once the session is expired
    assert len(queries) == 1


@pytest.mark.parametrize("key", ["nosuchsessionkey0123456789abcdef", "short", None])
def test_a_missing_or_invalid_session_key_loads_nothing(key):
    ours, django = SessionStore(key), DjangoStore(key)
    assert ours.load() == django.load() == {}
    assert ours.session_key is None and django.session_key is None


def test_a_saved_session_round_trips_through_the_store():
    store = SessionStore()
    store["k"] = "v"
    store.save()
    assert SessionStore(store.session_key).load() == {"k": "v"}


def test_a_user_is_read_as_djangos_backend_reads_it(user, django_user_model):
    ours, django = ModelBackend(), DjangoModelBackend()
    with CaptureQueriesContext(connection) as queries:
        found = ours.get_user(user.pk)
    assert len(queries) == 1
    expected = django.get_user(user.pk)
    fields = [f.attname for f in django_user_model._meta.concrete_fields]
    assert [getattr(found, f) for f in fields] == [getattr(expected, f) for f in fields]
    assert found._state.adding is False and found._state.db == "default"
    assert found.check_password("pw-owner-1")

    user.is_active = False
    user.save()
    assert ours.get_user(user.pk) is None is django.get_user(user.pk)
    assert ours.get_user(user.pk + 1000) is None is django.get_user(user.pk + 1000)
    assert ours.get_user(str(user.pk)) is None is django.get_user(str(user.pk))


def test_a_logged_in_request_is_authenticated_through_them(client, user):
    client.force_login(user)
    session = SessionStore(client.cookies[settings.SESSION_COOKIE_NAME].value).load()
    assert session[BACKEND_SESSION_KEY] == "access.backends.ModelBackend"
    assert session[SESSION_KEY] == str(user.pk)
    assert client.get("/api/diagnosis/sessions/").status_code == 200
    # A password change elsewhere invalidates the session (Django's session hash check, unchanged).
    user.set_password("pw-owner-2")
    user.save()
    assert client.get("/api/diagnosis/sessions/").status_code == 401
