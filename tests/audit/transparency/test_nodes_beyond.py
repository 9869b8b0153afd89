"""A node stored where no tree of the stored leaves has one is named by `verify_log`, in a full and in an
incremental verification, counted by ranges of the (level, node_index) index (`_nodes_beyond`) instead
of a count of the whole table: the count must be exactly the nodes outside the tree, for any size."""

from __future__ import annotations

import pytest

from audit.models import Checkpoint, LogNode
from audit.transparency import log
from audit.transparency.verify import Since, _nodes_beyond, verify_log
from tests.audit.transparency.support import finished_runs

pytestmark = pytest.mark.django_db

# Places a forger could store a node: level 0 (the leaf table's), far past the top level, past the last
# complete subtree of a level, a negative index, and places inside a tree of 7 leaves.
_PLACES = [(0, 0), (0, 5), (1, 2), (1, 3), (1, 4), (2, 0), (2, 1), (3, 0), (40, 0), (1, -1), (2, -3)]


def _reference(size: int) -> int:
    inside = {(level, i) for level in range(1, size.bit_length()) for i in range(size >> level)}
    return sum((level, i) not in inside for level, i in _PLACES)


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17])
def test_the_nodes_beyond_are_exactly_those_outside_the_tree(size):
    LogNode.objects.bulk_create([LogNode(level=lv, node_index=ix, hash="0" * 64) for lv, ix in _PLACES])
    assert _nodes_beyond(size) == _reference(size)


@pytest.fixture
def anchored(user, signing_key):
    finished_runs(user, 6, tools=1)
    return log.checkpoint(batch_size=3).checkpoints


@pytest.mark.parametrize("place", [(0, 3), (1, 3), (2, 1), (3, 0), (9, 0), (1, -1)])
def test_a_node_stored_beyond_the_leaves_is_named_in_full_and_incremental_verification(anchored, place):
    assert verify_log().invalid == []
    size = anchored[-1].tree_size  # 7 leaves: nodes (1, 0–2), (2, 0)
    newest = Checkpoint.objects.get(tree_size=size)
    since = Since(newest.tree_size, newest.root_hash, newest.checkpoint_hash)
    assert verify_log(since=since).invalid == []
    LogNode.objects.create(level=place[0], node_index=place[1], hash="ab" * 32)
    for result in (verify_log(), verify_log(since=since)):
        assert "1 log node(s) stored beyond the leaves" in result.invalid, result.invalid


@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_a_node_stored_twice_is_named_in_a_full_verification(user, signing_key):
    """A forger who drops the (level, node_index) unique index can store a node twice inside the tree,
    where no range count sees it: the walk names it, even when the copy carries the right hash."""
    from django.db import connection

    finished_runs(user, 6, tools=1)
    log.checkpoint(batch_size=3)
    assert verify_log().invalid == []
    good = LogNode.objects.get(level=1, node_index=1)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE audit_log_node DROP INDEX uniq_log_node")
    copy = None
    try:
        copy = LogNode.objects.create(level=1, node_index=1, hash=good.hash)
        invalid = verify_log().invalid
        assert any("level 1 index 1" in p and "stored more than once" in p for p in invalid), invalid
    finally:
        if copy is not None:
            copy.delete()
        with connection.cursor() as cursor:
            cursor.execute(
                "ALTER TABLE audit_log_node ADD CONSTRAINT uniq_log_node UNIQUE (level, node_index)"
            )
