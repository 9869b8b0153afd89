"""The session engine (`SESSION_ENGINE = "access.sessions"`): Django's database sessions, with the one
read every authenticated request makes compiled once (`core.compiled.CompiledQuery`).

Django's `db.SessionStore.load()` builds and compiles `Session.objects.get(session_key=…,
expire_date__gt=now)` on every request, which cost more than the query itself (≈ 0.6 ms of a trace read's
≈ 5 ms; docs/performance.md, B2). This store runs the same read as compiled SQL by primary key and
applies the expiry in Python: a session whose `expire_date` is not after now is absent, exactly as the
original WHERE clause made it. Everything else (saving, rotation, expiry clean-up, the async API) is
Django's.
"""

from __future__ import annotations

from django.contrib.sessions.backends.db import SessionStore as DbSessionStore
from django.contrib.sessions.models import Session
from django.utils import timezone

from core.compiled import CompiledQuery

_SESSION = CompiledQuery(
    lambda key: Session.objects.filter(session_key=key).values_list("session_data", "expire_date"), key=str
)


class SessionStore(DbSessionStore):
    """Django's database session store, reading a session through one compiled query."""

    def _get_session_from_db(self) -> Session | None:
        model = self.get_model_class()
        if model is not Session or not isinstance(self.session_key, str):
            return super()._get_session_from_db()
        rows = _SESSION.rows(key=self.session_key)
        if rows and rows[0][1] > timezone.now():
            data, expires = rows[0]
            return Session(session_key=self.session_key, session_data=data, expire_date=expires)
        self._session_key = None
        return None
