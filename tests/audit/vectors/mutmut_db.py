"""A pytest plugin for mutation runs only (pyproject.toml's [tool.mutmut]:
`-p tests.audit.vectors.mutmut_db`).

mutmut runs each mutant's tests in a process forked from one that already imported the settings, so
every worker would share the SQLite test database named after that process (`config/settings.py`):
two workers would create and drop the same file under each other ("disk I/O error", every mutant
falsely killed). Each worker gets an in-memory test database of its own and fresh connections, and runs
the tests that need no database first, so that a mutant they kill never waits for the migrations."""

from __future__ import annotations

import pytest


def pytest_sessionstart(session) -> None:
    from django.conf import settings
    from django.db import connections

    connections.close_all()
    for alias, db in settings.DATABASES.items():
        if db["ENGINE"] == "django.db.backends.sqlite3":
            db.setdefault("TEST", {})["NAME"] = None  # in memory, private to this worker
            connections[alias].settings_dict.setdefault("TEST", {})["NAME"] = None


def _needs_database(item) -> bool:
    names = getattr(item, "fixturenames", ())
    return item.get_closest_marker("django_db") is not None or "db" in names or "transactional_db" in names


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items) -> None:
    items.sort(key=_needs_database)  # stable: mutmut's fastest-first order kept within each group
