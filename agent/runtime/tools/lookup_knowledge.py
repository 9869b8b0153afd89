"""`lookup_knowledge(query, top_k=5)`: search the operations runbooks (L0 metadata + L1 BM25).

Wraps `agent.knowledge.retrieval.search_knowledge`. The full result (every item with its text, the
layers, counts and details) is the tool's canonical data; each item is a citable evidence record under
its id `kb:<slug>#<n>`; the retrieval facts (layer, L0/L1 match counts, details, truncation) go onto the
tool invocation. The model sees the items' ids, titles, headings, scores and text, and a reminder of
the citation format. Offered to the chat and to AI Ops analyses.
"""

from __future__ import annotations

import json

from agent.knowledge.retrieval import search_knowledge
from agent.runtime.tools.registry import FLOW_AI_OPS, FLOW_CHAT, EvidenceRecord, ToolResult, register_tool
from audit.write import RetrievalFacts
from diagnosis.evidence import RUNBOOK_CHUNK

QUERY_MAX_CHARS = 500
TOP_K_MAX = 10


@register_tool(
    name="lookup_knowledge",
    description=(
        "Search the team's operations runbooks (English and Chinese) for evidence about a symptom, error "
        f"message, component or procedure. Returns evidence items with ids like {RUNBOOK_CHUNK.form}; cite "
        f"the ids you use as [{RUNBOOK_CHUNK.form}]."
    ),
    parameters={
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "minLength": 1,
                "maxLength": QUERY_MAX_CHARS,
                "description": "What to look for: symptoms, error messages, component names.",
            },
            "top_k": {
                "type": "integer",
                "minimum": 1,
                "maximum": TOP_K_MAX,
                "default": 5,
                "description": "How many evidence items to return.",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    flows=(FLOW_CHAT, FLOW_AI_OPS),
)
def lookup_knowledge(query: str, top_k: int = 5) -> ToolResult:
    result = search_knowledge(query, top_k)
    items = [item.as_dict() for item in result.items]
    data = {
        "query": query,
        "topK": top_k,
        "layer": result.layer,
        "l0MatchCount": result.l0_match_count,
        "l1MatchCount": result.l1_match_count,
        "isTruncated": result.is_truncated,
        "details": result.details,
        "items": items,
    }
    model_view = {
        "query": query,
        "evidence": [
            {
                "id": item["id"],
                "title": item["title"],
                "heading": item["heading"],
                "score": item["score"],
                "text": item["text"],
            }
            for item in items
        ],
        "note": (
            f"Cite the ids you rely on as [{RUNBOOK_CHUNK.form}]."
            if items
            else "No runbook matched this query; try other words, or say the runbooks do not cover it."
        ),
    }
    return ToolResult(
        data=data,
        evidence=[EvidenceRecord(id=item["id"], payload=item) for item in items],
        retrieval=RetrievalFacts(
            layer=result.layer,
            l0_match_count=result.l0_match_count,
            l1_match_count=result.l1_match_count,
            details=result.details,
            is_truncated=result.is_truncated,
        ),
        model_content=json.dumps(model_view, ensure_ascii=False),
    )
