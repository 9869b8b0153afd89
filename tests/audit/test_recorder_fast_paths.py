"""The recorder's faster paths give what the paths they replace gave: the identity RUN_STARTED binds is read
by a query compiled once with the ORM's row (values and types), and the rows, events, digests and tags a
run writes are the ones the plain construction writes."""

from __future__ import annotations

import pytest
from django.db.models import F

from audit.verify import row_digests
from audit.write import RunRecorder
from audit.write.run import _IDENTITY
from diagnosis.models import DiagnosisRun


def _orm_identity(run_id: str):
    """The read as the recorder made it before it was compiled (`.values(…).first()`)."""
    return (
        DiagnosisRun.objects.filter(run_id=run_id)
        .values(
            *row_digests.RUN_START.columns,
            owner_id=F("session__owner_id"),
            session_created_at=F("session__created_at"),
            owner=F("session__owner__username"),
        )
        .first()
    )


@pytest.mark.django_db
def test_the_compiled_identity_read_is_the_orms_row(run):
    expected = _orm_identity(run.run_id)
    (found,) = _IDENTITY.rows(run_id=run.run_id)
    row = dict(zip(_IDENTITY.names(), found, strict=True))
    assert row == expected
    assert {k: type(v) for k, v in row.items()} == {k: type(v) for k, v in expected.items()}
    assert row["created_at"].tzinfo is not None and row["session_created_at"].tzinfo is not None
    assert _IDENTITY.rows(run_id="no-such-run") == []


@pytest.mark.django_db
def test_run_started_binds_the_identity_the_orm_row_gives(run):
    expected = _orm_identity(run.run_id)
    session = {
        "session_id": expected["session_id"],
        "owner_id": expected["owner_id"],
        "created_at": expected["session_created_at"],
    }
    identity = RunRecorder.for_run(run)._identity()
    assert identity == {
        "startForm": "run-start",
        "startDigest": row_digests.RUN_START.digest(expected, stored=True),
        "sessionForm": "session",
        "sessionDigest": row_digests.SESSION.digest(session, stored=True),
        "owner": expected["owner"],
    }
    assert identity["startDigest"] == row_digests.RUN_START.digest_of(run)
    assert RunRecorder(run_id="no-such-run", session_id=run.session_id)._identity() == {}


def test_a_json_column_serialises_as_json_dumps_with_its_encoder():
    """`json_text(encoder)` (one encoder made once) writes the text `json.dumps(value, cls=encoder)`
    writes, which is what the JSON column stores and the row digest reads back."""
    import datetime as dt
    import decimal
    import json
    import uuid

    from django.core.serializers.json import DjangoJSONEncoder

    from audit.write.table import json_text

    values = [
        {"b": 1, "a": [1, 2.5, None, True], "é": "ü 😀", "nested": {"k": ("t", "u")}},
        [{"role": "system", "chars": 2400}, {"role": "user", "chars": 120}],
        {"at": dt.datetime(2026, 12, 6, 18, 0, 1, 123456, tzinfo=dt.UTC), "d": decimal.Decimal("1.10")},
        {"id": uuid.UUID(int=7), "day": dt.date(2026, 1, 2), "nan": float("nan")},
        "text",
        7,
        None,
    ]

    def outcome(fn, value):
        try:
            return fn(value)
        except TypeError as exc:  # not serialisable without an encoder: refused alike
            return type(exc)

    for value in values:
        assert json_text(DjangoJSONEncoder)(value) == json.dumps(value, cls=DjangoJSONEncoder), value
        assert outcome(json_text(None), value) == outcome(json.dumps, value), value


def test_a_write_tag_is_the_mac_over_its_domain_key_id_and_link():
    """`Verifier.tag` takes its message prefix from the ones built once per key and domain: the tag is
    still `<key id>:HMAC-SHA-256(key, prefix(domain, key id) + link)`, and an unknown domain is refused."""
    from core import writeauth

    verifier = writeauth.Verifier([b"k" * 32, b"o" * 32])
    key = verifier.current
    for domain in sorted(writeauth.DOMAINS):
        link = writeauth.hashlib.sha256(domain.encode()).hexdigest()
        expected = f"{key.key_id}:{writeauth.mac(key.secret, key.key_id, domain, link)}"
        assert verifier.tag(domain, link) == expected
        assert verifier.valid(domain, link, expected)
    with pytest.raises(ValueError):
        verifier.tag("elsewhere", "0" * 64)


def test_a_row_naming_every_column_is_the_row_the_loop_builds():
    """`Table.row` with every column named (the recorder's own rows) skips the defaults' loop: the same
    tuple in column order; a partial row takes the defaults, an unknown column is still refused."""
    from audit.write.rows import tables

    t = tables()
    for table in (t.event, t.step, t.reasoning, t.tool):
        values = {c: f"v{i}" for i, c in enumerate(reversed(table.columns))}
        assert table.row(**values) == tuple(values[c] for c in table.columns)
        partial = dict(list(values.items())[1:])
        missing = next(c for c in table.columns if c not in partial)
        assert table.row(**partial)[table.index[missing]] == table.fields[table.index[missing]].get_default()
        with pytest.raises(KeyError, match="nonsense"):
            table.row(**partial, nonsense=1)


def test_the_keyed_mac_is_hmac_sha256():
    """A verifier's MAC keyed once per key (its inner and outer states copied per link) is the one-shot
    HMAC-SHA-256 of the key over the prefix and the link, whatever the key's length."""
    import hashlib
    import hmac
    import os

    from core import writeauth

    prefix = writeauth._message_prefix("0b7c45a2", writeauth.RUN)
    for length in (0, 1, 31, 32, 63, 64, 65, 100):
        key = os.urandom(length)
        keyed = writeauth._KeyedMac(key)
        for link in ("", "0" * 64, hashlib.sha256(key).hexdigest()):
            assert keyed(prefix, link) == hmac.digest(key, prefix + link.encode("ascii"), "sha256").hex()
            assert keyed(prefix, link) == writeauth._mac(key, prefix, link)
