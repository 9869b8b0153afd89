"""Run ids matched against the leaves' `tail_of` are looked up in pieces (`store.tail_lookup_pieces`): at
MariaDB's `eq_range_index_dive_limit` (200) ids or more, the optimizer priced the list by the index's
statistics, which for a column NULL on almost every leaf say "read the whole log" (1.3 s a query at
1,000,000 leaves). A chunk of `verify_audit` (200 runs) and a checkpoint (1,000) asked exactly that. The
pieces return what one query returned, in one query per piece."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext

from audit.models import LogLeaf
from audit.transparency import leafdata, log, store
from audit.write.reviews import record_review
from tests.factories import make_recorded_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def tailed(user, superuser, signing_key):
    """Three anchored runs: the first grown twice after its anchor, the third once (three tail leaves)."""
    runs = [make_recorded_run(user) for _ in range(3)]
    log.checkpoint()
    for run in (runs[0], runs[2]):
        record_review(run=run, user=superuser, verdict="correct", note="checked")
    log.checkpoint()
    record_review(run=runs[0], user=superuser, verdict="unsafe", note="second look")
    log.checkpoint()
    assert LogLeaf.objects.filter(tail_of__isnull=False).count() == 3
    return [r.run_id for r in runs]


def _ids(real: list[str]) -> list[str]:
    """250 ids (three pieces): the real runs first, in the middle and last, unknown ids between."""
    ids = [f"run_absent_{i:03d}" for i in range(247)]
    ids.insert(0, real[0])
    ids.insert(125, real[1])
    ids.append(real[2])
    return ids


def test_tails_are_those_one_query_finds_in_one_query_per_piece(tailed):
    ids = _ids(tailed)
    expected: dict[str, list[int]] = {}
    for leaf in LogLeaf.objects.filter(tail_of__in=ids).order_by("leaf_index"):
        expected.setdefault(leaf.tail_of, []).append(leaf.leaf_index)
    with CaptureQueriesContext(connection) as queries:
        found = store.tails_of(ids + ids[:10])  # repeats are asked for once
    assert {k: [lf.leaf_index for lf in v] for k, v in found.items()} == expected
    assert len(expected[tailed[0]]) == 2 and tailed[1] not in expected
    assert len(queries) == 3
    assert all(q["sql"].count("run_absent_") <= store.TAIL_LOOKUP_PIECE for q in queries.captured_queries)
    assert store.tails_of([]) == {}


def test_anchored_heads_are_those_one_query_finds(tailed):
    ids = _ids(tailed)
    expected: dict[str, int] = {}
    for data in LogLeaf.objects.filter(Q(run_id__in=ids) | Q(tail_of__in=ids)).values_list("data", flat=True):
        fields = leafdata.decode_any(data)
        expected[fields["runId"]] = max(expected.get(fields["runId"], 0), fields["lastSequenceNo"])
    with CaptureQueriesContext(connection) as queries:
        heads = log.anchored_heads(ids)
    assert heads == expected and set(heads) == set(tailed)
    assert len(queries) == 3


def test_a_piece_stays_below_the_servers_dive_limit():
    if connection.vendor != "mysql":
        pytest.skip("MariaDB's optimizer setting")
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@eq_range_index_dive_limit")
        (limit,) = cursor.fetchone()
    assert limit == 0 or int(limit) > store.TAIL_LOOKUP_PIECE
