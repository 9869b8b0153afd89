"""The interrupted run's saved resume state under the same rules as reasoning (issue 30, item 8), on real
components: the local OpenAI-compatible server (the real `openai` SDK) scripts an executor step that
sends DeepSeek-style `reasoning_content` and calls `create_silence`; the run is interrupted, approved
and resumed by the queue worker, with the canonical store in local memory and on Redis.

* After the interruption no value in the canonical store holds the reasoning in plaintext (every key is
  scanned); the saved state is under the newest reasoning key and RUN_INTERRUPTED's `checkpointSha256`
  is over the stored value; its TTL is `checkpoint_lifetime_seconds()`.
* The resumed executor sends the reasoning back to the provider exactly as it came (the round trip
  DeepSeek requires within a tool-calling turn), the run succeeds, the state is dropped and
  `verify_audit` passes.
* The reasoning purge of the run erases the state (the resumption then fails RESUME_STATE_UNAVAILABLE);
  under a legal hold the state is kept and the run resumes.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings
from django.contrib.auth.models import Group, Permission
from django.core.cache import caches
from django.core.management import call_command

from agent.aiops import intake
from agent.runtime import approvals, prompts, resume_state
from agent.runtime.canonical import CanonicalStore
from agent.runtime.executor import RESUME_STATE_UNAVAILABLE
from audit.models import EventType, HoldScope, ToolInvocation, ToolStatus, TraceEvent
from audit.payloads import sha256_hex
from audit.verify.runs import verify_run
from audit.write.reasoning_changes import purge_reasoning
from audit.write.retention import place_hold
from bench.b7_aiops import AiOpsBenchProvider
from diagnosis.models import DiagnosisRun, RunStatus
from reasoning import crypto
from reasoning.models import AgentReasoningAudit
from tests.agent.aiops.support import drain
from tests.fakes.openai_server import FakeLLMServer, finish_chunk, reasoning_chunks, tool_call_chunks

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("chat_settings", "runtime_pools", "aiops_settings"),
]
RUNBOOKS = Path(django_settings.BASE_DIR) / "runbooks"
REDIS_URL = "redis://127.0.0.1:6379/0"
# ASCII and unique, so a plaintext copy is found byte for byte in any serialised value.
REASONING = "Plaintext-reasoning-marker-7f3a: the scrapes are slow, so silence the alert while we look."
SILENCE = {
    "matchers": [{"name": "alertname", "value": "ResumeStateDrill"}],
    "duration_minutes": 10,
    "comment": "resume state drill",
}


class ReasoningSilencer(AiOpsBenchProvider):
    """The bench's AI Ops provider whose executor's first step reasons (`reasoning_content`) and calls
    `query_metrics` and `create_silence`; the requests of the resumed executor are kept."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.resumed_requests: list[list[dict]] = []

    def __call__(self, request):
        if prompts.role_of(request.messages) == "executor":
            if not any(m.get("role") == "tool" for m in request.messages):
                calls = [
                    ("call_0", "query_metrics", json.dumps({"query": 'up{job="prometheus"}'})),
                    ("call_1", "create_silence", json.dumps(SILENCE)),
                ]
                chunks = [*reasoning_chunks(REASONING), *tool_call_chunks(calls), finish_chunk("tool_calls")]
                return self._stream(chunks, prompt=900, completion=60)
            self.resumed_requests.append(list(request.messages))
        return super().__call__(request)


def redis_available() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_timeout=1).ping())
    except redis.RedisError:
        return False


class Store:
    """The canonical cache of one test and a scan of every value it holds, as stored bytes."""

    def __init__(self, kind: str, settings) -> None:
        self.kind = kind
        self.prefix = f"canonical-test-{uuid.uuid4().hex[:12]}"
        if kind == "redis":
            if not redis_available():
                pytest.skip("needs Redis on 127.0.0.1:6379 (scripts/redis.sh)")
            backend = {
                "BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": REDIS_URL,
                "KEY_PREFIX": self.prefix,
            }
            self.client = redis.Redis.from_url(REDIS_URL)
        else:
            backend = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": self.prefix}
        settings.CACHES = {**settings.CACHES, "canonical": backend}

    def values(self) -> dict[str, bytes]:
        """Every key of this test's canonical store and its value as stored (pickled by Django)."""
        if self.kind == "redis":
            keys = list(self.client.scan_iter(match=f"{self.prefix}:*"))
            return {k.decode(): self.client.get(k) for k in keys}
        cache = caches["canonical"]
        return {key: bytes(value) for key, value in cache._cache.items()}  # LocMemCache's own dict

    def ttl(self, key: str) -> float:
        """Seconds left before `key` (a store key as `values` names it) expires."""
        if self.kind == "redis":
            return float(self.client.ttl(key))
        return caches["canonical"]._expire_info[key] - time.time()

    def close(self) -> None:
        if self.kind == "redis":
            keys = list(self.client.scan_iter(match=f"{self.prefix}:*"))
            if keys:
                self.client.delete(*keys)


@pytest.fixture(params=["memory", "redis"])
def store(request, settings):
    made = Store(request.param, settings)
    yield made
    made.close()


@pytest.fixture
def approver(django_user_model):
    user = django_user_model.objects.create_user("approver", is_staff=True)
    user.groups.add(Group.objects.get(name=approvals.APPROVERS_GROUP))
    return user


@pytest.fixture
def provider(settings):
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())
    scripted = ReasoningSilencer(call_seconds=0.0, chunk_interval=0.0)
    with FakeLLMServer(handler=scripted) as fake:
        for key, value in scripted.settings(fake.base_url).items():
            setattr(settings, key, value)
        yield scripted
        assert not fake.errors


