"""Write keys (issue 43 item 1): configured like the signing keys, several for rotation, a development key
generated once, refused in production when missing or shared with a signing key; every link the service
writes carries a tag by the newest key and old tags keep verifying after a rotation."""

from __future__ import annotations

import pytest

from audit.models import GovernanceEvent, TraceEvent
from audit.transparency import keys
from audit.transparency.checks import check_write_keys
from audit.verify.governance_chain import verify_governance
from audit.verify.runs import verify_run
from audit.write import record_governance_event
from core import writeauth
from tests.factories import make_recorded_run

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _database_key(settings):
    """The key the test database's migrate-time governance events were tagged with (the development
    key), read before a test overrides the keys."""
    _DATABASE_KEY[:] = writeauth.configured_key_texts()


_DATABASE_KEY: list[str] = []


def _keys_and_the_test_databases(*texts: str) -> list[str]:
    """`texts` first, then the test database's key (a deployment rotating its key keeps the old one
    listed the same way)."""
    return [*texts, *_DATABASE_KEY]


def test_every_link_of_a_run_and_of_the_governance_chain_is_tagged_by_the_newest_key(user, settings):
    old, new = writeauth.generate_key_text(), writeauth.generate_key_text()
    settings.AUDIT_WRITE_KEYS = _keys_and_the_test_databases(new, old)
    run = make_recorded_run(user)
    event = record_governance_event(event_type="TOKEN_ISSUED", actor="x", subject_user="y")
    new_id = writeauth.key_id_of(writeauth.parse_key(new))
    links = list(TraceEvent.objects.filter(run_id=run.run_id))
    assert links and {writeauth.key_id_of_tag(e.tag) for e in links} == {new_id}
    assert writeauth.key_id_of_tag(event.tag) == new_id
    for link in links:
        assert writeauth.verifier().problem(writeauth.RUN, link.hash, link.tag) is None
        # A tag of one chain is never valid in the other.
        assert writeauth.verifier().problem(writeauth.GOVERNANCE, link.hash, link.tag) is not None


def test_a_rotated_key_keeps_old_tags_verifying_and_a_dropped_one_names_them(user, settings):
    first, second = writeauth.generate_key_text(), writeauth.generate_key_text()
    settings.AUDIT_WRITE_KEYS = _keys_and_the_test_databases(first)
    run = make_recorded_run(user)
    settings.AUDIT_WRITE_KEYS = _keys_and_the_test_databases(second, first)  # rotated: the newest tags
    assert verify_run(run.run_id).ok
    later = make_recorded_run(user)
    assert verify_run(later.run_id).ok
    # The old key dropped: its tags are named, never trusted.
    settings.AUDIT_WRITE_KEYS = _keys_and_the_test_databases(second)
    result = verify_run(run.run_id)
    first_id = writeauth.key_id_of(writeauth.parse_key(first))
    assert any(f"tagged by an unknown write key {first_id}" in p for p in result.invalid), result.invalid
    assert verify_run(later.run_id).ok


def test_the_development_key_is_generated_once_and_production_refuses_to_start_without_keys(
    settings, tmp_path
):
    settings.AUDIT_WRITE_KEYS = []
    settings.AUDIT_DEV_WRITE_KEY_FILE = tmp_path / "audit-write.key"
    writeauth._dev_key.cache_clear()
    first = writeauth.verifier().current.key_id
    assert (tmp_path / "audit-write.key").stat().st_mode & 0o777 == 0o600
    writeauth._dev_key.cache_clear()  # as a new process would
    assert writeauth.verifier().current.key_id == first
    settings.AUDIT_DEV_WRITE_KEY_FILE = None
    with pytest.raises(writeauth.WriteKeysMissing):
        writeauth.tag(writeauth.RUN, "0" * 64)

    settings.DEBUG = False
    assert [e.id for e in check_write_keys()] == ["audit.E005"]
    signing = keys.generate_key_text()
    settings.AUDIT_SIGNING_KEYS = [signing]
    settings.AUDIT_WRITE_KEYS = ["not-a-key", signing]
    errors = check_write_keys()
    assert [e.id for e in errors] == ["audit.E005", "audit.E005"]
    assert (
        "entry 1 is not base64" in errors[0].msg
        and "entry 2 is also a checkpoint signing key" in errors[1].msg
    )
    assert all(signing not in e.msg and "not-a-key" not in e.msg for e in errors)
    settings.AUDIT_WRITE_KEYS = [writeauth.generate_key_text()]
    assert check_write_keys() == []


def test_a_write_key_never_reaches_a_message_or_a_repr(settings):
    text = writeauth.generate_key_text()
    settings.AUDIT_WRITE_KEYS = [text]
    verifier = writeauth.verifier()
    assert text not in repr(verifier.current) and text not in repr(verifier.keys)
    settings.AUDIT_WRITE_KEYS = [text[:-4]]
    with pytest.raises(writeauth.WriteKeyError) as raised:
        writeauth.verifier()
    assert text[:-4] not in str(raised.value)


def test_the_governance_chain_checks_every_tag(settings):
    record_governance_event(event_type="TOKEN_ISSUED", actor="x", subject_user="y")
    event = GovernanceEvent.objects.order_by("-sequence_no").first()
    assert verify_governance()[1] == []
    GovernanceEvent.objects.filter(pk=event.pk).update(tag="")
    problems = verify_governance()[1]
    assert problems == [
        f"governance event {event.sequence_no}: no write tag, and nothing in the signed log vouches for it "
        "(not written by the service)"
    ]
