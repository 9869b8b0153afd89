"""`read_runbook(id, around=1)`: read one runbook section by its evidence id `kb:<slug>#<n>`, with the
sections just before and after it, so the agent can follow a procedure past the chunk a search returned
(a search item is one section, cut at `EVIDENCE_TEXT_CHARS`).

Each section returned is a citable evidence record under its own id, exactly as `lookup_knowledge` would
return it (same id, same bounded text), so the guards treat both tools' evidence alike. An id whose runbook
or section does not exist fails the call (`TOOL_ERROR`, "UnknownEvidenceId: …", recorded like any tool
error), never a guess. Offered to the chat and to AI Ops analyses.
"""

from __future__ import annotations

import json

from agent.knowledge.retrieval import EVIDENCE_TEXT_CHARS, overridden_sections
from agent.runtime.tools.registry import FLOW_AI_OPS, FLOW_CHAT, EvidenceRecord, ToolResult, register_tool
from diagnosis.evidence import RUNBOOK_CHUNK
from diagnosis.models import KnowledgeChunk

AROUND_MAX = 2


class UnknownEvidenceId(LookupError):
    """No runbook section has this id: the call fails as TOOL_ERROR naming this class."""


@register_tool(
    name="read_runbook",
    description=(
        f"Read a runbook section by its evidence id {RUNBOOK_CHUNK.form} (as lookup_knowledge returned it), "
        "with the sections just before and after it, to follow a procedure to its end. Cite the ids you "
        f"use as [{RUNBOOK_CHUNK.form}]."
    ),
    parameters={
        "type": "object",
        "properties": {
            "id": {
                "type": "string",
                "minLength": 6,
                "maxLength": 120,
                "description": "An evidence id, e.g. kb:disk-full#2.",
            },
            "around": {
                "type": "integer",
                "minimum": 0,
                "maximum": AROUND_MAX,
                "default": 1,
                "description": "How many sections before and after it to include as well.",
            },
        },
        "required": ["id"],
        "additionalProperties": False,
    },
    flows=(FLOW_CHAT, FLOW_AI_OPS),
)
def read_runbook(id: str, around: int = 1) -> ToolResult:
    parsed = RUNBOOK_CHUNK.parse(id.strip()) if isinstance(id, str) else None
    if parsed is None:
        raise UnknownEvidenceId(f"{id!r} is not an evidence id of the form {RUNBOOK_CHUNK.form}")
    slug, ordinal = parsed["slug"], parsed["ordinal"]
    # An experiment's candidate runbook folder replaces the knowledge base (`agent.knowledge.corpus`).
    sections = overridden_sections(slug, ordinal - around, ordinal + around)
    if sections is None:
        sections = [
            (c.ordinal, c.document.title, c.heading, c.text)
            for c in KnowledgeChunk.objects.filter(
                document__slug=slug, ordinal__gte=ordinal - around, ordinal__lte=ordinal + around
            )
            .select_related("document")
            .order_by("ordinal")
        ]
    if not any(n == ordinal for n, *_rest in sections):
        raise UnknownEvidenceId(f"no runbook section {id} exists")
    items = [
        {
            "id": RUNBOOK_CHUNK.format(slug=slug, ordinal=n),
            "slug": slug,
            "title": title,
            "heading": heading,
            "text": text[:EVIDENCE_TEXT_CHARS],
        }
        for n, title, heading, text in sections
    ]
    data = {
        "id": parsed.text,
        "around": around,
        "items": items,
        "isTruncated": any(len(text) > EVIDENCE_TEXT_CHARS for *_rest, text in sections),
    }
    model_view = {"evidence": items, "note": f"Cite the ids you rely on as [{RUNBOOK_CHUNK.form}]."}
    return ToolResult(
        data=data,
        evidence=[EvidenceRecord(id=item["id"], payload=item) for item in items],
        model_content=json.dumps(model_view, ensure_ascii=False),
    )
