"""The `demo` provider: a deterministic offline model behind the same `ModelClient` interface.

Used when no API key is configured (`LLM_PROVIDER=demo`), so the product works out of the box and every
layer (router, agent loop, tools, guards, release, audit) runs for real. Nothing here is canned per
question; each role computes its answer from the conversation it receives:

* `demo-router` classifies the message with keyword heuristics (greetings, off-topic subjects, how-to
  phrasing, symptom words) and answers the router's JSON.
* `demo-agent`, with tools offered and no tool result yet in this turn, calls `lookup_knowledge` with the
  question. Once results are in, it writes a short answer from the evidence text: the sentences and
  commands that share the most terms with the question, each followed by its `[kb:<slug>#<n>]`. Evidence
  sharing too few terms with the question is ignored; with none left it answers without a citation, which
  the evidence guard blocks. Small talk and off-topic requests get a short reply without tools.
* AI Ops analyses (`agent.runtime.aiops`, recognised by their system prompts, `prompts.role_of`):
  as the planner it writes a plan grounded on the alert text (the alert's name and expression, with the
  tools the prompt lists); as the executor it first calls `list_alerts` and `query_metrics` (the alert's
  expression, else `ALERTS{alertname=…}`) when they are offered, then `lookup_knowledge` with the alert
  text, revises the plan (a ```plan block) when a tool failed, and writes the report from what the tools
  returned: metric sentences cited with the `prom:` ids of the results it got, runbook sentences cited
  with their `kb:` ids (never an id no tool returned), and a stated `Confidence:` line.
* `demo-guard` splits the answer into sentences and checks that each claim's words occur in the evidence
  it cites (word overlap), then answers the guard's JSON.

Modules: `text` (token counts, shared terms, sentences), `answers` (router, chat agent and guard),
`aiops` (planner and executor), `client` (`DemoModelClient`). Each call reports a short reasoning text
(as a provider's `reasoning_content` would be) and a usage it counts itself (latin words, CJK characters
and punctuation marks are one token each). Visible text is streamed in small pieces through the same
`on_text` path as a real provider.
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
