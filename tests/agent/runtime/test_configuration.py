"""The configuration fingerprint (issue 34, item 1), on runs the real runtime executed against the fake
OpenAI-compatible server: identical configurations share one fingerprint, any changed part gives another;
the fingerprint is chained in RUN_STARTED, copied to the run row and kept once in `RunConfiguration`;
`verify_audit` names a changed column and a chained document that no longer hashes to its fingerprint."""

from __future__ import annotations

import dataclasses
import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from agent.knowledge.retrieval import knowledge_snapshot
from agent.runtime.configuration import (
    differences,
    effective_configuration,
    fingerprint_of,
    short_fingerprint,
)
from agent.runtime.llm import ModelRoles, OpenAIModelClient
from agent.runtime.prompts import DEFAULT_PROMPTS
from agent.runtime.tools.registry import FLOW_AI_OPS, FLOW_CHAT, ToolRegistry, default_registry
from audit.models import EventType, TraceEvent
from diagnosis.models import DiagnosisRun, RunConfiguration, RunStatus
from tests.agent.runtime.support import AGENT, GUARD, ROUTE, ROUTER, VERDICT, ask, evidence_ids
from tests.audit.transparency.support import rehash_chain
from tests.fakes.openai_server import stream_answer, stream_tool_calls, usage

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runtime_pools", "corpus"),
]


def _script(llm) -> None:
    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(
        AGENT,
        stream_tool_calls(
            [("call_1", "lookup_knowledge", '{"query": "disk full /var/log"}')], usage=usage(200, 20)
        ),
        lambda request: stream_answer(f"Run du [{evidence_ids(request)[0]}].", usage=usage(300, 30)),
    )
    llm.add(GUARD, stream_answer(VERDICT, usage=usage(100, 10)))


def _verify(run_id: str) -> tuple[bool, str]:
    out = io.StringIO()
    try:
        call_command("verify_audit", "--run", run_id, stdout=out)
    except CommandError as exc:
        return False, out.getvalue() + str(exc)
    return True, out.getvalue()


def _started(run_id: str) -> TraceEvent:
    return TraceEvent.objects.get(run_id=run_id, event_type=EventType.RUN_STARTED)


def _ask(llm, user, query="Disk full on /var/log"):
    _script(llm)
    run, outcome, _ = ask(user, query)
    assert run.status == RunStatus.SUCCESS, outcome
    return run


def test_identical_configurations_share_one_fingerprint_chained_and_kept_once(llm, user):
    first, second = _ask(llm, user), _ask(llm, user, "Disk is full again")
    assert first.config_fingerprint and first.config_fingerprint == second.config_fingerprint
    details = _started(first.run_id).details
    assert details["configFingerprint"] == first.config_fingerprint
    assert fingerprint_of(details["configuration"]) == first.config_fingerprint
    document = details["configuration"]
    assert document["models"] == {"router": ROUTER, "agent": AGENT, "guard": GUARD}
    assert document["provider"] == "openai" and document["release"] == {"mode": "verified"}
    assert document["tools"]["names"] == default_registry(flow=FLOW_CHAT).names()
    assert document["knowledge"]["digest"] == knowledge_snapshot().digest
    assert document["knowledge"]["documents"] == 2
    # No prompt's text in the chain: digests only; the table keeps the texts for reading.
    assert DEFAULT_PROMPTS.agent not in str(details)
    (row,) = RunConfiguration.objects.all()
    assert row.fingerprint == first.config_fingerprint and fingerprint_of(row.document) == row.fingerprint
    assert row.prompts["agent"] == DEFAULT_PROMPTS.agent
    assert _verify(first.run_id)[0] and _verify(second.run_id)[0]


def test_a_changed_runbook_changes_the_fingerprint_and_compare_names_it(llm, user, tmp_path):
    before = _ask(llm, user)
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "disk-full.md").write_text(
        "---\ntitle: Disk full on /var/log\ntags: [disk]\nsummary: Logs fill the disk.\n---\n\n"
        "## Symptoms\n\nWrites fail with `No space left on device`; `df -h` shows 100 percent.\n",
        encoding="utf-8",
    )
    call_command("load_knowledge", str(tmp_path / "more"), stdout=io.StringIO())
    after = _ask(llm, user)
    assert before.config_fingerprint != after.config_fingerprint
    old, new = (RunConfiguration.objects.get(fingerprint=r.config_fingerprint) for r in (before, after))
    changed = {d.path for d in differences(old.document, new.document)}
    assert "knowledge.digest" in changed and not any(
        p.startswith(("prompts", "models", "tools")) for p in changed
    )


