"""The evidence guard (citations proven against the canonical store) and the semantic guard's verdict.

Answers cite evidence as `[kb:<slug>#<n>]` (a runbook chunk, `lookup_knowledge`) or `[prom:<hex>]` (a
Prometheus query result, `query_metrics`); several ids in one bracket, of either kind, separated by
commas or semicolons, are accepted. Both kinds, their grammar and the citation pattern are declared once,
in `diagnosis.evidence`. Ids are extracted in a deliberately loose form (`prom:` followed by any
characters but brackets, blanks, `,` and `;`), so a malformed id counts as cited and is refused as
unknown instead of being overlooked: a cited id that `diagnosis.evidence.parse` does not read as well
formed is unknown even if the store held it. The evidence guard requires, for a DIAGNOSIS or KNOWLEDGE
answer (and an AI Ops report), at least one citation (else NO_CITATION) and every cited id, of either
kind, to be present in this run's canonical store (else UNKNOWN_CITATION). When the store cannot be read, or a
write to it failed earlier in the run and a cited id is missing (it may be one that was lost), the
reason is CANONICAL_UNAVAILABLE: the evidence cannot be proven, so the release is blocked (fail-closed).

The semantic guard model answers `{"supported": bool, "unsupportedClaims": [str], "reason": str}`;
`parse_semantic_verdict` accepts it bare or wrapped in prose/fences, and anything else is unusable
(`supported=None`), which the release treats as not supported. `guard_evidence` gives that model each
cited item as id, title, heading and text, the text cut at `GUARD_TEXT_CHARS` (a metric result's text is
the readable account `agent.aiops.prometheus` wrote into its payload, never the raw series).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.runtime.canonical import CanonicalStore, CanonicalUnavailable
from agent.runtime.llm import parse_json_object
from audit.payloads import clip
from diagnosis.evidence import CITATION_RE as CITATION_RE  # the configuration fingerprint hashes it
from diagnosis.evidence import cited_ids, parse

NO_CITATION = "NO_CITATION"
UNKNOWN_CITATION = "UNKNOWN_CITATION"
CANONICAL_UNAVAILABLE = "CANONICAL_UNAVAILABLE"

GUARD_TEXT_CHARS = 4000


def extract_citations(text: str | None) -> list[str]:
    """Cited evidence ids in order of first appearance, without repeats (`diagnosis.evidence.cited_ids`)."""
    return cited_ids(text)


@dataclass(frozen=True, slots=True)
class EvidenceVerdict:
    passed: bool
    required: bool
    reasons: tuple[str, ...] = ()
    cited: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    evidence: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def repairable(self) -> bool:
        """A repair round can fix missing or unknown citations, never an unavailable store."""
        return not self.passed and CANONICAL_UNAVAILABLE not in self.reasons


def check_evidence(
    *, text: str, store: CanonicalStore, required: bool, store_degraded: bool = False
) -> EvidenceVerdict:
    """Synchronous (reads the canonical store); see the module docstring."""
    cited = extract_citations(text)
    if not required:
        return EvidenceVerdict(passed=True, required=False, cited=tuple(cited))
    if not cited:
        return EvidenceVerdict(passed=False, required=True, reasons=(NO_CITATION,))
    try:
        found = store.get_evidence(cited)
    except CanonicalUnavailable:
        return EvidenceVerdict(
            passed=False, required=True, reasons=(CANONICAL_UNAVAILABLE,), cited=tuple(cited)
        )
    unknown = tuple(i for i in cited if i not in found or parse(i) is None)
    if not unknown:
        return EvidenceVerdict(passed=True, required=True, cited=tuple(cited), evidence=found)
    reason = CANONICAL_UNAVAILABLE if store_degraded else UNKNOWN_CITATION
    return EvidenceVerdict(
        passed=False, required=True, reasons=(reason,), cited=tuple(cited), unknown=unknown, evidence=found
    )


@dataclass(frozen=True, slots=True)
class SemanticVerdict:
    supported: bool | None
    unsupported_claims: tuple[str, ...] = ()
    reason: str = ""
    error: str = ""


def parse_semantic_verdict(text: str | None) -> SemanticVerdict:
    data = parse_json_object(text)
    if data is None:
        return SemanticVerdict(supported=None, error="guard answer is not a JSON object")
    supported = data.get("supported")
    if not isinstance(supported, bool):
        return SemanticVerdict(supported=None, error="guard answer has no boolean 'supported'")
    claims = data.get("unsupportedClaims", data.get("unsupported_claims", []))
    if not isinstance(claims, list):
        claims = []
    reason = data.get("reason")
    return SemanticVerdict(
        supported=supported,
        unsupported_claims=tuple(str(c) for c in claims if c is not None)[:20],
        reason=reason if isinstance(reason, str) else "",
    )


def guard_evidence(evidence: dict[str, dict[str, Any]], cited: Sequence[str]) -> list[dict[str, Any]]:
    """The cited evidence as the guard model reads it (id, title, heading, text), in citation order."""
    items = []
    for evidence_id in cited:
        payload = evidence.get(evidence_id)
        if payload is None:
            continue
        items.append(
            {
                "id": evidence_id,
                "title": payload.get("title", ""),
                "heading": payload.get("heading", ""),
                "text": clip(str(payload.get("text", "")), GUARD_TEXT_CHARS),
            }
        )
    return items
