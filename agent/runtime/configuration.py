"""The effective configuration of a run, and its fingerprint (issue 34, item 1).

`effective_configuration(client=…, registry=…, flow=…, release_mode=…, prompts=…, knowledge=…)` is built
by the executor from the very objects the run then uses (models, the tools offered and their schemas,
those left out and why, instruction texts, the knowledge snapshot, guard settings, release policy).
Its `document` holds digests, ids and numbers only, never a prompt's text, a secret or the provider's
URL; `fingerprint` is the SHA-256 of its canonical JSON, equal for equal configurations. It is chained
in RUN_STARTED, copied to the run row and kept once per fingerprint in `diagnosis.RunConfiguration`.
Details: docs/runtime.md, *Configuration fingerprint (`configuration.py`)*.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection

from agent.knowledge.retrieval import EVIDENCE_TEXT_CHARS, KnowledgeSnapshot, knowledge_snapshot
from agent.mcp.config import servers as mcp_servers
from agent.runtime import guards, prompts
from agent.runtime.llm import ModelClient
from agent.runtime.prompts import DEFAULT_PROMPTS, SystemPrompts
from agent.runtime.router import ROUTER_MAX_ATTEMPTS
from agent.runtime.tools.registry import FLOW_AI_OPS, ToolRegistry
from audit.models import EventType, TraceEvent
from audit.payloads import canonical_json
from diagnosis import services
from diagnosis.evidence import KINDS, NATIVE_KINDS, citation_pattern

logger = logging.getLogger(__name__)

# Bumped when the document's shape changes (a new part, a renamed key): the fingerprint then changes
# for every run, which is right, since what it covers changed.
CONFIGURATION_VERSION = 1

# The instruction texts each flow sends, by the key the document names them with.
_CHAT_PROMPTS = {
    "router": "router",
    "routerRetry": "router_retry",
    "agent": "agent",
    "chitchat": "chitchat",
    "outOfScope": "out_of_scope",
    "repair": "repair",
    "guard": "guard",
}
_AIOPS_PROMPTS = {
    "planner": "planner",
    "executor": "executor",
    "reportRepair": "report_repair",
    "guard": "guard",
}


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class EffectiveConfiguration:
    """A run's configuration: `document` (JSON-ready), its canonical JSON and that JSON's SHA-256."""

    document: dict[str, Any]
    canonical: str
    fingerprint: str

    @property
    def short(self) -> str:
        return short_fingerprint(self.fingerprint)


def short_fingerprint(fingerprint: str) -> str:
    """The first 12 hexadecimal digits, as lists show a fingerprint ("" stays "")."""
    return (fingerprint or "")[:12]


def fingerprint_of(document: Mapping[str, Any]) -> str:
    """The fingerprint of a configuration document: SHA-256 of its canonical JSON."""
    return sha256_text(canonical_json(document))


def tool_digests(registry: ToolRegistry) -> dict[str, str]:
    """Each offered tool's digest: SHA-256 of the canonical JSON of its schema as the model receives
    it (name, description, parameters)."""
    return {spec["function"]["name"]: sha256_text(canonical_json(spec)) for spec in registry.openai_tools()}


def mcp_part(registry: ToolRegistry) -> dict[str, Any]:
    """`tools.mcp` of a run offered MCP tools (else empty, so other runs' documents are unchanged): the
    servers whose tools (`<server>__<tool>`) it was offered, which of those wait for a person's approval,
    and how each server is reached (`transports`, and an HTTP server's host in `addresses` and port in
    `ports`: the spans' MCP attributes, docs/mcp.md). Flat lists and maps of scalars: the chained details
    keep them whole (a deeper object would be summarised)."""
    specs = [registry.get(name) for name in registry.names()]
    mcp = [s for s in specs if s is not None and s.origin.startswith("mcp:")]
    if not mcp:
        return {}
    servers = sorted({s.origin[4:] for s in mcp})
    configs = {c.name: c for c in mcp_servers()}
    endpoints = {name: configs[name].endpoint() for name in servers if name in configs}
    part: dict[str, Any] = {
        "servers": servers,
        "approval": [s.name for s in mcp if s.requires_approval],
        "transports": {name: e["transport"] for name, e in endpoints.items()},
    }
    http = {name: e for name, e in endpoints.items() if "address" in e}
    if http:
        part["addresses"] = {name: e["address"] for name, e in http.items()}
        part["ports"] = {name: e["port"] for name, e in http.items()}
    return {"mcp": part}


def effective_configuration(
    *,
    client: ModelClient,
    registry: ToolRegistry,
    flow: str,
    release_mode: str,
    knowledge: KnowledgeSnapshot,
    prompts_in_use: SystemPrompts = DEFAULT_PROMPTS,
    left_out: Mapping[str, str] | None = None,
) -> EffectiveConfiguration:
    """The configuration the run executes under (see the module docstring); pure: reads no database.
    `left_out` are the flow's tools not offered, with why (`ToolRegistry.offered`): `tools.leftOut`,
    present only when a tool was left out, so the document of a run offered every tool is unchanged."""
    aiops = flow == FLOW_AI_OPS
    roles = client.roles
    models = (
        {"planner": roles.agent, "executor": roles.agent, "guard": roles.guard}
        if aiops
        else {"router": roles.router, "agent": roles.agent, "guard": roles.guard}
    )
    texts = _AIOPS_PROMPTS if aiops else _CHAT_PROMPTS
    digests = tool_digests(registry)
    mcp = mcp_part(registry)
    parameters: dict[str, Any] = {
        "agentMaxSteps": int(settings.AGENT_MAX_STEPS),
        "llmMaxRetries": int(getattr(client, "max_retries", settings.LLM_MAX_RETRIES)),
        "llmTimeoutSeconds": float(settings.LLM_TIMEOUT_SECONDS),
        "toolTimeoutSeconds": float(settings.TOOL_TIMEOUT),
    }
    if aiops:
        parameters["planMaxSteps"] = prompts.PLAN_MAX_STEPS
    else:
        parameters["routerMaxAttempts"] = ROUTER_MAX_ATTEMPTS
    document: dict[str, Any] = {
        "version": CONFIGURATION_VERSION,
        "flow": str(flow),
        "provider": str(client.provider),
        "models": models,
        "parameters": parameters,
        "prompts": {key: sha256_text(getattr(prompts_in_use, attr)) for key, attr in texts.items()},
        "tools": {
            "names": sorted(digests),
            "schemasDigest": sha256_text(canonical_json(digests)),
            "digests": digests,
            **({"leftOut": {name: str(left_out[name]) for name in sorted(left_out)}} if left_out else {}),
            **mcp,
        },
        "knowledge": {
            "digest": knowledge.digest,
            "documents": knowledge.documents,
            "chunks": knowledge.chunks,
            "evidenceTextChars": EVIDENCE_TEXT_CHARS,
        },
        "guards": {
            "evidenceIntents": sorted(prompts.EVIDENCE_INTENTS),
            # The citable kinds' pattern: `mcp:` only in a run offered MCP tools (the guard itself reads
            # every kind; a run without them has nothing `mcp:` to prove, so a citation of one fails).
            "citationPattern": sha256_text(citation_pattern(KINDS if mcp else NATIVE_KINDS)),
            "semanticModel": roles.guard,
            "semanticTextChars": guards.GUARD_TEXT_CHARS,
        },
        "release": {"mode": str(release_mode)},
        "redaction": {
            "mode": str(settings.REDACTION_MODE),
            "allowKinds": sorted(settings.REDACTION_ALLOW_KINDS or []),
            "extraPatterns": len(settings.REDACTION_EXTRA_PATTERNS or []),
            "piiMasking": bool(settings.PII_MASKING),
        },
    }
    canonical = canonical_json(document)
    return EffectiveConfiguration(document=document, canonical=canonical, fingerprint=sha256_text(canonical))


def configure_run(
    *,
    client: ModelClient,
    registry: ToolRegistry,
    flow: str,
    release_mode: str,
    prompts_in_use: SystemPrompts = DEFAULT_PROMPTS,
    knowledge: KnowledgeSnapshot | None = None,
    left_out: Mapping[str, str] | None = None,
) -> EffectiveConfiguration:
    """The run's configuration with the knowledge snapshot read now (or `knowledge`, a candidate
    corpus's) and the tools `left_out`, kept in `RunConfiguration` (once
    per fingerprint). Synchronous ORM code (the executor runs it on the database pool); keeping the
    row is fail-open: the chained RUN_STARTED is the evidence, the row a copy for pages."""
    config = effective_configuration(
        client=client,
        registry=registry,
        flow=flow,
        release_mode=release_mode,
        knowledge=knowledge if knowledge is not None else knowledge_snapshot(),
        prompts_in_use=prompts_in_use,
        left_out=left_out,
    )
    texts = _AIOPS_PROMPTS if flow == FLOW_AI_OPS else _CHAT_PROMPTS
    try:
        services.remember_configuration(
            fingerprint=config.fingerprint,
            canonical=config.canonical,
            document=config.document,
            prompts={key: getattr(prompts_in_use, attr) for key, attr in texts.items()},
        )
    except Exception as exc:  # a display copy: its loss costs the pages' view, never the run
        logger.warning("run configuration not kept error=%s", type(exc).__name__)
    return config


def configured_start(
    configure: Callable[[], EffectiveConfiguration] | None,
    start: Callable[..., int | None],
    details: dict[str, Any],
) -> tuple[bool, int | None, Exception | None]:
    """A new run's configuration (`configure`: `configure_run` with the run's arguments; None when the
    run's set-up failed before) added to RUN_STARTED's `details`, then RUN_STARTED (`start`), in one job
    of the database pool: (True, its sequence, None). Not started here: (False, None, the configuration's
    error) when it failed, (False, None, None) when keeping its copy met a database error; the executor
    then records RUN_STARTED in a job of its own (the pool checks the connection between jobs)."""
    if configure is not None:
        try:
            config = configure()
        except Exception as exc:
            return False, None, exc
        details.update(configuration=config.document, configFingerprint=config.fingerprint)
        if connection.errors_occurred:
            return False, None, None
    return True, start(details=details), None


def tools_of_start(run_id: str) -> list[str] | None:
    """The tool names the run's RUN_STARTED offered (None: no such event): a resumed run offers the same
    tools, so a tool left out at the start stays out (its backend's state then is what was recorded)."""
    details = (
        TraceEvent.objects.filter(run_id=run_id, event_type=EventType.RUN_STARTED)
        .order_by("sequence_no")
        .values_list("details", flat=True)
        .first()
    )
    names = details.get("tools") if isinstance(details, dict) else None
    return [str(name) for name in names] if isinstance(names, list) else None


# ---------------------------------------------------------------------------------------------------
# Comparing two configurations (the compare page)
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Difference:
    """One leaf of two configuration documents that differs: its dotted path and both values (None:
    absent on that side)."""

    path: str
    left: Any
    right: Any


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key in sorted(value):
            out.update(_leaves(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def differences(left: Mapping[str, Any] | None, right: Mapping[str, Any] | None) -> list[Difference]:
    """Every leaf that differs between two configuration documents, in path order; lists compare
    whole (a tool set is one value)."""
    a, b = _leaves(dict(left or {})), _leaves(dict(right or {}))
    return [
        Difference(path, a.get(path), b.get(path))
        for path in sorted(set(a) | set(b))
        if a.get(path) != b.get(path)
    ]
