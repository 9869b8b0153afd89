"""A stored row's digest is written as text directly (`audit.verify.row_digests._generated_text`): it must
be exactly the SHA-256 of `canonical_json(form.document(values, stored=True))`, the digest's definition,
for the rows a real recorded run stores and for values no recorder writes but a database may hold."""

from __future__ import annotations

import datetime as dt
import enum
from types import SimpleNamespace

import pytest

from audit.models import AgentStep, RunReview, ToolInvocation
from audit.payloads import canonical_json, sha256_hex
from audit.read.trace import session_of
from audit.verify import row_digests
from audit.verify.row_digests import stored_reasoning_rows
from audit.write.reviews import record_review
from diagnosis.models import DiagnosisRun
from tests.factories import record_full_run

pytestmark = pytest.mark.django_db


def _defined(form: row_digests.Form, values: dict) -> str:
    return sha256_hex(canonical_json(form.document(values, stored=True)))


def _both(form: row_digests.Form, row) -> None:
    values = form.values_of(row)
    assert form.digest_of(row) == _defined(form, values)
    assert form.digest(values, stored=True) == _defined(form, values)


def test_the_rows_of_a_recorded_run(run, user):
    record_full_run(run, tools=3, extra_steps=1)
    user.is_staff = user.is_superuser = True
    user.save()
    run.refresh_from_db()
    record_review(run=run, user=user, verdict="correct", note='checked — 已核对 "quoted"\n')
    run = DiagnosisRun.objects.get(pk=run.pk)
    steps = list(AgentStep.objects.filter(run_id=run.run_id))
    tools = list(ToolInvocation.objects.filter(run_id=run.run_id))
    reviews = list(RunReview.objects.filter(run_id=run.run_id))
    reasoning = stored_reasoning_rows(run_id=run.run_id)
    assert steps and tools and reviews and reasoning
    for row in steps:
        _both(row_digests.STEP, row)
    for row in tools:
        _both(row_digests.TOOL, row)
        _both(row_digests.TOOL_V1, row)
    for row in reviews:
        _both(row_digests.REVIEW, row)
    for row in reasoning:
        assert row_digests.REASONING.digest(row, stored=True) == _defined(row_digests.REASONING, row)
    for form in (row_digests.RUN, row_digests.RUN_V1, row_digests.RUN_START):
        _both(form, run)
    _both(row_digests.SESSION, session_of(run))


class _Flag(enum.IntEnum):
    ON = 1


class _Word(enum.StrEnum):
    WORD = "wörd"


ODD = [
    None,
    "",
    'tab\tquote"backslash\\ newline\n nul\x00 del\x7f line\u2028 emoji 😀 中文',
    "\ud800",  # a lone surrogate (the digest's encoder passes it through)
    0,
    -(2**70),
    True,
    False,
    1.5,
    float("nan"),
    float("inf"),
    _Flag.ON,
    _Word.WORD,
    {"b": [1, 2.5, None, {"ü": "x"}], "a": {"z": True}},
    [{"k": "v"}, "s", 3],
    dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
    dt.datetime(2026, 1, 2, 3, 4, 5, 600, tzinfo=dt.timezone(dt.timedelta(hours=8))),
    dt.datetime(2026, 1, 2, 3, 4, 5),  # naive: read as UTC
]


@pytest.mark.parametrize(
    "form", [row_digests.STEP, row_digests.TOOL, row_digests.REASONING, row_digests.REVIEW]
)
def test_any_value_in_any_column(form):
    """Every odd value in every column of the form (the others None): a string, integer or boolean
    written directly, everything else through the column's normaliser and `canonical_json`."""
    for column in form.columns:
        for value in ODD:
            values = {c: None for c in form.columns}
            values[column] = value
            try:
                expected = _defined(form, values)
            except Exception as exc:  # a value the column's normaliser refuses: refused the same way
                with pytest.raises(type(exc)):
                    form.digest(values, stored=True)
                continue
            assert form.digest(values, stored=True) == expected, (column, value)
            row = SimpleNamespace(**{form.fields[c].attname: v for c, v in values.items()})
            assert form.digest_of(row) == expected, (column, value)


@pytest.mark.parametrize("microsecond", [0, 1, 10, 600, 100000, 999999])
@pytest.mark.parametrize("offset", [0, 8, -5.5])
def test_timestamp_is_the_utc_time_with_six_digits_of_fraction(microsecond, offset):
    """`hash_chain.timestamp` (every chain hash and row digest writes it) is the time in UTC written with
    `timespec="microseconds"`, whether its fraction is zero or not."""
    from audit.verify.hash_chain import timestamp

    zone = dt.UTC if offset == 0 else dt.timezone(dt.timedelta(hours=offset))
    value = dt.datetime(2026, 1, 2, 3, 4, 5, microsecond, tzinfo=zone)
    assert timestamp(value) == value.astimezone(dt.UTC).isoformat(timespec="microseconds")
    assert len(timestamp(value)) == 32 and timestamp(value).endswith("+00:00")
