"""The password and session authentication backend: Django's `ModelBackend`, with the user read that
every session-authenticated request makes (`get_user`) compiled once (`core.compiled.CompiledQuery`).

The same SELECT of every concrete column, run as compiled SQL, builds the instance as the ORM does;
`user_can_authenticate`, passwords, permissions and everything else are Django's. With
`LOCAL_PASSWORD_LOGIN=breakglass` it checks no password of a name outside `BREAK_GLASS_USERNAMES`, and a
session it signed in ends at the next request unless its user is an active break-glass superuser.
Sessions made under Django's own backend are not recognised: their users sign in once more.
Details: docs/security.md, sections 1 and 7 (sessions, break-glass passwords).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend as DjangoModelBackend
from django.db import DEFAULT_DB_ALIAS

from access import passwords
from core.compiled import CompiledQuery


def _by_pk(pk: Any):
    return get_user_model()._default_manager.filter(pk=pk)


_USER = CompiledQuery(_by_pk, pk=int)


class ModelBackend(DjangoModelBackend):
    """Django's `ModelBackend` whose `get_user` reads the user through one compiled query; the local
    password policy (`access.passwords`) applied to password checks and password sessions."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        name = username if username is not None else kwargs.get(get_user_model().USERNAME_FIELD)
        if not passwords.may_try_password(name):
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)

    def get_user(self, user_id: Any):
        if type(user_id) is not int:  # a primary key that is not an integer: Django's own read
            user = super().get_user(user_id)
        else:
            rows = _USER.rows(pk=user_id)
            if not rows:
                return None
            user = get_user_model().from_db(DEFAULT_DB_ALIAS, _USER.names(), rows[0])
            user = user if self.user_can_authenticate(user) else None
        return user if user is not None and passwords.password_session_allowed(user) else None
