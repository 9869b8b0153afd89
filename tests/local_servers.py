"""Server sets the suite starts itself (the replica pair, the Galera cluster): started once per session,
or the test skipped saying what is missing — a failure when the variable scripts/test.sh sets for it is 1,
so CI never skips them."""

from __future__ import annotations

import os

import pytest


def started_or_skipped(servers, *, require: str):
    """Start `servers` (a `bench` module with `missing()` and `start()`) and return it; skip (or, with the
    environment variable `require` at 1, fail) when `missing()` names what it lacks."""
    reason = servers.missing()
    if reason:
        if os.environ.get(require) == "1":
            pytest.fail(f"{require}=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    servers.start()
    return servers