def interrupted(staff_user) -> tuple[DiagnosisRun, ToolInvocation]:
    run_id = intake.start_staff_analysis(user=staff_user, query="Alert ResumeStateDrill: slow scrapes").run_id
    drain()
    run = DiagnosisRun.objects.get(run_id=run_id)
    assert run.status == RunStatus.INTERRUPTED, run.error_code
    waiting = ToolInvocation.objects.get(run_id=run_id, tool_name="create_silence")
    assert waiting.status == ToolStatus.AWAITING_APPROVAL
    return run, waiting


def checkpoint_key(store: Store, run_id: str) -> str:
    suffix = CanonicalStore(run_id).state_key(resume_state.CHECKPOINT)
    (key,) = [k for k in store.values() if k.endswith(suffix)]
    return key


def resume(run: DiagnosisRun, waiting: ToolInvocation, approver) -> DiagnosisRun:
    approvals.decide(run=run, tool_call_id=waiting.tool_call_id, decision=approvals.APPROVED, user=approver)
    drain()
    run.refresh_from_db()
    return run


def test_no_reasoning_in_plaintext_in_the_store_and_the_resumed_run_replays_it(
    store, provider, staff_user, approver, settings
):
    run, waiting = interrupted(staff_user)
    # The reasoning was captured (encrypted in its own table) ...
    executor_rows = AgentReasoningAudit.objects.filter(run_id=run.run_id, agent_name="executor")
    assert [r.reasoning_content for r in executor_rows] == [REASONING]
    # ... and no value of the canonical store holds it in plaintext: every key scanned, the saved
    # state's among them.
    stored = store.values()
    key = checkpoint_key(store, run.run_id)
    assert len(stored) > 1  # tool results and evidence too
    leaking = [k for k, value in stored.items() if REASONING.encode() in value]
    assert leaking == []
    # The saved state is under the newest reasoning key; the chain's digest is over what is stored.
    state = CanonicalStore(run.run_id).get_state(resume_state.CHECKPOINT)
    assert state.startswith(crypto.keyring().current_prefix)
    event = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_INTERRUPTED)
    assert event.details["checkpointSha256"] == sha256_hex(state)
    assert REASONING in crypto.keyring().decrypt(state)
    # Its lifetime is bounded: the request's timeout plus the queue timeout, not the store's default.
    lifetime = resume_state.checkpoint_lifetime_seconds()
    assert lifetime == settings.APPROVAL_TIMEOUT_SECONDS + settings.AIOPS_QUEUE_TIMEOUT_SECONDS
    assert lifetime - 120 < store.ttl(key) <= lifetime

    run = resume(run, waiting, approver)
    assert run.status == RunStatus.SUCCESS, run.error_code
    # The resumed executor sent the step's reasoning back, as it came (DeepSeek's round trip).
    (request, *_) = provider.resumed_requests
    (turn,) = [m for m in request if m.get("tool_calls")]
    assert turn["reasoning_content"] == REASONING
    # Read once, then dropped; still nothing in plaintext.
    after = store.values()
    assert not any(k.endswith(":state:checkpoint") for k in after)
    assert [k for k, value in after.items() if REASONING.encode() in value] == []
    verification = verify_run(run.run_id)
    assert verification.ok, verification.problems
    call_command("audit_checkpoint", stdout=io.StringIO())
    out = io.StringIO()
    call_command("verify_audit", "--run", run.run_id, stdout=out)
    assert "FAIL" not in out.getvalue()


@pytest.mark.parametrize("store", ["memory"], indirect=True)
def test_the_reasoning_purge_of_the_run_erases_its_saved_state(store, provider, staff_user, approver):
    run, waiting = interrupted(staff_user)
    checkpoint_key(store, run.run_id)
    purge_reasoning(run_id=run.run_id)
    assert not any(k.endswith(":state:checkpoint") for k in store.values())
    assert not AgentReasoningAudit.objects.filter(run_id=run.run_id, purged_at__isnull=True).exists()
    # The erasure wins over the resumption: the run fails closed, its record still verifies.
    run = resume(run, waiting, approver)
    assert (run.status, run.error_code) == (RunStatus.FAILED, RESUME_STATE_UNAVAILABLE)
    waiting.refresh_from_db()
    assert waiting.started_at is None and waiting.status != ToolStatus.SUCCEEDED
    verification = verify_run(run.run_id)
    assert verification.ok, verification.problems


@pytest.mark.parametrize("store", ["memory"], indirect=True)
def test_a_purge_by_age_erases_the_saved_state_of_the_runs_it_reaches(store, provider, staff_user):
    run, _waiting = interrupted(staff_user)
    purge_reasoning(older_than_days=0)
    assert not any(k.endswith(":state:checkpoint") for k in store.values())
    assert verify_run(run.run_id).ok


@pytest.mark.parametrize("store", ["memory"], indirect=True)
def test_a_legal_hold_keeps_the_saved_state_and_the_run_resumes(
    store, provider, staff_user, approver, django_user_model
):
    run, waiting = interrupted(staff_user)
    officer = django_user_model.objects.create_user("officer", is_staff=True)
    officer.user_permissions.add(Permission.objects.get(codename="place_legal_hold"))
    place_hold(user=officer, scope=HoldScope.RUN, target_id=run.run_id, reason="litigation")
    assert purge_reasoning(run_id=run.run_id) == 0
    assert purge_reasoning(older_than_days=0) == 0
    checkpoint_key(store, run.run_id)  # still there
    run = resume(run, waiting, approver)
    assert run.status == RunStatus.SUCCESS, run.error_code
    verification = verify_run(run.run_id)
    assert verification.ok, verification.problems
