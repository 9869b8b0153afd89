"""One grammar of evidence ids for every reader (issue 44 item 5): the evidence guard, `read_runbook` and
the judge accept and refuse the same ids, because all three read them through `diagnosis.evidence`.

The knowledge base holds each section a lenient reader would find (`disk-full` chunks 1, 2, 999999 and
1000000), so an id is refused by its form, never by a missing row: before, the judge read
`kb:disk-full#01` and `kb:disk-full#١` as chunk 1 (and `kb:DISK-FULL#1` on MariaDB's case-insensitive
collation) while `read_runbook` refused them, and the guard passed any id its store held."""

from __future__ import annotations

import itertools

import pytest

from agent.runtime.canonical import CanonicalStore
from agent.runtime.guards import check_evidence
from agent.runtime.tools.read_runbook import UnknownEvidenceId, read_runbook
from diagnosis.models import KnowledgeChunk, KnowledgeDocument
from evaluations.judge import evidence_text

pytestmark = pytest.mark.django_db

HEX = "0123456789abcdef"
HEADING = "Section"
_runs = itertools.count()


@pytest.fixture
def runbook(db):
    document = KnowledgeDocument.objects.create(
        slug="disk-full", title="Disk full", body="(sections below)", content_sha256="0" * 64
    )
    for ordinal in (1, 2, 999_999, 1_000_000):
        KnowledgeChunk.objects.create(
            document=document, ordinal=ordinal, heading=HEADING, text=f"text {ordinal}"
        )
    return document


def guard_accepts(evidence_id: str) -> bool:
    """The guard passes an answer citing `[id]` whose run's store holds that id as a tool minted it."""
    store = CanonicalStore(f"run_evidence_ids_{next(_runs)}")
    cited = evidence_id.strip()
    if not any(ch.isspace() for ch in cited):  # an id with a blank inside is never extracted to look up
        store.put_result(tool_call_id="c1", result_json="{}", evidence={cited: {"id": cited, "text": "t"}})
    verdict = check_evidence(text=f"The claim [{evidence_id}].", store=store, required=True)
    return verdict.passed and verdict.cited == (cited,)


def read_runbook_accepts(evidence_id: str) -> bool:
    try:
        result = read_runbook(id=evidence_id, around=0)
    except UnknownEvidenceId:
        return False
    return result.data["id"] == evidence_id.strip()


def judge_accepts(evidence_id: str) -> bool:
    """The judge quotes the cited chunk (a runbook id) or names the metric result (a `prom:` id)."""
    text = evidence_text(f"The claim [{evidence_id}].")
    cited = evidence_id.strip()
    if cited.startswith("prom:"):
        return text == f"[{cited}] (metric evidence, not quoted)"
    return text.startswith(f"[{cited}] {HEADING}: text ")


RUNBOOK_READERS = {"guard": guard_accepts, "read_runbook": read_runbook_accepts, "judge": judge_accepts}
METRIC_READERS = {"guard": guard_accepts, "judge": judge_accepts}  # read_runbook reads runbooks only


@pytest.mark.parametrize(
    ("evidence_id", "accepted"),
    [
        ("kb:disk-full#1", True),
        ("kb:disk-full#2", True),
        ("kb:disk-full#999999", True),  # the largest ordinal: six digits
        (" kb:disk-full#2", True),  # blanks around an id: `[ id ]` is a citation, a tool argument is stripped
        ("kb:disk-full#2\n", True),
        ("kb:disk-full#0", False),
        ("kb:disk-full#01", False),
        ("kb:disk-full#1000000", False),  # seven digits, although the row exists
        ("kb:DISK-FULL#1", False),
        ("kb:Disk-full#1", False),
        ("kb:disk-full#١", False),  # Arabic-Indic one
        ("kb:disk-full#１", False),  # fullwidth one
        ("kb:ｄisk-full#1", False),  # fullwidth d
        ("kb:disk‐full#1", False),  # U+2010 hyphen
        ("kb:disk full#1", False),
        ("kb:disk-full# 1", False),
        ("kb:disk-full#1]", False),
        ("[kb:disk-full#1", False),
        ("kb:disk-full", False),
        ("kb:#1", False),
        ("kb:disk--full#1", False),
    ],
)
def test_the_guard_read_runbook_and_the_judge_agree_on_runbook_ids(runbook, evidence_id, accepted):
    verdicts = {name: accepts(evidence_id) for name, accepts in RUNBOOK_READERS.items()}
    assert verdicts == dict.fromkeys(RUNBOOK_READERS, accepted)


@pytest.mark.parametrize(
    ("evidence_id", "accepted"),
    [
        (f"prom:{HEX}", True),
        (f"prom:{HEX.upper()}", False),
        ("prom:0123", False),
        (f"prom:{HEX}0", False),
        ("prom:bogus", False),
        ("prom:０123456789abcdef", False),
    ],
)
def test_the_guard_and_the_judge_agree_on_metric_ids(runbook, evidence_id, accepted):
    verdicts = {name: accepts(evidence_id) for name, accepts in METRIC_READERS.items()}
    assert verdicts == dict.fromkeys(METRIC_READERS, accepted)
    if not accepted:
        assert evidence_text(f"[{evidence_id}]") == f"[{evidence_id}] (not an evidence id)"


@pytest.mark.parametrize("evidence_id", [f"prom:{HEX}", "kb:disk-full#1"])
def test_read_runbook_refuses_every_other_kind_by_its_form(runbook, evidence_id):
    if evidence_id.startswith("kb:"):
        assert read_runbook(id=evidence_id, around=0).data["id"] == evidence_id
    else:
        with pytest.raises(UnknownEvidenceId, match="is not an evidence id of the form kb:<slug>#<n>"):
            read_runbook(id=evidence_id, around=0)
