"""`[prom:<hex>]` citations: extracted by the evidence guard in any form (so a malformed one is refused,
not overlooked), rendered as a chip that is not a link (escaped, beside kb links in one bracket), and
handed to the semantic guard as bounded readable text."""

from __future__ import annotations

from agent.runtime.guards import GUARD_TEXT_CHARS, extract_citations, guard_evidence
from surfaces.answers import render_answer

PROM = "prom:0123456789abcdef"


def test_the_guard_extracts_prom_ids_alone_and_mixed_with_kb_ids():
    text = f"Load is high [{PROM}]. See [kb:disk-full#2; {PROM}] and [prom:bogus, kb:x#1] [prom:]."
    assert extract_citations(text) == [PROM, "kb:disk-full#2", "prom:bogus", "kb:x#1"]
    assert extract_citations(f"`code` not a bracket {PROM}") == []


def test_prom_citations_render_as_chips_beside_runbook_links():
    html = render_answer(f"Up [{PROM}; kb:disk-full#2].")
    assert f'<code class="citation citation-metric">{PROM}</code>; ' in html
    assert '<a class="citation" href="/knowledge/disk-full/?chunk=2#chunk-2"' in html
    assert f'<a class="citation" href="/knowledge/{PROM}' not in html


def test_only_well_formed_prom_ids_become_chips_and_code_stays_literal():
    html = render_answer(f"[prom:<script>] [prom:0123] `[{PROM}]` [{PROM}<b>]")
    assert "citation-metric" not in html
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert f"<code>[{PROM}]</code>" in html


def test_the_semantic_guard_gets_a_metric_result_as_bounded_text():
    payload = {"title": "Prometheus instant query", "heading": "up", "text": "x" * (GUARD_TEXT_CHARS * 3)}
    [item] = guard_evidence({PROM: payload, "kb:a#1": {"text": "t"}}, [PROM])
    assert item["id"] == PROM and item["title"] == "Prometheus instant query" and item["heading"] == "up"
    assert len(item["text"]) <= GUARD_TEXT_CHARS
    assert set(item) == {"id", "title", "heading", "text"}  # never the raw series
