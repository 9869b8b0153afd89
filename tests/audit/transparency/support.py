"""Helpers of the transparency log tests: finished runs through the real recorder, the database URL of
this test database for subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings
from django.db import connection

from tests.factories import make_recorded_run


def finished_runs(owner, n: int, **kwargs):
    return [make_recorded_run(owner, **kwargs) for _ in range(n)]


def database_url() -> str:
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    host = f"{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 3306}"
    return f"mysql://{db['USER']}:{db['PASSWORD']}@{host}/{db['NAME']}"


def manage(*args: str, env: dict[str, str] | None = None, popen: bool = False):
    """`manage.py ARGS` in another process on this test database (a CompletedProcess, or a Popen)."""
    full_env = {**os.environ, "DATABASE_URL": database_url(), **(env or {})}
    command = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), *args, "--skip-checks"]
    if popen:
        return subprocess.Popen(
            command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    return subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=120)
