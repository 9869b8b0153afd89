"""The run shape B0 records through the peers (no Django, no project imports: MLflow's venv runs it too).

One run of B1's workload as a tracer would record it: a root span for the run, the router's call, the
four model steps, the three tool calls, the two guards and the release — 12 spans — carrying the 23
timeline events as span events and attributes of the sizes the recorder stores (the reasoning preview,
the model input, the tools' inputs, output previews of 480 characters and retrieval facts, token usage).
"""

from __future__ import annotations

import json

REASONING = (
    "The lag pattern suggests a long transaction holding the SQL thread; check the relay log position "
    "against the source and look for a large DELETE without an index. "
) * 3
ANSWER = "Replication lags because of a long transaction [kb:mysql-replication-lag#1]."
TOOL_OUTPUT_PREVIEW = ("Seconds_Behind_Source grows while the SQL thread applies a 2 GB transaction. " * 7)[
    :480
]
MODEL_INPUT = json.dumps(
    [
        {"role": "system", "content": "You diagnose database incidents. Cite the runbooks."[:500]},
        {"role": "user", "content": "Why is MySQL replication lagging on the replica?"},
    ]
)


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def spans(run_no: int) -> list[dict]:
    """The run's spans, parents first: name, kind, parent index (None: the root), attributes, events
    (name, attributes)."""
    out: list[dict] = [
        {
            "name": "diagnosis_run",
            "kind": "CHAIN",
            "parent": None,
            "attributes": {"run.id": f"b0-{run_no}", "query": "Why is MySQL replication lagging?"},
            "events": [("RUN_STARTED", {"agentFlow": "DIAGNOSIS_AGENT"})],
        },
        {
            "name": "router",
            "kind": "LLM",
            "parent": 0,
            "attributes": {"model": "router-m", "input": MODEL_INPUT, **_usage(300, 20)},
            "events": [
                ("ROUTING_ATTEMPT", {"attempt": 1, "ok": True}),
                ("MODEL_TOKEN_USAGE", _usage(300, 20)),
                ("ROUTING_DECISION", {"intent": "DIAGNOSIS", "confidence": 0.92}),
            ],
        },
    ]
    for step in range(1, 5):
        out.append(
            {
                "name": f"model_step_{step}",
                "kind": "LLM",
                "parent": 0,
                "attributes": {
                    "model": "agent-m",
                    "input": MODEL_INPUT,
                    "reasoning.preview": REASONING[:500],
                    "finish_reason": "tool_calls" if step == 1 else "stop",
                    **_usage(800 + step * 100, 60),
                },
                "events": [("AGENT_MODEL_STEP", {"stepIndex": step}), ("MODEL_TOKEN_USAGE", _usage(800, 60))],
            }
        )
    for i in range(3):
        out.append(
            {
                "name": "lookup_knowledge",
                "kind": "TOOL",
                "parent": 2,
                "attributes": {
                    "tool.call_id": f"call_{i}",
                    "input": json.dumps({"query": f"replication lag cause {i}", "top_k": 5}),
                    "output.preview": TOOL_OUTPUT_PREVIEW,
                    "output.length": 980,
                    "retrieval": json.dumps({"layer": "L1", "l0": 3, "l1": 2, "ids": ["kb:a#1", "kb:b#2"]}),
                },
                "events": [
                    ("TOOL_INVOCATION", {"status": "RUNNING"}),
                    ("TOOL_INVOCATION", {"status": "SUCCEEDED"}),
                ],
            }
        )
    out += [
        {
            "name": "evidence_guard",
            "kind": "GUARDRAIL",
            "parent": 0,
            "attributes": {"passed": True, "cited": "kb:mysql-replication-lag#1"},
            "events": [("EVIDENCE_GUARD", {"passed": True})],
        },
        {
            "name": "semantic_guard",
            "kind": "LLM",
            "parent": 0,
            "attributes": {"model": "guard-m", "verdict": "SUPPORTED", **_usage(400, 10)},
            "events": [("SEMANTIC_GUARD", {"verdict": "SUPPORTED"}), ("MODEL_TOKEN_USAGE", _usage(400, 10))],
        },
        {
            "name": "release",
            "kind": "CHAIN",
            "parent": 0,
            "attributes": {"decision": "PUBLISHED", "content": ANSWER},
            "events": [
                ("RELEASE_DECISION", {"decision": "PUBLISHED"}),
                ("RUN_FINISHED", {"status": "SUCCESS"}),
            ],
        },
    ]
    return out


SPANS_PER_RUN = len(spans(0))
EVENTS_PER_RUN = sum(len(s["events"]) for s in spans(0))
