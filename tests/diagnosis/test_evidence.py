"""Evidence ids declared once (`diagnosis.evidence`, issue 44 item 5): the grammar of `kb:<slug>#<n>` and
`prom:<16 hex>`, parsing a bare id and a citation bracket, formatting, the guard's loose reading, and
that a new kind is one declaration. Pure Python: no database."""

from __future__ import annotations

import re

import pytest

from diagnosis import evidence
from diagnosis.evidence import (
    KINDS,
    METRIC_RESULT,
    RUNBOOK_CHUNK,
    SLUG_PATTERN,
    EvidenceKind,
    Part,
    cited_ids,
    parse,
    parse_citation,
)

HEX = "0123456789abcdef"


@pytest.mark.parametrize(
    ("text", "kind", "values"),
    [
        ("kb:disk-full#1", RUNBOOK_CHUNK, {"slug": "disk-full", "ordinal": 1}),
        ("kb:a#2", RUNBOOK_CHUNK, {"slug": "a", "ordinal": 2}),
        ("kb:redis_conn-timeout-zh#12", RUNBOOK_CHUNK, {"slug": "redis_conn-timeout-zh", "ordinal": 12}),
        ("kb:x9#999999", RUNBOOK_CHUNK, {"slug": "x9", "ordinal": 999_999}),
        (f"prom:{HEX}", METRIC_RESULT, {"digest": HEX}),
    ],
)
def test_well_formed_ids_parse_to_their_kind_and_values(text, kind, values):
    parsed = parse(text)
    assert parsed is not None and parsed.kind is kind and parsed.as_dict() == values
    assert str(parsed) == parsed.text == text
    assert kind.format(**values) == text  # formatting is parsing's inverse


@pytest.mark.parametrize(
    "text",
    [
        "",
        "kb:",
        "kb:disk-full",  # no ordinal
        "kb:disk-full#",
        "kb:#1",  # no slug
        "kb:disk-full#0",  # ordinals count from 1
        "kb:disk-full#01",  # no leading zero
        "kb:disk-full#1000000",  # more than 6 digits
        "kb:disk-full#1234567",
        "kb:disk-full#-1",
        "kb:disk-full#1.5",
        "kb:Disk-Full#1",  # slugs are lowercase
        "kb:disk--full#1",  # one separator between words
        "kb:-disk#1",
        "kb:disk-#1",
        "kb:disk full#1",
        "kb:disk/full#1",
        "kb:disk-full#1#2",
        "kb:dïsk-full#1",  # unicode letter
        "kb:disk‐full#1",  # U+2010 hyphen
        "kb:ｄisk#1",  # fullwidth letter
        "kb:disk-full#١",  # Arabic-Indic digit one: `\d` would take it, the grammar does not
        "kb:disk-full#１",  # fullwidth digit
        " kb:disk-full#1",  # a bare id has no blanks around it
        "kb:disk-full#1 ",
        "kb:disk-full#1\n",
        "[kb:disk-full#1]",  # a citation, not a bare id
        "kb:disk-full#1]",
        "KB:disk-full#1",
        "kb :disk-full#1",
        "prom:",
        "prom:0123",  # too short
        f"prom:{HEX}0",  # too long
        "prom:0123456789ABCDEF",  # lowercase hex only
        "prom:0123456789abcdeg",
        "prom:bogus",
        "mcp:Server/0123456789abcdef",  # the server part is a lowercase slug
        "disk-full#1",
    ],
)
def test_malformed_ids_do_not_parse(text):
    assert parse(text) is None
    assert all(kind.parse(text) is None for kind in KINDS)


@pytest.mark.parametrize("value", [None, 1, b"kb:a#1", ["kb:a#1"]])
def test_what_is_not_text_does_not_parse(value):
    assert parse(value) is None and parse_citation(value) is None


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        ({"slug": "Disk", "ordinal": 1}, RUNBOOK_CHUNK),
        ({"slug": "disk", "ordinal": 0}, RUNBOOK_CHUNK),
        ({"slug": "disk", "ordinal": 1_000_000}, RUNBOOK_CHUNK),
        ({"slug": "disk", "ordinal": True}, RUNBOOK_CHUNK),
        ({"slug": "disk"}, RUNBOOK_CHUNK),  # a part missing
        ({"slug": "disk", "ordinal": 1, "extra": 2}, RUNBOOK_CHUNK),
        ({"digest": "0123"}, METRIC_RESULT),
        ({"digest": HEX.upper()}, METRIC_RESULT),
    ],
)
def test_formatting_refuses_what_would_not_parse(values, kind):
    with pytest.raises(ValueError):
        kind.format(**values)


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("[kb:disk-full#2]", ["kb:disk-full#2"]),
        ("[ kb:disk-full#2 ]", ["kb:disk-full#2"]),
        (f"[kb:disk-full#2; prom:{HEX}]", ["kb:disk-full#2", f"prom:{HEX}"]),
        (f"[kb:a#1 ,prom:{HEX} ; kb:b_c#3]", ["kb:a#1", f"prom:{HEX}", "kb:b_c#3"]),
    ],
)
def test_a_citation_bracket_parses_to_its_ids(text, ids):
    assert [str(i) for i in parse_citation(text)] == ids


@pytest.mark.parametrize(
    "text",
    [
        "kb:disk-full#2",  # no brackets
        "[]",
        "[kb:disk-full#2",
        "[kb:disk-full#2]]",
        "[[kb:disk-full#2]",
        "[kb:disk-full#2,]",
        "[kb:disk-full#2 kb:a#1]",  # no separator
        "[kb:disk-full#0]",
        "[kb:disk-full#1234567]",
        "[kb:disk-full#2, prom:bogus]",  # one malformed id spoils the bracket
        "[see kb:disk-full#2]",
    ],
)
def test_what_is_not_one_bracket_of_well_formed_ids_is_no_citation(text):
    assert parse_citation(text) is None


