"""A run's claim whose answer is lost with its connection (a failover behind the proxy) or refused by a
Galera certification conflict (issue 48): the claim is a compare-and-set, so it is never sent again
blind. The row is read again: the claim landed (ours at the next epoch), did not (claimed once more), or
another claim won (nothing taken)."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection

from diagnosis import services
from diagnosis.models import DiagnosisRun

pytestmark = pytest.mark.django_db(
    transaction=True
)  # a claim outside any transaction, as the executor makes it


class _LoseTheClaim:
    """Fails the first claim UPDATE with `code`, before it runs or (`after`) once it committed; `meanwhile`
    runs before the failure (another process's claim)."""

    def __init__(self, code: int, *, after: bool = False, meanwhile=None) -> None:
        self.code, self.after, self.meanwhile, self.fired = code, after, meanwhile, 0

    def __call__(self, execute, sql, params, many, context):
        claiming = sql.lstrip().upper().startswith("UPDATE") and "lease_epoch" in sql and not self.fired
        if not claiming:
            return execute(sql, params, many, context)
        self.fired += 1
        if self.after:
            execute(sql, params, many, context)
        elif self.meanwhile is not None:
            self.meanwhile()
        raise OperationalError(self.code, "Lost connection to server during query")


@pytest.fixture
def pending(user):
    return services.create_run(session=services.create_session(owner=user), query="Disk full on /var/log")


@pytest.mark.parametrize(("code", "after"), [(2013, True), (2013, False), (1213, False)])
def test_a_claim_whose_answer_was_lost_is_found_or_made_once(pending, code, after):
    lose = _LoseTheClaim(code, after=after)
    with connection.execute_wrapper(lose):
        claimed = services.claim_run(run_id=pending.run_id, owner="host:1:me")
    assert lose.fired == 1
    assert claimed is not None and claimed.lease_epoch == pending.lease_epoch + 1
    stored = DiagnosisRun.objects.get(pk=pending.pk)
    assert (stored.lease_owner, stored.lease_epoch) == ("host:1:me", pending.lease_epoch + 1)


def test_a_claim_lost_while_another_process_claimed_takes_nothing(pending):
    def other_claims():
        with connection.execute_wrapper(lambda execute, *args: execute(*args)):
            assert services.claim_run(run_id=pending.run_id, owner="host:2:other") is not None

    with connection.execute_wrapper(_LoseTheClaim(1213, meanwhile=other_claims)):
        assert services.claim_run(run_id=pending.run_id, owner="host:1:me") is None
    stored = DiagnosisRun.objects.get(pk=pending.pk)
    assert (stored.lease_owner, stored.lease_epoch) == ("host:2:other", pending.lease_epoch + 1)


def test_any_other_database_error_of_a_claim_is_raised(pending):
    with connection.execute_wrapper(_LoseTheClaim(1114)), pytest.raises(OperationalError):
        services.claim_run(run_id=pending.run_id, owner="host:1:me")
