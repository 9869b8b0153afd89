"""`agent.runtime.db.read`: a read that met a lost connection or a Galera certification conflict (a
failover behind the proxy) runs again on a connection that answers; any other error, and a write through
`db`, are never run twice (issue 48)."""

from __future__ import annotations

import asyncio

import pytest
from django.db import OperationalError

from agent.runtime.db import db, read
from diagnosis.models import DiagnosisRun

pytestmark = pytest.mark.django_db(transaction=True)


class _Flaky:
    """Raises `code` the first `times` calls, then counts the runs."""

    def __init__(self, code: int, times: int) -> None:
        self.code, self.times, self.calls = code, times, 0

    def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.times:
            raise OperationalError(self.code, "Lost connection to server during query")
        return DiagnosisRun.objects.count()


@pytest.mark.parametrize("code", [2013, 2006, 1213])
def test_a_read_is_run_again_after_a_lost_connection(code):
    flaky = _Flaky(code, times=2)
    assert asyncio.run(read(flaky)) == 0
    assert flaky.calls == 3


def test_a_read_gives_up_after_its_pauses_and_other_errors_are_raised_at_once():
    always = _Flaky(2013, times=99)
    with pytest.raises(OperationalError):
        asyncio.run(read(always))
    assert always.calls == 4  # once, then once after each of the three pauses
    other = _Flaky(1114, times=1)
    with pytest.raises(OperationalError):
        asyncio.run(read(other))
    assert other.calls == 1


def test_db_never_runs_a_job_twice():
    flaky = _Flaky(2013, times=1)
    with pytest.raises(OperationalError):
        asyncio.run(db(flaky))
    assert flaky.calls == 1
