"""The format modules' edges that the golden vectors do not reach (issue 43 item 11): each test here
kills mutants of `audit.verify.hash_chain`, `audit.verify.row_digests`, `core.writeauth` and
`audit.transparency`'s format modules that mutmut found alive (docs/contributing.md, "Mutation
testing of the format")."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from audit.models import AgentStep
from audit.payloads import canonical_json
from audit.verify import hash_chain, row_digests
from audit.write.table import RawJSON
from core import writeauth
from reasoning.fields import Ciphertext
from tests.audit.vectors import reference as ref

VECTORS = json.loads((Path(__file__).parent / "vectors" / "format-v1.json").read_text(encoding="utf-8"))
ROWS = VECTORS["rowDigests"]
KEYS = [base64.b64encode(bytes.fromhex(k)).decode("ascii") for k in VECTORS["writeTags"]["keysHex"]]


def _typed(value):
    return ref.typed(value, cipher=Ciphertext, raw=RawJSON)


def _form(name):
    return {f.name: f for f in (*row_digests._RUN_FORMS.values(), *row_digests._TOOL_FORMS.values())}.get(
        name
    ) or {
        f.name: f
        for f in (
            row_digests.STEP,
            row_digests.REASONING,
            row_digests.RUN_START,
            row_digests.SESSION,
            row_digests.REVIEW,
        )
    }.get(name, row_digests.READ)


# --------------------------------------------------------------------------------------------------
# Row digests
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("vector", ROWS, ids=[v["name"] for v in ROWS])
def test_a_form_built_now_from_its_model_and_columns_gives_the_pinned_digest(vector):
    """The module's forms are built at import; a form built again (as a higher layer registers one)
    normalises every column the same way, for written and for stored values."""
    pinned = _form(vector["form"])
    cls = type(pinned)
    again = cls(pinned.name, pinned.model, pinned.columns)
    values = _typed(vector["values"])
    assert again.digest(values, stored=vector["stored"]) == vector["digest"]
    assert canonical_json(again.document(values, stored=vector["stored"])) == vector["document"]
    row = SimpleNamespace(**{again.fields[c].attname: v for c, v in values.items()})
    if vector["stored"]:
        assert again.digest_of(row) == vector["digest"]


def test_every_value_class_normalises_to_the_same_canonical_value():
    """Each column's shortcut (a value of the exact canonical class taken as it is) and its normaliser
    agree: a str subclass, an int given as text, a bool given as int, naive and zoned times."""
    form = row_digests.STEP
    base = _typed(ROWS[0]["values"])
    variants = {
        "agent_name": ref.Text("diagnosis_agent"),
        "duration_ms": "900",
        "has_tool_call": 1,
        "usage_available": True,
        "started_at": dt.datetime(2026, 3, 1, 13, 0, 0, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))),
        "created_at": dt.datetime(2026, 3, 1, 12, 0, 0, 1),
        "model_input": ({"role": "user", "chars": 27},),
    }
    assert form.digest({**base, **variants}) == form.digest(base) == ROWS[0]["digest"]
    canonical = form.canonical({**base, **variants})
    assert canonical["has_tool_call"] is True and canonical["duration_ms"] == 900
    assert type(canonical["agent_name"]) is str and canonical["model_input"] == [
        {"role": "user", "chars": 27}
    ]


def test_written_json_goes_through_a_json_round_trip_and_stored_json_does_not():
    form = row_digests.STEP
    base = _typed(ROWS[0]["values"])
    for value, expected in (
        (RawJSON('{"b": 1, "a": [1, 2]}'), {"a": [1, 2], "b": 1}),
        ({1: "int key"}, {"1": "int key"}),
        (None, None),
    ):
        assert form.canonical({**base, "model_output": value})["model_output"] == expected
    assert form.canonical({**base, "model_output": {1: "x"}}, stored=True)["model_output"] == {1: "x"}
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    with pytest.raises(TypeError):  # a written value JSON cannot hold never reaches a digest
        form.canonical({**base, "model_output": {"t": when}})
    assert form.canonical({**base, "model_output": {"t": when}}, stored=True)["model_output"] == {"t": when}


def test_encrypted_columns_are_their_stored_token_never_the_plaintext():
    form = row_digests.REASONING
    base = _typed(next(v for v in ROWS if v["form"] == "reasoning")["values"])
    for stored in (False, True):
        row = form.canonical(
            {**base, "reasoning_content": Ciphertext("fernet:k:t"), "assistant_text": None}, stored=stored
        )
        assert (row["reasoning_content"], row["assistant_text"]) == ("fernet:k:t", None)
        row = form.canonical({**base, "reasoning_content": ref.Text("fernet:k:t")}, stored=stored)
        assert row["reasoning_content"] == "fernet:k:t" and type(row["reasoning_content"]) is str


def test_the_run_form_digests_its_content_and_nothing_else_changes_it():
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # sha256 of no bytes
    run = [v for v in ROWS if v["form"] == "run"]
    assert run[1]["digest"] == run[2]["digest"]  # "" and NULL content: the same digest
    assert json.loads(run[1]["document"])["row"]["content"] == empty
    values = _typed(run[0]["values"])
    row = row_digests.RUN_V1.canonical(values)
    assert row["content"] == ref.sha256_text(values["content"])
    instance = SimpleNamespace(**values)
    assert row_digests.RUN_V1.digest_of(instance) == run[0]["digest"]


def test_form_lookups_by_name():
    assert (
        row_digests.run_form(None) is row_digests.RUN_V1 and row_digests.run_form("run/4") is row_digests.RUN
    )
    assert row_digests.run_form("run/9") is None
    assert (
        row_digests.tool_form(None) is row_digests.TOOL_V1
        and row_digests.tool_form("tool/2") is row_digests.TOOL
    )
    assert row_digests.tool_form("tool/9") is None
    assert row_digests.start_form("run-start") is row_digests.RUN_START
    assert row_digests.start_form(None) is None and row_digests.start_form("") is None
    assert row_digests.start_form("x") is None
    assert row_digests.session_form("session") is row_digests.SESSION
    assert row_digests.session_form(None) is None and row_digests.session_form("x") is None
    assert row_digests.form_of(AgentStep) is row_digests.STEP and row_digests.form_of(SimpleNamespace) is None


def test_a_registered_form_binds_its_model_once():
    class Model:
        pass

    form = SimpleNamespace(name="score", model=Model)
    try:
        assert row_digests.register_form(form) is form and row_digests.form_of(Model) is form
        assert row_digests.register_form(SimpleNamespace(name="score", model=Model)).name == "score"
        with pytest.raises(ValueError, match=r"^Model already has the form score$"):
            row_digests.register_form(SimpleNamespace(name="score/2", model=Model))
    finally:
        row_digests._BY_MODEL.pop(Model, None)


def test_reasoning_bindings_carry_each_rows_id_step_agent_and_stored_digest():
    stored = [v for v in ROWS if v["form"] == "reasoning" and v["stored"]]
    rows = [{"id": 10 + i, **_typed(v["values"])} for i, v in enumerate(stored)]
    assert row_digests.reasoning_bindings(rows) == [
        {"id": 10 + i, "stepIndex": -1, "agentName": "router", "digest": v["digest"]}
        for i, v in enumerate(stored)
    ]
    assert row_digests.reasoning_bindings([]) == []


# --------------------------------------------------------------------------------------------------
# The chain
# --------------------------------------------------------------------------------------------------
def test_the_gap_message_names_one_number_or_a_range():
    assert hash_chain._ranges([4]) == "4"
    assert hash_chain._ranges([2, 3]) == "2–3"
    assert hash_chain._ranges([2, 3, 4, 5]) == "2–5"


def test_a_link_read_with_its_stored_details_text_is_checked_over_that_text():
    """`timeline_of` reads details as stored text: the verdict comes from that text without decoding
    it (the decoded details are needed only when the text is not what was hashed)."""
    e = ref.typed(VECTORS["chains"][1]["events"][0])  # one intact event
    link = SimpleNamespace(
        run_id=e["runId"], session_id=e["sessionId"], sequence_no=e["sequenceNo"], phase=e["phase"],
        event_type=e["eventType"], status=e["status"], summary=e["summary"], created_at=e["createdAt"],
        prev_hash=e["prevHash"], hash=e["hash"], details=object(), details_text=canonical_json(e["details"]),
    )  # fmt: skip
    assert hash_chain.verify_chain([link]).valid
    link.details_text = '{"n":2}'  # neither the text nor the details are what was hashed
    assert hash_chain.verify_chain([link]).problems == ["sequence 1: stored hash does not match its content"]
    del link.details_text
    assert not hash_chain.verify_chain([link]).valid


def test_the_payload_text_converts_every_field_as_canonical_json_does():
    fields = {
        "run_id": ref.Text("r"),
        "session_id": "s",
        "sequence_no": True,  # an int subclass: written as the number
        "phase": "P",
        "event_type": "E",
        "status": "",
        "summary": '摘要 \u2028 "q"',
        "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    }
    text = hash_chain.event_payload_json(**fields, details_json='{"a":1}')
    assert text == canonical_json(hash_chain.event_payload(**{**fields, "sequence_no": 1}, details={"a": 1}))


# --------------------------------------------------------------------------------------------------
# Write keys and tags
# --------------------------------------------------------------------------------------------------
def test_a_write_key_is_base64_of_exactly_32_bytes():
    for text in (
        "",
        "not base64!",
        base64.b64encode(b"x" * 31).decode(),
        base64.b64encode(b"x" * 33).decode(),
    ):
        with pytest.raises(writeauth.WriteKeyError, match=r"^a write key is base64 of 32 random bytes$"):
            writeauth.parse_key(text)
    with pytest.raises(writeauth.WriteKeyError, match=r"^a write key is base64 of 32 random bytes$"):
        writeauth.parse_key(KEYS[0][:10] + "!" + KEYS[0][10:])  # only the alphabet: nothing is skipped
    generated = writeauth.generate_key_text()
    assert len(writeauth.parse_key(generated)) == 32 and generated != writeauth.generate_key_text()
    with pytest.raises(writeauth.WriteKeyError, match=r"^no write key$"):
        writeauth.Verifier([])
    assert writeauth.TAG_CHARS == 73 and writeauth.KEY_ID_CHARS == 8


def test_a_tag_is_only_made_for_a_known_domain():
    key = base64.b64decode(KEYS[0])
    with pytest.raises(ValueError, match=r"^unknown tag domain 'other'$"):
        writeauth.mac(key, "0b7c45a2", "other", "0" * 64)


def test_why_a_tag_does_not_authenticate():
    verifier = writeauth.Verifier([base64.b64decode(k) for k in KEYS])
    link = "0" * 64
    good = verifier.tag(writeauth.RUN, link)
    key_id = VECTORS["writeTags"]["keyIds"][0]
    assert verifier.problem(writeauth.RUN, link, "") == "untagged"
    assert verifier.problem(writeauth.RUN, link, "no-colon") == "tagged by an unknown write key ?"
    assert (
        verifier.problem(writeauth.RUN, link, "ffffffff0000:x") == "tagged by an unknown write key ffffffff"
    )
    assert verifier.problem(writeauth.RUN, "1" * 64, good) == f"tag by write key {key_id} does not verify"
    flipped = good[:-1] + ("1" if good.endswith("0") else "0")
    assert verifier.problem(writeauth.RUN, link, flipped) == f"tag by write key {key_id} does not verify"
    assert not verifier.valid(writeauth.RUN, link, "") and verifier.valid(writeauth.RUN, link, good)
    assert (
        writeauth.key_id_of_tag("") == "" == writeauth.key_id_of_tag(None) == writeauth.key_id_of_tag("abc")
    )
    assert repr(verifier.current) == f"WriteKey({key_id})"
    assert writeauth.key_id_of_tag("ab:cd:ef") == "ab"  # what precedes the first colon
    assert (
        verifier.problem(writeauth.RUN, link, f"{key_id}:{good}")
        == f"tag by write key {key_id} does not verify"
    )


def test_a_repeated_key_is_listed_once_by_id_and_the_first_tags():
    a, b = (base64.b64decode(k) for k in KEYS)
    verifier = writeauth.Verifier([b, a, b])
    assert [k.key_id for k in verifier.keys] == [
        VECTORS["writeTags"]["keyIds"][1],
        *VECTORS["writeTags"]["keyIds"],
    ]
    assert verifier.tag(writeauth.GOVERNANCE, "0" * 64).startswith(VECTORS["writeTags"]["keyIds"][1] + ":")


def test_the_configured_keys_newest_first(settings, tmp_path):
    settings.AUDIT_WRITE_KEYS = [f" {KEYS[1]} ", "", "  ", KEYS[0]]
    assert writeauth.configured_key_texts() == [KEYS[1], KEYS[0]]
    assert writeauth.key_ids() == VECTORS["writeTags"]["keyIds"][::-1]
    assert writeauth.tag(writeauth.RUN, "3f" * 32) == ref.write_tag(
        base64.b64decode(KEYS[1]), "run", "3f" * 32
    )
    settings.AUDIT_WRITE_KEYS = [KEYS[0], "bad"]
    with pytest.raises(
        writeauth.WriteKeyError, match=r"^AUDIT_WRITE_KEYS entry 2 is not base64 of 32 bytes$"
    ):
        writeauth.verifier()
    settings.AUDIT_WRITE_KEYS = []
    settings.AUDIT_DEV_WRITE_KEY_FILE = None
    assert writeauth.key_ids() == []
    with pytest.raises(
        writeauth.WriteKeysMissing,
        match=r"^AUDIT_WRITE_KEYS is empty: nothing the service writes to the audit record",
    ):
        writeauth.configured_key_texts()
    settings.AUDIT_DEV_WRITE_KEY_FILE = tmp_path / "k"
    (tmp_path / "k").write_text(KEYS[0] + "\n")
    writeauth._dev_key.cache_clear()
    try:
        assert writeauth.configured_key_texts() == [KEYS[0]]
        assert writeauth.key_ids() == VECTORS["writeTags"]["keyIds"][:1]
    finally:
        writeauth._dev_key.cache_clear()


def test_a_form_built_now_takes_stored_json_as_it_is_and_round_trips_written_json():
    """Stored JSON is what the database gave back (`json.loads` of the column), taken as it is; a written
    value goes through the column's own encoder first, and a column with a decoder is normalised by the
    round trip even as stored. (A form built now: the module's forms are built at import.)"""
    from django.core.serializers.json import DjangoJSONEncoder
    from django.db import models

    form = row_digests.Form("step", AgentStep, row_digests.STEP_COLUMNS)
    assert (form.name, form.model, form.columns) == ("step", AgentStep, row_digests.STEP_COLUMNS)
    base = _typed(ROWS[0]["values"])
    row = SimpleNamespace(**{form.fields[c].attname: v for c, v in base.items()})
    assert form.values_of(row) == base
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    with pytest.raises(TypeError):  # a written value the column could not store never reaches a digest
        form.canonical({**base, "model_output": {"t": when}})
    assert form.canonical({**base, "model_output": {"t": when}}, stored=True)["model_output"] == {"t": when}

    def column(**kwargs):
        field = models.JSONField(**kwargs)
        field.set_attributes_from_name("doc")
        return row_digests.Form(
            "doc", SimpleNamespace(_meta=SimpleNamespace(get_field=lambda c: field)), ("doc",)
        )

    encoded = column(encoder=DjangoJSONEncoder)
    assert encoded.canonical({"doc": {"t": when}}) == {"doc": {"t": "2026-01-01T00:00:00Z"}}
    assert encoded.canonical({"doc": {"t": when}}, stored=True) == {"doc": {"t": when}}
    decoded = column(encoder=DjangoJSONEncoder, decoder=json.JSONDecoder)
    assert decoded.canonical({"doc": {"t": when}}, stored=True) == {"doc": {"t": "2026-01-01T00:00:00Z"}}


def test_digests_and_documents_are_of_written_values_unless_told_stored():
    """`stored` reaches every path (document, digest, the run forms), and written is the default: a
    written JSON value the column could not hold raises, a stored one is taken as it is."""
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    step = {**_typed(ROWS[0]["values"]), "model_output": {"t": when}}
    run = {**_typed(next(v for v in ROWS if v["form"] == "run/4")["values"]), "self_evaluation": {"t": when}}
    for form, values, column in (
        (row_digests.STEP, step, "model_output"),
        (row_digests.RUN, run, "self_evaluation"),
    ):
        for written in (form.canonical, form.document, form.digest):
            with pytest.raises(TypeError):
                written(values)
        stored = form.document(values, stored=True)
        assert stored["row"][column] == {"t": when}
        text = canonical_json({"form": form.name, "row": {**stored["row"], column: {"t": str(when)}}})
        assert form.digest(values, stored=True) == ref.sha256_text(text)
        assert form.canonical(values, stored=True)[column] == {"t": when}
    listed = row_digests.STEP.document({**_typed(ROWS[0]["values"]), "model_input": ({"a": 1},)})
    assert type(listed["row"]["model_input"]) is list  # written: what the column gives back


def test_a_naive_time_is_utc_whatever_the_process_time_zone(monkeypatch):
    import time

    vector = next(v for v in ROWS if v["name"] == "naive and non-UTC times")
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        assert row_digests.STEP.digest(_typed(vector["values"])) == vector["digest"]
    finally:
        monkeypatch.undo()
        time.tzset()


def test_a_tag_without_a_colon_names_no_key_even_when_it_is_a_key_id():
    verifier = writeauth.Verifier([base64.b64decode(k) for k in KEYS])
    key_id = VECTORS["writeTags"]["keyIds"][0]
    assert verifier.problem(writeauth.RUN, "0" * 64, key_id) == "tagged by an unknown write key ?"


def test_without_write_key_settings_tagging_is_refused_and_says_how_to_make_a_key(settings):
    settings.AUDIT_WRITE_KEYS = []
    settings.AUDIT_DEV_WRITE_KEY_FILE = None  # as in production
    with pytest.raises(writeauth.WriteKeysMissing) as raised:
        writeauth.configured_key_texts()
    assert str(raised.value) == (
        "AUDIT_WRITE_KEYS is empty: nothing the service writes to the audit record can be authenticated. "
        'Generate a key with `python -c "import base64, os; '
        'print(base64.b64encode(os.urandom(32)).decode())"`.'
    )
    assert writeauth.key_ids() == []
