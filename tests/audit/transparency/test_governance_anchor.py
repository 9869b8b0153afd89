"""The governance chain's head is anchored in the transparency log: each checkpoint that finds the chain
grown appends one governance leaf (after the runs it appends) and signs it with them; `verify_audit`
checks every anchor, so a governance chain edited and re-hashed from the edit on — which every link check
accepts — is detected, as is one cut below its anchored head."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from audit.models import GovernanceEvent, LogLeaf
from audit.transparency import leafdata, log
from audit.transparency.verify import verify_log
from audit.verify.governance_chain import verify_governance
from audit.write.governance import governance_hash
from core import writeauth
from tests.factories import make_recorded_run

pytestmark = pytest.mark.django_db


def _changes(user, n: int) -> None:
    """`n` governance events: the staff flag toggled."""
    for _ in range(n):
        user.is_staff = not user.is_staff
        user.save()


def _head() -> GovernanceEvent:
    return GovernanceEvent.objects.order_by("-sequence_no").first()


def _verify() -> tuple[bool, str]:
    out = io.StringIO()
    try:
        call_command("verify_audit", stdout=out)
    except CommandError:
        return False, out.getvalue()
    return True, out.getvalue()


def rehash_governance(*, start: int) -> None:
    """Recompute `prev_hash` and `hash` of the governance events from `start` on, as someone who edited
    one in the database would, so that every link of the chain verifies again."""
    prev = None
    for event in GovernanceEvent.objects.order_by("sequence_no"):
        if event.sequence_no >= start:
            event.prev_hash = prev if prev is not None else event.prev_hash
            event.hash = governance_hash(event)
            GovernanceEvent.objects.filter(pk=event.pk).update(prev_hash=event.prev_hash, hash=event.hash)
        prev = event.hash


def test_a_checkpoint_anchors_the_governance_head_once_after_its_runs(user, signing_key):
    _changes(user, 3)
    runs = [make_recorded_run(user) for _ in range(2)]
    result = log.checkpoint()
    head = _head()
    assert result.appended == 2 and result.governance_anchored == head.sequence_no
    assert result.tree_size == 3 and len(result.checkpoints) == 1
    leaves = list(LogLeaf.objects.order_by("leaf_index"))
    assert [leaf.run_id for leaf in leaves] == [r.run_id for r in runs] + [None]
    governance = leaves[-1]
    assert governance.governance_sequence_no == head.sequence_no
    fields = leafdata.decode_governance(governance.data)
    assert (fields["chainHead"], fields["lastSequenceNo"]) == (head.hash, head.sequence_no)

    # Nothing new: nothing appended, nothing signed.
    again = log.checkpoint()
    assert (again.appended, again.governance_anchored, again.checkpoints) == (0, None, [])
    # The chain grew: the next checkpoint anchors its new head, with no run waiting.
    _changes(user, 1)
    grown = log.checkpoint()
    assert grown.governance_anchored == _head().sequence_no and grown.tree_size == 4
    assert verify_log().ok and verify_governance()[1] == []
    ok, out = _verify()
    assert ok, out
    assert f"anchored in the transparency log up to event {_head().sequence_no}: ok" in out


def test_a_rewritten_governance_chain_no_longer_matches_its_anchor(user, signing_key):
    _changes(user, 4)
    log.checkpoint()
    anchored = _head()
    leaf = LogLeaf.objects.get(governance_sequence_no=anchored.sequence_no)
    second = GovernanceEvent.objects.get(sequence_no=anchored.sequence_no - 2)
    # Edit an event and re-hash the chain from it: every link verifies again …
    GovernanceEvent.objects.filter(pk=second.pk).update(subject_user="someone-else")
    rehash_governance(start=second.sequence_no)
    _, problems = verify_governance()
    # … but the anchored head is no longer the stored one, and the re-hashed links carry tags the
    # attacker could not make.
    assert problems == [
        f"governance event {anchored.sequence_no}: differs from the head anchored in the transparency log "
        f"(leaf {leaf.leaf_index}): the chain was rewritten after it was anchored",
        f"governance events {second.sequence_no}–{anchored.sequence_no}: tag by write key "
        f"{writeauth.verifier().current.key_id} does not verify (not written by the service)",
    ]
    ok, out = _verify()
    assert not ok and f"governance INVALID governance event {anchored.sequence_no}: differs" in out


def test_a_governance_chain_cut_below_its_anchor_is_detected(user, signing_key):
    _changes(user, 3)
    log.checkpoint()
    anchored = _head()
    leaf = LogLeaf.objects.get(governance_sequence_no=anchored.sequence_no)
    GovernanceEvent.objects.filter(sequence_no=anchored.sequence_no).delete()  # the head removed: no gap
    _, problems = verify_governance()
    assert problems == [
        f"governance event {anchored.sequence_no}: anchored in the transparency log (leaf {leaf.leaf_index}) "
        "but missing from the chain"
    ]


def test_a_forged_governance_leaf_breaks_the_signed_root(user, signing_key):
    _changes(user, 2)
    log.checkpoint()
    leaf = LogLeaf.objects.get(governance_sequence_no__isnull=False)
    event = _head()
    GovernanceEvent.objects.filter(pk=event.pk).update(actor="someone-else")
    rehash_governance(start=event.sequence_no)
    # Rewriting the leaf to the new head instead changes the leaf hash the checkpoint signed.
    forged = leafdata.encode(
        leafdata.governance_fields(
            head_hash=GovernanceEvent.objects.get(pk=event.pk).hash,
            head_sequence_no=event.sequence_no,
            created_at=event.created_at,
        )
    )
    LogLeaf.objects.filter(pk=leaf.pk).update(data=forged.decode())
    # The chain now matches the forged leaf, but the re-hashed head carries no tag the attacker could
    # make, …
    assert verify_governance()[1] == [
        f"governance event {event.sequence_no}: tag by write key {writeauth.verifier().current.key_id} does "
        "not verify (not written by the service)"
    ]
    result = verify_log()
    assert f"log leaf {leaf.leaf_index} (governance): leaf hash does not match its data" in result.invalid
    assert not _verify()[0]
