"""The `demo` provider: a deterministic offline model behind the same `ModelClient` interface.

Used when no API key is configured (`LLM_PROVIDER=demo`), so every layer (router, agent loop, tools,
guards, release, audit) runs for real offline. Nothing is canned per question: `demo-router`,
`demo-agent` (and the AI Ops planner and executor) and `demo-guard` compute their answers from the
conversation they receive, cite only ids a tool returned, stream through `on_text`, and report a short
reasoning text and a self-counted usage. Its runs are labelled demo wherever they are shown.
Modules: `text`, `answers`, `aiops`, `client` (`DemoModelClient`).
Details: docs/runtime.md, *The demo provider*; docs/aiops.md, *Offline*.
"""

from agent.runtime.demo.aiops import aiops_execute, aiops_plan, alert_facts, silence_minutes
from agent.runtime.demo.answers import (
    DEMO_QUESTIONS,
    answer_from_evidence,
    check_claims,
    no_evidence_answer,
    route,
)
from agent.runtime.demo.client import DELTA_DELAY_SECONDS, DemoModelClient
from agent.runtime.demo.text import content_tokens, count_tokens

__all__ = [
    "DELTA_DELAY_SECONDS",
    "DEMO_QUESTIONS",
    "DemoModelClient",
    "aiops_execute",
    "aiops_plan",
    "alert_facts",
    "answer_from_evidence",
    "check_claims",
    "content_tokens",
    "count_tokens",
    "no_evidence_answer",
    "route",
    "silence_minutes",
]
