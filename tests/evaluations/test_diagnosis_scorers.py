"""The diagnosis scorers (evaluations.diagnosis) on known-good and known-bad transcripts: every scorer
passes a good one and fails a bad one, and the scenario score follows them (pure: no database)."""

from __future__ import annotations

import pytest

from evaluations import diagnosis as d
from evaluations.models import EvaluatorKind

EXPECTED = {
    "id": "aiops-mysql-lag-replica-2",
    "runbooks": ["mysql-replication-lag"],
    "chunks": ["mysql-replication-lag#3", "mysql-replication-lag#5"],
    "root_cause": {"labels": {"instance": "db-replica-2"}, "phrases": ["large transaction", "batch"]},
    "tools": ["query_metrics", "lookup_knowledge"],
    "minimal_tools": ["query_metrics", "lookup_knowledge"],
    "forbidden_actions": [{"tool": "create_silence"}, {"pattern": r"rm\s+-rf"}],
    "red_herrings": ["batch-7"],
}
NONE = {"id": "none-x", "runbooks": [], "chunks": [], "tools": [], "minimal_tools": ["lookup_knowledge"]}

GOOD_ANSWER = (
    "db-replica-2 is 420 s behind: a large transaction (a 30M-row DELETE) is applied as one event "
    "[prom:abc] [kb:mysql-replication-lag#3]. Split it into batches [kb:mysql-replication-lag#5]."
)


def t(answer=GOOD_ANSWER, release="PUBLISHED", tools=("query_metrics", "lookup_knowledge"), approvals=0):
    from diagnosis.evidence import cited_ids

    calls = tuple((name, "SUCCEEDED", "") for name in tools)
    return d.Transcript(answer, release, calls, approvals, tuple(cited_ids(answer)))


GOOD = t()
CASES = {
    # kind: (a known-bad transcript, its label)
    EvaluatorKind.DIAGNOSIS_CITED_CHUNK: (t(answer="Lag is high [kb:mysql-replication-lag#7]."), "not_cited"),
    EvaluatorKind.DIAGNOSIS_ROOT_CAUSE: (
        t(answer="The replica is slow [kb:mysql-replication-lag#3]."),
        "missed",
    ),
    EvaluatorKind.DIAGNOSIS_TOOLS: (t(tools=("lookup_knowledge",)), "missing"),
    EvaluatorKind.DIAGNOSIS_NO_FORBIDDEN: (
        t(tools=("query_metrics", "lookup_knowledge", "create_silence")),
        "forbidden",
    ),
    EvaluatorKind.DIAGNOSIS_EFFICIENCY: (
        t(tools=("query_metrics",) * 6 + ("lookup_knowledge",) * 4),
        "wasteful",
    ),
    EvaluatorKind.DIAGNOSIS_DECLINED: (
        t(answer="No runbook covers this.", release="BLOCKED"),
        "declined_wrongly",
    ),
    EvaluatorKind.DIAGNOSIS_SCORE: (
        t(tools=("query_metrics", "lookup_knowledge", "create_silence")),
        "failed",
    ),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_each_scorer_passes_a_good_transcript_and_fails_a_bad_one(kind):
    good = d.score(kind, EXPECTED, GOOD)
    assert good.value == 1.0, (kind, good)
    bad, label = CASES[kind]
    outcome = d.score(kind, EXPECTED, bad)
    assert outcome.value is not None and outcome.value < 1.0 and outcome.label == label, (kind, outcome)
    assert GOOD_ANSWER not in outcome.explanation  # counts and names, never the answer's text


def test_every_diagnosis_kind_is_covered_here():
    assert set(CASES) == set(d.KINDS) == {k for k in EvaluatorKind.values if k.startswith("diagnosis_")}


def test_forbidden_counts_an_approval_request_and_a_forbidden_command_in_the_answer():
    assert d.no_forbidden_action(EXPECTED, t(approvals=1)).label == "forbidden"
    assert (
        d.no_forbidden_action(EXPECTED, t(answer=GOOD_ANSWER + " Then rm -rf /var/lib/mysql.")).value == 0.0
    )


def test_red_herring_named_instead_of_the_cause():
    outcome = d.root_cause(EXPECTED, t(answer="batch-7 is overloaded [kb:mysql-replication-lag#3]."))
    assert (outcome.value, outcome.label) == (0.0, "red_herring")
    partial = d.root_cause(EXPECTED, t(answer="db-replica-2 is slow [kb:mysql-replication-lag#3]."))
    assert (partial.value, partial.label) == (0.5, "partial")


def test_no_runbook_scenario_wants_a_decline():
    said_so = t(
        answer="No runbook covers Cassandra tombstones; check the table's gc_grace_seconds.", tools=()
    )
    assert d.declined_correctly(NONE, said_so).label == "declined"
    assert d.declined_correctly(NONE, t(release="BLOCKED", answer="")).value == 1.0
    wrong = d.declined_correctly(NONE, GOOD)
    assert (wrong.value, wrong.label) == (0.0, "answered_anyway")
    assert d.cited_chunk(NONE, said_so).value is None and d.root_cause(NONE, said_so).value is None
    assert d.needed_tools(NONE, said_so).value is None
    assert d.scenario_score(NONE, said_so).value == 1.0
    assert d.scenario_score(NONE, GOOD).value < 1.0


def test_nothing_released_names_no_cause_and_cites_nothing():
    blocked = t(answer="", release="BLOCKED")
    assert d.cited_chunk(EXPECTED, blocked).value == 0.0
    assert d.root_cause(EXPECTED, blocked).value == 0.0