def test_every_part_changes_the_fingerprint(llm, settings):
    client = OpenAIModelClient()
    registry = default_registry(flow=FLOW_CHAT)
    snapshot = knowledge_snapshot()

    def fp(**kwargs):
        args = {
            "client": client,
            "registry": registry,
            "flow": FLOW_CHAT,
            "release_mode": "verified",
            "knowledge": snapshot,
            **kwargs,
        }
        return effective_configuration(**args).fingerprint

    base = fp()
    assert fp() == base  # deterministic
    renamed = OpenAIModelClient(roles=ModelRoles(router=ROUTER, agent="other-agent", guard=GUARD))
    spec = registry.get("lookup_knowledge")
    described = ToolRegistry(
        [s for s in (registry.get(n) for n in registry.names()) if s.name != spec.name]
        + [dataclasses.replace(spec, description=spec.description + " Also logs.")]
    )
    fewer = ToolRegistry([registry.get("lookup_knowledge")])
    variants = {
        "prompt": fp(prompts_in_use=dataclasses.replace(DEFAULT_PROMPTS, agent="Answer briefly.")),
        "guard prompt": fp(prompts_in_use=dataclasses.replace(DEFAULT_PROMPTS, guard="Check it.")),
        "model": fp(client=renamed),
        "retries": fp(client=OpenAIModelClient(max_retries=7)),
        "tool set": fp(registry=fewer),
        "tool schema": fp(registry=described),
        "knowledge": fp(knowledge=dataclasses.replace(snapshot, digest="0" * 64)),
        "release": fp(release_mode="draft"),
        "flow": fp(flow=FLOW_AI_OPS, registry=default_registry(flow=FLOW_AI_OPS)),
        "tools left out": fp(left_out={"query_metrics": "NotConfigured: Prometheus is not configured"}),
        "why left out": fp(left_out={"query_metrics": "Unreachable: Prometheus is unreachable"}),
    }
    # Nothing left out writes no `leftOut`: the document (and fingerprint) of such a run is as before.
    assert fp(left_out={}) == base
    assert (
        "leftOut"
        not in effective_configuration(
            client=client, registry=registry, flow=FLOW_CHAT, release_mode="verified", knowledge=snapshot
        ).document["tools"]
    )
    settings.AGENT_MAX_STEPS = settings.AGENT_MAX_STEPS + 1
    variants["max steps"] = fp()
    settings.AGENT_MAX_STEPS -= 1
    settings.REDACTION_MODE = "off" if settings.REDACTION_MODE != "off" else "enforce"
    variants["redaction"] = fp()
    assert base not in variants.values()
    assert len(set(variants.values())) == len(variants), variants
    assert short_fingerprint(base) == base[:12]


def test_verify_names_a_changed_column_and_a_changed_chained_document(llm, user):
    run = _ask(llm, user)
    assert _verify(run.run_id)[0]
    DiagnosisRun.objects.filter(pk=run.pk).update(config_fingerprint="f" * 64)
    ok, out = _verify(run.run_id)
    assert not ok and "configuration fingerprint does not match RUN_STARTED" in out
    DiagnosisRun.objects.filter(pk=run.pk).update(config_fingerprint=run.config_fingerprint)
    assert _verify(run.run_id)[0]
    # An attacker edits the chained document (a prompt digest) and re-hashes the chain.
    event = _started(run.run_id)
    details = dict(event.details)
    details["configuration"] = {**details["configuration"], "release": {"mode": "draft"}}
    TraceEvent.objects.filter(pk=event.pk).update(details=details)
    rehash_chain(run.run_id)
    ok, out = _verify(run.run_id)
    assert not ok and "does not hash to its fingerprint" in out