def test_the_guard_reads_citations_loosely_so_a_malformed_id_is_cited_not_overlooked():
    text = (
        f"A [kb:disk-full#2]. B [prom:{HEX}; kb:Bad_Slug#01] C [prom:bogus] [kb:x#1234567] "
        "again [kb:disk-full#2] not [kb:x] not [see kb:a#1] `kb:a#2`"
    )
    cited = ["kb:disk-full#2", f"prom:{HEX}", "kb:Bad_Slug#01", "prom:bogus", "kb:x#1234567"]
    assert cited_ids(text) == cited
    assert cited_ids(None) == [] and cited_ids("") == []


def test_the_guards_citation_pattern_is_unchanged_so_configuration_fingerprints_hold():
    """`agent.runtime.configuration` hashes the pattern of the native kinds into the configuration of
    every run offered no MCP tool: declaring `mcp:` must not move the fingerprint of such a run."""
    old = r"(?:kb:[^\[\]\s,;#]+#\d+|prom:[^\[\]\s,;]+)"
    assert evidence.citation_pattern(evidence.NATIVE_KINDS) == rf"\[\s*({old}(?:\s*[,;]\s*{old})*)\s*\]"
    every = r"(?:kb:[^\[\]\s,;#]+#\d+|prom:[^\[\]\s,;]+|mcp:[^\[\]\s,;]+)"
    assert evidence.CITATION_RE.pattern == rf"\[\s*({every}(?:\s*[,;]\s*{every})*)\s*\]"


def test_an_mcp_result_id_names_its_server_and_digest():
    text = f"mcp:prom/{HEX}"
    assert evidence.parse(text).kind is evidence.MCP_RESULT and evidence.parse(text)["server"] == "prom"
    assert evidence.MCP_RESULT.format(server="prom", digest=HEX) == text
    assert evidence.parse(f"mcp:Prom/{HEX}") is None and evidence.parse("mcp:prom/xyz") is None
    assert cited_ids(f"A [{text}] B [mcp:bogus]") == [text, "mcp:bogus"]  # malformed: cited, refused


def test_id_re_finds_well_formed_ids_in_any_text_but_never_the_head_of_a_longer_one():
    text = f'{{"id": "kb:disk-full#2"}} prom:{HEX}. kb:x#1234567 prom:{HEX}0 kb:a#1]'
    assert evidence.ID_RE.findall(text) == ["kb:disk-full#2", f"prom:{HEX}", "kb:a#1"]
    assert evidence.ID_RE.groups == 0  # findall returns whole ids


def test_the_forms_people_and_models_are_shown():
    assert RUNBOOK_CHUNK.form == "kb:<slug>#<n>" and METRIC_RESULT.form == "prom:<hex>"
    assert evidence.PREFIXES == "(?:kb|prom|mcp)" and evidence.MCP_RESULT.form == "mcp:<server>/<hex>"
    assert evidence.kind_of("kb:Bad#0") is RUNBOOK_CHUNK and evidence.kind_of("mcp:x") is evidence.MCP_RESULT


def test_a_new_kind_is_one_declaration():
    mcp = EvidenceKind(
        prefix="mcp",
        label="tool",
        noun="MCP tool result",
        parts=(Part("server", SLUG_PATTERN), Part("digest", evidence.HEX_PATTERN)),
        layout="{server}/{digest}",
        placeholder="<server>/<hex>",
        loose=r"[^\[\]\s,;]+",
    )
    assert mcp.form == "mcp:<server>/<hex>"
    assert mcp.format(server="grafana", digest=HEX) == f"mcp:grafana/{HEX}"
    parsed = mcp.parse(f"mcp:grafana/{HEX}")
    assert parsed is not None and parsed["server"] == "grafana" and parsed["digest"] == HEX
    assert mcp.parse(f"mcp:Grafana/{HEX}") is None and mcp.parse("mcp:grafana/0123") is None
    assert re.fullmatch(mcp.pattern, f"mcp:grafana/{HEX}")


@pytest.mark.parametrize("layout", ["{slug}", "{slug}#{ordinal}#{slug}", "{slug}#{n}"])
def test_a_kind_whose_layout_does_not_name_each_part_once_is_refused(layout):
    with pytest.raises(ValueError):
        EvidenceKind(
            prefix="kb",
            label="runbook",
            noun="runbook chunk",
            parts=RUNBOOK_CHUNK.parts,
            layout=layout,
            placeholder="",
            loose=".+",
        )


def test_the_prompts_and_tool_descriptions_show_only_declared_forms():
    """The instructions keep their literal examples (their digests are part of every recorded
    configuration); each one is a declared kind's form or an id that parses."""
    from agent.runtime import prompts
    from agent.runtime.tools.registry import FLOW_AI_OPS, FLOW_CHAT, default_registry

    texts = [value for value in vars(prompts).values() if isinstance(value, str)]
    for flow in (FLOW_CHAT, FLOW_AI_OPS):
        texts += [tool["function"]["description"] for tool in default_registry(flow=flow).openai_tools()]
    shown = set(re.findall(rf"\[({evidence.PREFIXES}:[^\]\s]*)\]", " ".join(texts)))
    assert {"kb:<slug>#<n>", "prom:<hex>", "kb:disk-full-var-log#2"} <= shown
    for form in shown:
        kind = evidence.kind_of(form)
        assert parse(form) is not None or form.startswith(f"{kind.prefix}:<"), form
