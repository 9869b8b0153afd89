"""The tamper matrix (issue 30 item 4): no database write to an audited table passes `verify_audit`
unless its column is in the documented exclusion list (`audit.verify.coverage.EXCLUDED`).

The cases are generated from the models' concrete fields and the registry, so a new field that is
neither covered nor excluded fails `test_every_field_is_covered_or_excluded`, and a covered one is
changed by `test_a_changed_covered_column_is_named` without anyone adding a case. They run on one world
built once per module (committed, flushed at the end): runs the real runtime executed through the
`openai` SDK against the local fake provider (router, two parallel tools, reasoning, guard; and a run
the router's provider failed), an AI Ops run whose waiting tool call was approved
(`agent.runtime.approvals.decide`), a review, a reasoning purge, a legal hold, a run purged by
retention (a tombstone), a governance grant, and a signed checkpoint over all of it. Each case changes
the database inside the test's transaction (rolled back afterwards), as an attacker with write access
and no signing key would, and requires `verify_audit` to exit non-zero and to name the row.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import shutil
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, connection, models, transaction
from django.test import override_settings
from django.utils import timezone

from access.reasoning_reads import record_reasoning_read
from agent.aiops import intake
from agent.knowledge.retrieval import reset_knowledge_index
from agent.runtime import approvals
from agent.runtime import db as runtime_db
from audit.models import (
    AgentStep,
    Checkpoint,
    EventType,
    GovernanceEvent,
    GovernanceEventType,
    HoldScope,
    LegalHold,
    LogHead,
    LogLeaf,
    LogNode,
    RunReview,
    RunTombstone,
    TailPending,
    ToolInvocation,
    TraceEvent,
)
from audit.transparency import keys, leafdata, merkle
from audit.transparency.log import checkpoint
from audit.verify import authority, coverage, row_digests
from audit.verify.authenticity import ChainNotAuthentic
from audit.verify.chain_digests import step_key, step_label
from audit.verify.hash_chain import GENESIS_HASH, chain_hash
from audit.verify.holds import held
from audit.verify.incremental import watermark_problems
from audit.write.feedback import record_feedback
from audit.write.governance import governance_payload
from audit.write.ops import WriteFenced
from audit.write.reasoning_changes import purge_reasoning
from audit.write.retention import place_hold, purge_expired_runs
from audit.write.reviews import record_review
from diagnosis.models import AiOpsAlert, ChatSession, DiagnosisRun, RunConfiguration, RunFeedback, RunStatus
from evaluations.models import EvaluationScore, Evaluator, EvaluatorKind
from evaluations.services import evaluate_run
from reasoning.fields import EncryptedTextField
from reasoning.models import AgentReasoningAudit, ReasoningAccessLog
from tests.agent.runtime.support import AGENT, GUARD, ROUTER, Provider, ask, load_corpus
from tests.agent.runtime.test_pipeline import cited_answer, parallel_lookups_with_reasoning
from tests.audit.insertion import forge_event, forge_governance, forge_run
from tests.audit.transparency.support import rehash_chain
from tests.factories import make_recorded_run, make_waiting_approval
from tests.fakes.openai_server import FakeLLMServer, HTTPError, usage

pytestmark = pytest.mark.django_db

REASONING_GROUP = "Reasoning Auditors"


@dataclass
class World:
    """What the module's runs left in the database (ids only; rows are read again by each case)."""

    chat: str  # executed by the runtime: routed, two tools, reasoning, guard, published; reviewed
    failed: str  # executed by the runtime: the router's provider refused, the run FAILED; held
    approval: str  # an AI Ops run whose waiting call was approved
    approval_call: str
    purged: str  # purged by retention: only its tombstone and leaf remain
    review_id: str
    score_id: str  # an online evaluator's score of the chat run (EVALUATION_RECORDED, row bound)
    hold_id: int
    other_session: str  # a session of another owner (a target for a moved foreign key)
    other_user: int
    grant_sequence: int  # the governance event adding a user to the reasoning auditors
    purge_refused: str | None = None  # why the reasoning purge of the runtime's run was refused


def _settings_of_the_module(signing_key: str) -> dict[str, Any]:
    return {
        "AUDIT_SIGNING_KEYS": [signing_key],
        "AUDIT_VERIFY_KEYS": [],
        "AUDIT_WITNESS_PATH": "",
        # The tombstoned run was purged right after it finished (retention 0): the verifier holds the
        # tombstone to the same retention.
        "AUDIT_RETENTION_DAYS": 0,
        "AIOPS_WORKER_CONCURRENCY": 0,
        "PASSWORD_HASHERS": ["django.contrib.auth.hashers.MD5PasswordHasher"],
    }


def _llm_settings(server) -> dict[str, Any]:
    return {
        "LLM_PROVIDER": "openai",
        "LLM_BASE_URL": server.base_url,
        "LLM_API_KEY": "sk-test",
        "LLM_MODEL": AGENT,
        "LLM_ROUTER_MODEL": ROUTER,
        "LLM_GUARD_MODEL": GUARD,
        "LLM_TIMEOUT_SECONDS": 5,
        "LLM_MAX_RETRIES": 0,
    }


def _build(tmp_path) -> World:
    users = get_user_model().objects
    owner = users.create_user("matrix-owner", password="pw-owner-1")
    other = users.create_user("matrix-other", password="pw-other-1")
    root = users.create_superuser("matrix-root", password="pw-root-1")
    reader = users.create_user("matrix-reader", password="pw-reader-1")

    # A run purged by retention before anything else finished (retention 0 purges every anchored run).
    purged = make_recorded_run(owner, query="purged by retention")
    purge_expired_runs(now=timezone.now(), retention_days=0)

    reset_knowledge_index()
    load_corpus(tmp_path / "kb")
    runtime_db.shutdown_pools()
    with FakeLLMServer() as server, override_settings(**_llm_settings(server)):
        llm = Provider(server)
        llm.route("DIAGNOSIS", usage=usage(120, 20))
        llm.add(AGENT, parallel_lookups_with_reasoning(), cited_answer)
        llm.supported(usage=usage(300, 15))
        chat, _outcome, _sink = ask(owner, "The disk is full on /var/log, what now?")
        llm.add(ROUTER, HTTPError(401))
        failed, _outcome, _sink = ask(other, "nginx answers 502")
        assert not server.errors, server.errors
    runtime_db.shutdown_pools()
    assert (chat.status, failed.status) == (RunStatus.SUCCESS, RunStatus.FAILED)

    # The finished runs are anchored before anyone reviews them: what follows is their chains' tails.
    checkpoint()
    waiting, call_id = make_waiting_approval(owner)
    approvals.decide(run=waiting, tool_call_id=call_id, decision=approvals.APPROVED, user=root)

    reader.groups.add(Group.objects.get(name=REASONING_GROUP))
    grant = GovernanceEvent.objects.filter(event_type=GovernanceEventType.GROUP_MEMBER_ADDED).latest(
        "sequence_no"
    )
    chat_run = DiagnosisRun.objects.get(run_id=chat.run_id)
    review = record_review(run=chat_run, user=root, verdict="unsafe", note="cites the wrong runbook")
    citations = Evaluator.objects.create(name="citations", kind=EvaluatorKind.CITATION_COVERAGE)
    (score,) = evaluate_run(run_id=chat.run_id, evaluators=[citations])
    world = World(
        chat=chat.run_id,
        failed=failed.run_id,
        approval=waiting.run_id,
        approval_call=call_id,
        purged=purged.run_id,
        review_id=review.review_id,
        score_id=score.score_id,
        hold_id=0,
        other_session=failed.session_id,
        other_user=other.pk,
        grant_sequence=grant.sequence_no,
    )
    # A reasoning read (chained by REASONING_READ), a reader's down-vote (FEEDBACK_RECORDED) and an
    # alert queued for an analysis (its AiOpsAlert row, a PENDING run).
    record_reasoning_read(
        user=reader,
        session_id=chat.session_id,
        run_id=chat.run_id,
        records_returned=4,
        client_address="127.0.0.1",
        user_agent="matrix",
    )
    record_feedback(run=chat_run, user=reader, rating="down", comment="wrong runbook")
    intake.start_staff_analysis(user=root, alert="Alert DiskFull firing on host db-1")
    try:
        purge_reasoning(run_id=chat.run_id, actor="matrix")
    except WriteFenced as exc:  # issue 30 item 6: governance writers must take the run's lease epoch
        world.purge_refused = type(exc).__name__
    world.hold_id = place_hold(
        user=root, scope=HoldScope.RUN, target_id=failed.run_id, reason="litigation"
    ).pk
    checkpoint()
    return world


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, tmp_path_factory):
    """The module's runs, committed once; every table `migrate` did not fill is emptied after the
    module's last case."""
    with django_db_blocker.unblock(), override_settings(**_settings_of_the_module(keys.generate_key_text())):
        migrated = (
            GovernanceEvent.objects.order_by("-sequence_no").values_list("sequence_no", flat=True).first()
        )
        try:
            built = _build(tmp_path_factory.mktemp("matrix"))
            ok, out = verify()
            assert ok, out  # the untouched world verifies: every failure below is the change's
            # The state an operator keeps after that clean verification: each case verifies
            # incrementally from it too (`assert_caught`).
            STATE["path"] = tmp_path_factory.mktemp("matrix-state") / "verify-state.json"
            call_command("verify_audit", state=str(STATE["path"]), stdout=io.StringIO())
            assert STATE["path"].exists()
            yield built
        finally:
            runtime_db.shutdown_pools()
            _empty_what_the_module_wrote(migrated or 0)


# What `migrate` writes (and a fresh test database holds): kept, so that the next module finds the groups
# and permissions with their ids (a `flush` would recreate them, and record governance events doing so).
MIGRATED_TABLES = frozenset(
    {"auth_group", "auth_group_permissions", "auth_permission", "django_content_type", "django_migrations"}
)


def _empty_what_the_module_wrote(governance_upto: int) -> None:
    """Empty every other table (sequences reset), as the fresh test database had them — but for the
    governance events `migrate` wrote (the role groups' grants, up to `governance_upto`), which the
    authority of every later test's reviewers, approvers and auditors is replayed from."""
    from django.core.management.color import no_style

    GovernanceEvent.objects.filter(sequence_no__gt=governance_upto).delete()
    kept = MIGRATED_TABLES | {GovernanceEvent._meta.db_table}
    tables = [t for t in connection.introspection.table_names() if t not in kept]
    connection.ops.execute_sql_flush(connection.ops.sql_flush(no_style(), tables, reset_sequences=True))


STATE: dict[str, Any] = {}  # the state file written after the world's clean verification


def verify(*, incremental: bool = False) -> tuple[bool, str]:
    """`manage.py verify_audit` as an operator runs it: (exit 0, its output). `incremental`: continuing
    from (a copy of) the state file of the world's clean verification."""
    out = io.StringIO()
    args = []
    if incremental:
        copy = STATE["path"].with_name(f"copy-{os.getpid()}.json")
        shutil.copyfile(STATE["path"], copy)
        args = ["--state", str(copy)]
    try:
        call_command("verify_audit", *args, stdout=out)
    except CommandError as exc:
        return False, out.getvalue() + f"\n{exc}"
    return True, out.getvalue()


def assert_caught_run(run_id: str) -> None:
    """`verify_audit` fails, and `verify_audit --run` (the run's inclusion proof in the newest
    checkpoint) names the run: a rewrite that rebuilt the run's leaf breaks only the signed root,
    which names no run by itself."""
    assert_caught(*run_named(run_id), "root does not match")
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("verify_audit", run=run_id, stdout=out)
    assert f"run={run_id} INVALID" in out.getvalue(), out.getvalue()


def run_named(run_id: str) -> tuple[str, ...]:
    """How verify_audit names a run with a problem (never one of its notes)."""
    return (
        f"run={run_id} INVALID",
        f"run={run_id} INCOMPLETE",
        f"run={run_id} FACTS",
        f"anchored run {run_id} ",
        f"tombstone of run {run_id}",
    )


INCREMENTAL_LIMIT = "an in-place change under the watermarks"


def assert_caught(*names: str, incremental: str = "skip") -> str:
    """`verify_audit` fails and its output names the row by at least one of `names`. `incremental`: also
    the incremental verification from the world's state file — "caught": it fails and names the row too
    (every deletion, forged row and insertion); "caught or limit": that, or it passes and the change is
    its documented limit, rows changed in place with every table's watermark (highest id, rows up to it)
    as verified (docs/audit-integrity.md, *What incremental verification cannot see*); "skip": not run
    (CI time: an in-place change of a run's row, the limit, seen by --all)."""
    ok, out = verify()
    assert not ok, f"verify_audit passed after the change:\n{out}"
    assert any(n in out for n in names), f"none of {names} named in:\n{out}"
    if incremental == "skip":
        return out
    ok, inc = verify(incremental=True)
    if ok:
        assert incremental != "caught", f"the incremental verification passed after the change:\n{inc}"
        marks = json.loads(STATE["path"].read_text())["watermarks"]
        assert not watermark_problems(marks), INCREMENTAL_LIMIT  # nothing but the limit is missed
        LIMITED.append(os.environ.get("PYTEST_CURRENT_TEST", "?"))
    else:
        # Named as the full verification names it, or by a problem the full verification also states
        # (a changed leaf column: incrementally, by the run whose leaf it was).
        problems = {line for line in out.splitlines() if " INVALID " in line or " INCOMPLETE " in line}
        named = any(n in inc for n in names) or any(line in problems for line in inc.splitlines())
        assert named, f"none of {names} named incrementally in:\n{inc}"
    return out


LIMITED: list[str] = []  # the cases only --all catches (the limit, counted for docs/audit-integrity.md)


# --------------------------------------------------------------------------------------------------
# Which row of each table the cases change, and how verify_audit names it
# --------------------------------------------------------------------------------------------------
def _row(model: type[models.Model], world: World, variant: str) -> models.Model:
    if model is DiagnosisRun:
        return DiagnosisRun.objects.get(run_id=world.chat)
    if model is ChatSession:
        return DiagnosisRun.objects.get(run_id=world.chat).session
    if model is TraceEvent:
        return TraceEvent.objects.get(run_id=world.chat, event_type=EventType.ROUTING_DECISION)
    if model is AgentStep:
        return AgentStep.objects.filter(run_id=world.chat).order_by("step_index").first()
    if model is ToolInvocation:
        if variant == "approval":
            return ToolInvocation.objects.get(run_id=world.approval, tool_call_id=world.approval_call)
        return ToolInvocation.objects.filter(run_id=world.chat).order_by("id").first()
    if model is AgentReasoningAudit:
        return AgentReasoningAudit.objects.filter(run_id=world.chat).order_by("step_index", "id").first()
    if model is RunReview:
        return RunReview.objects.get(review_id=world.review_id)
    if model is EvaluationScore:
        return EvaluationScore.objects.get(score_id=world.score_id)
    if model is GovernanceEvent:
        return GovernanceEvent.objects.get(sequence_no=world.grant_sequence)
    if model is LogLeaf:
        return LogLeaf.objects.get(run_id=world.chat)
    if model is LogNode:
        return LogNode.objects.order_by("level", "node_index").first()
    if model is LogHead:
        return LogHead.objects.get(pk=1)
    if model is Checkpoint:
        return Checkpoint.objects.order_by("-tree_size").first()
    if model is RunTombstone:
        return RunTombstone.objects.get(run_id=world.purged)
    if model is LegalHold:
        return LegalHold.objects.get(pk=world.hold_id)
    if model is ReasoningAccessLog:
        return ReasoningAccessLog.objects.get(run_id=world.chat)
    if model is RunConfiguration:
        fingerprint = DiagnosisRun.objects.get(run_id=world.chat).config_fingerprint
        return RunConfiguration.objects.get(fingerprint=fingerprint)
    if model is RunFeedback:
        return RunFeedback.objects.get(run_id=world.chat)
    if model is AiOpsAlert:
        return AiOpsAlert.objects.order_by("id").first()
    raise AssertionError(f"no row of {model.__name__} in the matrix")


def _names(model: type[models.Model], row: Any) -> tuple[str, ...]:
    """How verify_audit names `row` (any of these; `row` is an instance or a dict of column values)."""

    def get(name: str) -> Any:
        return row[name] if isinstance(row, dict) else getattr(row, name)

    if model is DiagnosisRun:
        return run_named(get("run_id"))
    if model is ChatSession:
        return (f"session {get('session_id')}",)
    if model is TraceEvent:
        return (f"run={get('run_id')} INVALID sequence {get('sequence_no')}", f"{get('sequence_no')} missing")
    if model is AgentStep:
        return (step_label(step_key(get("step_index"), get("agent_name"))),)
    if model is ToolInvocation:
        return (f"tool call {get('tool_call_id')}",)
    if model is AgentReasoningAudit:
        return (f"reasoning row for step {get('step_index')} ({get('agent_name')})",)
    if model is RunReview:
        return (f"review {get('review_id')}",)
    if model is EvaluationScore:
        return (f"evaluation score {get('score_id')}",)
    if model is GovernanceEvent:
        seq = get("sequence_no")
        return (f"governance event {seq}", f"governance sequence gap: {seq}")
    if model is LogLeaf:
        index = get("leaf_index")
        return (f"log leaf {index}", f"(leaf {index})", f"log leaf index {index}")
    if model is LogNode:
        # A node is named by its place; one stored where no subtree is complete is counted instead.
        where = f"log node level {get('level')} index {get('node_index')}"
        return (where, "log node(s) stored beyond the leaves")
    if model is LogHead:
        return ("log head",)
    if model is Checkpoint:
        # A deleted checkpoint is named by the leaves it alone signed.
        size = get("tree_size")
        return (f"checkpoint tree_size={size}", f"checkpoint {size}", "not covered by a signed checkpoint")
    if model is RunTombstone:
        return run_named(get("run_id"))
    if model is LegalHold:
        if isinstance(row, dict) and "id" not in row:  # a forged row: its id is the database's
            return ("no chained LEGAL_HOLD_PLACED event placed it",)
        return (f"legal hold {get('id')}",)
    if model is ReasoningAccessLog:
        if isinstance(row, dict) and "id" not in row:
            return ("no chained REASONING_READ records it",)
        return (f"reasoning read {get('id')}",)
    if model is RunConfiguration:
        return (f"configuration {get('fingerprint')[:12]}",)
    raise AssertionError(model)


def _changed(f: models.Field, value: Any, world: World) -> Any:
    """Another value of the column's type, as an attacker would write it."""
    if isinstance(f, models.ForeignKey):
        if f.related_model is ChatSession:
            return world.other_session
        if f.db_constraint:
            return world.other_user
        f = f.target_field
        if isinstance(f, models.AutoField | models.BigAutoField):
            return world.other_user
    if isinstance(f, EncryptedTextField):
        return "tampered text"  # encrypted on the way in: another ciphertext
    if isinstance(f, models.JSONField):
        if isinstance(value, dict):
            return {**value, "tampered": True}
        if isinstance(value, list):
            return [*value, "tampered"]
        return {"tampered": value}
    if isinstance(f, models.DateTimeField):
        return (value or timezone.now()) + dt.timedelta(seconds=1)
    if isinstance(f, models.BooleanField):
        return not value
    if isinstance(f, models.DecimalField):
        return (value or 0) + 1
    if isinstance(f, models.IntegerField):
        return (value or 0) + 1000
    if not value:
        return "x"
    text = str(value)
    if text[-1] in "0123456789abcdef":  # a hash stays hexadecimal
        return text[:-1] + ("0" if text[-1] != "0" else "1")
    return text[:-1] + ("y" if text[-1] != "y" else "z")


def _committable() -> None:
    """Raise IntegrityError when the write could not commit: SQLite checks its (deferred) foreign keys
    only at COMMIT, MariaDB at once."""
    if connection.vendor == "sqlite":
        connection.check_constraints()


def _update(model: type[models.Model], pk: Any, /, **values: Any) -> bool:
    """Write `values` into one row; False when the database itself refuses the write (a constraint)."""
    try:
        with transaction.atomic():
            model.objects.filter(pk=pk).update(**values)
            _committable()
    except IntegrityError:
        return False
    return True


# --------------------------------------------------------------------------------------------------
# The registry itself
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", coverage.AUDITED, ids=lambda m: m.__name__)
def test_every_field_is_covered_or_excluded(model):
    assert coverage.unaccounted(model) == []
    assert model in coverage.ROWS or model in coverage.ROWS_EXCLUDED
    for reason in coverage.EXCLUDED[model].values():
        assert reason.strip()


def test_every_model_of_the_record_apps_is_audited_or_said_not_to_be():
    from django.apps import apps

    models_of_the_record = {
        m
        for app in ("audit", "diagnosis", "reasoning", "evaluations", "experiments")
        for m in apps.get_app_config(app).get_models()
    }
    assert models_of_the_record == set(coverage.AUDITED) | set(coverage.NOT_AUDITED)
    assert not set(coverage.AUDITED) & set(coverage.NOT_AUDITED)


def test_the_documented_table_is_the_registry():
    from pathlib import Path

    from django.conf import settings

    doc = (Path(settings.BASE_DIR) / "docs" / "audit-integrity.md").read_text(encoding="utf-8")
    assert coverage.markdown_table() in doc, (
        "docs/audit-integrity.md (Coverage): run audit.verify.coverage.markdown_table()"
    )


def test_the_world_holds_every_operation(world):
    """The matrix's runs are what the issue asks for: executed by the runtime (a lease epoch ≥ 1),
    routed, with tools and reasoning, reviewed, approved, purged, held and checkpointed."""
    chat = DiagnosisRun.objects.get(run_id=world.chat)
    assert chat.lease_epoch >= 1 and chat.intent == "DIAGNOSIS" and chat.provider == "openai"
    assert ToolInvocation.objects.filter(run_id=world.chat).count() == 2
    assert AgentReasoningAudit.objects.filter(run_id=world.chat, reasoning_available=True).exists()
    assert DiagnosisRun.objects.get(run_id=world.failed).error_message
    assert TraceEvent.objects.filter(run_id=world.approval, event_type=EventType.APPROVAL_DECIDED).exists()
    assert LegalHold.objects.filter(pk=world.hold_id, target_id=world.failed).exists()
    assert RunTombstone.objects.filter(run_id=world.purged).exists()
    assert LogLeaf.objects.filter(run_id=world.chat).exists()
    assert world.purge_refused is None, (
        f"the reasoning purge of a runtime run was refused: {world.purge_refused}"
    )
    assert AgentReasoningAudit.objects.filter(run_id=world.chat, purged_at__isnull=False).exists()


# --------------------------------------------------------------------------------------------------
# Every covered column, every table
# --------------------------------------------------------------------------------------------------
def _column_cases():
    for model, covered in coverage.COVERED.items():
        variants = ("chat", "approval") if model is ToolInvocation else ("",)
        for f in model._meta.concrete_fields:
            if f.name in covered:
                for variant in variants:
                    label = f"{model.__name__}.{f.name}" + (f"[{variant}]" if variant else "")
                    yield pytest.param(model, f.name, variant, id=label)


@pytest.mark.parametrize(("model", "name", "variant"), list(_column_cases()))
def test_a_changed_covered_column_is_named(world, model, name, variant):
    f = model._meta.get_field(name)
    row = _row(model, world, variant)
    before = getattr(row, f.attname)
    after = _changed(f, before, world)
    if not _update(model, row.pk, **{f.attname: after}):
        # The database refuses the write (a foreign key or unique constraint): nothing changed.
        assert getattr(model.objects.get(pk=row.pk), f.attname) == before
        return
    assert getattr(model.objects.get(pk=row.pk), f.attname) != before  # the write landed
    # Named as it was or as it now is (a changed key names the row by its new key too).
    changed = {c.attname: getattr(row, c.attname) for c in model._meta.concrete_fields} | {f.attname: after}
    # Incrementally too for the first covered column of each log table (CI time: a covered column of a
    # run's row changed in place is the documented limit of incremental verification, seen by --all).
    first = next(c for c in model._meta.concrete_fields if c.name in coverage.COVERED[model])
    again = "caught or limit" if f.name == first.name and model in (LogLeaf, LogNode, Checkpoint) else "skip"
    assert_caught(*_names(model, row), *_names(model, changed), incremental=again)


def _row_models():
    return [pytest.param(m, id=m.__name__) for m in coverage.ROWS]


def _raw_delete(model: type[models.Model], pk: Any) -> bool:
    """DELETE one row in SQL (no ORM cascade); False when a foreign key refuses it."""
    table, column = model._meta.db_table, model._meta.pk.column
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)} WHERE {column} = %s", [pk])
            _committable()
    except IntegrityError:
        return False
    return True


@pytest.mark.parametrize("model", _row_models())
def test_a_deleted_row_is_named(world, model):
    row = _row(model, world, "")
    if not _raw_delete(model, row.pk):
        assert model.objects.filter(pk=row.pk).exists()  # refused by a foreign key: nothing deleted
        return
    assert_caught(*_names(model, row), incremental="caught")  # a count under its watermark


def _unique_names(model: type[models.Model]) -> set[str]:
    """The columns a copy must change to be insertable: each unique column, and of each composite
    unique key its columns but the run (so that the forged row lands in the real row's run)."""
    names = {f.name for f in model._meta.concrete_fields if f.unique and not f.primary_key}
    for constraint in model._meta.constraints:
        if isinstance(constraint, models.UniqueConstraint):
            names |= {
                n for n in constraint.fields if not isinstance(model._meta.get_field(n), models.ForeignKey)
            }
    return names


@pytest.mark.parametrize("model", _row_models())
def test_a_forged_row_is_named(world, model):
    """A copy of a real row with its keys changed (what an attacker inserting a row writes)."""
    row = _row(model, world, "")
    values = {f.attname: getattr(row, f.attname) for f in model._meta.concrete_fields if not f.primary_key}
    unique = _unique_names(model)
    for f in model._meta.concrete_fields:
        keyed = f.name in unique and not f.primary_key and values[f.attname] is not None
        if keyed and not (isinstance(f, models.ForeignKey) and f.db_constraint):
            values[f.attname] = _changed(f, values[f.attname], world)
    model.objects.bulk_create([model(**values)])
    assert_caught(*_names(model, values), incremental="caught")  # a row above its watermark


# --------------------------------------------------------------------------------------------------
# The attacks of the issue, by name
# --------------------------------------------------------------------------------------------------
def _rewrite_content(run_id: str, content: str) -> None:
    """Rewrite a run's released content, its RUN_FINISHED digest and its chain (all with the project's
    functions): only the transparency log can still tell."""
    DiagnosisRun.objects.filter(run_id=run_id).update(content=content)
    run = DiagnosisRun.objects.get(run_id=run_id)
    finished = TraceEvent.objects.get(run_id=run_id, event_type=EventType.RUN_FINISHED)
    details = {
        **finished.details,
        "runDigest": row_digests.run_form(finished.details["runForm"]).digest_of(run),
    }
    TraceEvent.objects.filter(pk=finished.pk).update(details=details)
    rehash_chain(run_id, start=finished.sequence_no)


def test_attack_anchored_run_rewritten_and_rehashed_after_its_leaf_run_id_is_nulled(world):
    """Issue 30: the leaf's `run_id` set to NULL hides the run from its anchor; the next checkpoint
    would even sign the rewrite as a new leaf. The signed leaf data still names the run."""
    LogLeaf.objects.filter(run_id=world.chat).update(run_id=None)
    _rewrite_content(world.chat, "Reboot the host; nothing else is needed.")
    checkpoint()
    assert_caught(*run_named(world.chat))


def test_attack_anchored_run_deleted_whole_after_its_leaf_run_id_is_nulled(world):
    LogLeaf.objects.filter(run_id=world.chat).update(run_id=None)
    for model in (TraceEvent, AgentStep, ToolInvocation, AgentReasoningAudit, RunReview):
        model.objects.filter(run_id=world.chat).delete()
    DiagnosisRun.objects.filter(run_id=world.chat).delete()
    checkpoint()
    assert_caught(*run_named(world.chat))


def test_attack_governance_grant_deleted_renumbered_rehashed_with_leaves_unlinked(world):
    """Issue 30: a reasoning-access grant deleted from the governance chain, the chain renumbered and
    re-hashed, the governance leaves' `governance_sequence_no` set to NULL."""
    GovernanceEvent.objects.filter(sequence_no=world.grant_sequence).delete()
    prev = GENESIS_HASH
    for number, event in enumerate(GovernanceEvent.objects.order_by("sequence_no"), start=1):
        payload = governance_payload(
            sequence_no=number,
            event_type=event.event_type,
            actor=event.actor,
            subject_user=event.subject_user,
            group=event.group,
            permission=event.permission,
            details=event.details,
            created_at=event.created_at,
        )
        digest = chain_hash(prev, payload)
        GovernanceEvent.objects.filter(pk=event.pk).update(sequence_no=number, prev_hash=prev, hash=digest)
        prev = digest
    LogLeaf.objects.filter(governance_sequence_no__isnull=False).update(governance_sequence_no=None)
    assert_caught("governance INVALID")


def test_attack_review_flipped_after_a_checkpoint(world):
    """Issue 30: an auditor's `unsafe` review rewritten to `correct` after a checkpoint: row, event
    details, digest and hashes all recomputed with the project's functions."""
    RunReview.objects.filter(review_id=world.review_id).update(verdict="correct")
    review = RunReview.objects.get(review_id=world.review_id)
    event = TraceEvent.objects.get(run_id=world.chat, sequence_no=review.sequence_no)
    details = {**event.details, "reviewDigest": row_digests.REVIEW.digest_of(review)}
    if "verdict" in details:
        details["verdict"] = "correct"
    TraceEvent.objects.filter(pk=event.pk).update(
        details=details, summary=event.summary.replace("unsafe", "correct")
    )
    rehash_chain(world.chat, start=review.sequence_no)
    DiagnosisRun.objects.filter(run_id=world.chat).update(review_verdict="correct")
    assert_caught(*run_named(world.chat))


def test_attack_hold_row_deleted_then_the_retention_purge_removes_the_held_run(world):
    """Issue 30: the hold's row deleted (its LEGAL_HOLD_PLACED stays chained), then the retention
    purge is run to remove the held run: the chain still holds it, so the purge keeps it, and the
    deleted row is named."""
    LegalHold.objects.filter(pk=world.hold_id).delete()
    report = purge_expired_runs(now=timezone.now(), retention_days=0)
    assert world.failed not in report.purged
    assert DiagnosisRun.objects.filter(run_id=world.failed).exists()
    assert_caught(f"legal hold {world.hold_id}")


@pytest.mark.parametrize(
    ("run", "column", "value"),
    [
        ("chat", "query", "Delete every log file"),
        ("chat", "intent", "CHITCHAT"),
        ("failed", "error_message", "user cancelled"),
        ("chat", "agent_flow", "AI_OPS"),
    ],
)
def test_attack_question_intent_error_of_a_run_changed(world, run, column, value):
    """Issue 30: no digest covered the user's question, the run's intent or its error."""
    run_id = getattr(world, run)
    DiagnosisRun.objects.filter(run_id=run_id).update(**{column: value})
    assert_caught(*run_named(run_id))


def test_attack_owner_of_a_session_changed(world):
    session_id = DiagnosisRun.objects.get(run_id=world.chat).session_id
    ChatSession.objects.filter(session_id=session_id).update(owner_id=world.other_user)
    assert_caught(f"session {session_id}")


def test_a_deleted_session_is_named_by_its_runs(world):
    """A session row is in ROWS_EXCLUDED as a table (an empty one records nothing), but one with runs
    is bound by each of them."""
    session = DiagnosisRun.objects.get(run_id=world.chat).session
    if not _raw_delete(ChatSession, session.pk):
        assert ChatSession.objects.filter(pk=session.pk).exists()  # MariaDB: the runs' foreign key refuses
        return
    assert_caught(f"session {session.session_id} missing")


def test_attack_run_moved_to_another_owners_session(world):
    DiagnosisRun.objects.filter(run_id=world.chat).update(session_id=world.other_session)
    assert_caught(*run_named(world.chat))


# --------------------------------------------------------------------------------------------------
# Re-hashing attacks: everything an attacker can recompute without the signing key
# --------------------------------------------------------------------------------------------------
def _reanchor(run_id: str) -> None:
    """Rebuild the run's leaf column and leaf hash from its rewritten chain, with the project's own
    functions (`leafdata.run_leaf`, `merkle.leaf_hash`): only the signed root can still tell."""
    events = list(TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no"))
    session_id = DiagnosisRun.objects.get(run_id=run_id).session_id
    data = leafdata.encode(leafdata.run_leaf(run_id=run_id, session_id=session_id, events=events))
    LogLeaf.objects.filter(run_id=run_id).update(
        data=data.decode("utf-8"), leaf_hash=merkle.leaf_hash(data).hex()
    )


def test_rehash_rewritten_content_with_its_digest_chain_and_leaf(world):
    _rewrite_content(world.chat, "Reboot the host; nothing else is needed.")
    _reanchor(world.chat)
    assert_caught_run(world.chat)


def test_rehash_rewritten_question_with_its_start_digest_chain_and_leaf(world):
    DiagnosisRun.objects.filter(run_id=world.chat).update(query="Delete every log file")
    run = DiagnosisRun.objects.get(run_id=world.chat)
    started = TraceEvent.objects.get(run_id=world.chat, event_type=EventType.RUN_STARTED)
    details = {**started.details, "startDigest": row_digests.RUN_START.digest_of(run)}
    TraceEvent.objects.filter(pk=started.pk).update(details=details)
    rehash_chain(world.chat)
    _reanchor(world.chat)
    assert_caught_run(world.chat)


def test_rehash_rewritten_step_with_its_digest_and_chain(world):
    step = AgentStep.objects.filter(run_id=world.chat).order_by("step_index").first()
    AgentStep.objects.filter(pk=step.pk).update(finish_reason="stop")
    step.refresh_from_db()
    event = TraceEvent.objects.get(
        run_id=world.chat,
        event_type=EventType.AGENT_MODEL_STEP,
        details__stepIndex=step.step_index,
        details__agentName=step.agent_name,
    )
    TraceEvent.objects.filter(pk=event.pk).update(
        details={**event.details, "stepDigest": row_digests.STEP.digest_of(step)}
    )
    rehash_chain(world.chat, start=event.sequence_no)
    assert_caught(*run_named(world.chat))


def test_a_leaf_hash_that_is_not_hexadecimal_is_named_not_a_crash(world):
    """Fail closed (issue 30 item 9): a column the verifier decodes, written as no writer would, is a
    problem named by its row, never an exception that ends the verification."""
    leaf = LogLeaf.objects.get(run_id=world.chat)
    LogLeaf.objects.filter(pk=leaf.pk).update(leaf_hash="z" * 64)
    assert_caught(*_names(LogLeaf, leaf))


# --------------------------------------------------------------------------------------------------
# Every excluded column: what its reason says (issue 43 item 7)
# --------------------------------------------------------------------------------------------------
def _excluded_cases():
    for model in coverage.AUDITED:
        for name in coverage.EXCLUDED[model]:
            kind = "compared" if coverage.compared(model, name) else "inert"
            yield pytest.param(model, name, kind, id=f"{model.__name__}.{name}[{kind}]")


@pytest.mark.parametrize(("model", "name", "kind"), list(_excluded_cases()))
def test_an_excluded_column_does_what_its_reason_says(world, model, name, kind):
    """A column the registry says verify_audit compares (a stored fact recomputed from the chain, a
    counter of lost writes, the key a chained event names) fails it when changed; every other excluded
    column decides nothing verify_audit concludes: changed, the verdict stays what it was."""
    if model is TailPending:  # a note is written by an append after the last checkpoint: make one
        other = get_user_model().objects.get(pk=world.other_user)
        record_feedback(run=DiagnosisRun.objects.get(run_id=world.chat), user=other, rating="up")
        assert verify()[0]
    try:
        row = TailPending.objects.get(run_id=world.chat) if model is TailPending else _row(model, world, "")
    except (AssertionError, model.DoesNotExist):
        pytest.fail(
            f"the matrix's world holds no row of {model.__name__}: its reason is not held to anything"
        )
    f = model._meta.get_field(name)
    before = getattr(row, f.attname)
    after = _changed(f, before, world)
    if not _update(model, row.pk, **{f.attname: after}):
        return  # the database refuses the write (a foreign key or unique constraint): nothing changed
    if kind == "compared":
        names = _names(model, row) if model in (LegalHold, ReasoningAccessLog) else ()
        run_id = getattr(row, "run_id", None)
        assert_caught(*names, *(run_named(run_id) if run_id else ()))
    else:
        ok, out = verify()
        assert ok, f"{model.__name__}.{name} is excluded as deciding nothing, yet changing it fails:\n{out}"


# --------------------------------------------------------------------------------------------------
# Insertions (issue 43 item 8): forged with the project's own functions, before and after the next
# checkpoint; each fails verify_audit, is named, and a forged run is never anchored
# --------------------------------------------------------------------------------------------------
def _after_a_checkpoint(*names: str) -> None:
    assert_caught(*names, incremental="caught")
    checkpoint()
    assert_caught(*names, incremental="caught")


@pytest.mark.parametrize("copy_tags", [False, True], ids=["untagged", "tags-copied"])
def test_insertion_a_run_that_never_executed(world, copy_tags):
    """Issue 43: a complete session + run + timeline + steps + tools + copied reasoning rows under new
    ids, with another question and an answer telling readers to wipe their logs; every digest and link
    recomputed with the project's functions."""
    forged = forge_run(
        world.chat,
        question="How do I free disk space?",
        answer="Run rm -rf /var/log/* now.",
        copy_tags=copy_tags,
    )
    problem = "tag by write key" if copy_tags else "no write tag"
    assert_caught(f"run={forged} INVALID sequences 1–", incremental="caught")
    result = checkpoint()
    assert forged in result.refused
    assert not LogLeaf.objects.filter(run_id=forged).exists()
    out = assert_caught(f"run={forged} INVALID", incremental="caught")
    assert problem in out
    assert GovernanceEvent.objects.filter(event_type=GovernanceEventType.ANCHOR_REFUSED).exists()


def test_insertion_a_bare_finished_run_row(world):
    run = DiagnosisRun.objects.get(run_id=world.chat)
    bare = _copy_row(DiagnosisRun, run, run_id=run.run_id[:-4] + "beef")
    assert_caught(f"run={bare.run_id} INVALID finished run without a chain", incremental="caught")
    assert bare.run_id in checkpoint().refused
    assert not LogLeaf.objects.filter(run_id=bare.run_id).exists()
    assert_caught(f"run={bare.run_id} INVALID", incremental="caught")


def _appended_cases():
    from audit.events import APPENDED_EVENTS

    for event_type in sorted(APPENDED_EVENTS | {"APPROVAL_DECIDED", "RUN_FINISHED"}):
        yield pytest.param(event_type, id=event_type)


@pytest.mark.parametrize("event_type", list(_appended_cases()))
def test_insertion_an_event_appended_to_a_finished_run(world, event_type):
    """Every event type anything appends to a finished run (and two the recorder writes), forged at the
    head of an anchored run's chain with its tail note: named, and its tail never anchored."""
    leaves = LogLeaf.objects.filter(tail_of=world.chat).count()
    details = {
        "REVIEW_RECORDED": {"reviewId": "rev_forged", "verdict": "correct", "reviewer": "nobody"},
        "APPROVAL_DECIDED": {"toolCallId": "call_x", "decision": "APPROVED", "decidedBy": "nobody"},
        "EVALUATION_RECORDED": {"scoreId": "sco_forged", "value": 1.0},
        "REASONING_REKEYED": {"rows": []},
        "REASONING_PURGED": {"rows": []},
    }.get(event_type, {})
    event = forge_event(world.chat, event_type, details, status="FORGED")
    _after_a_checkpoint(f"run={world.chat} INVALID sequence {event.sequence_no}: no write tag")
    assert LogLeaf.objects.filter(tail_of=world.chat).count() == leaves


def test_insertion_an_event_with_a_tag_copied_from_a_real_one(world):
    real = TraceEvent.objects.filter(run_id=world.chat).order_by("-sequence_no").first()
    event = forge_event(world.chat, "REVIEW_RECORDED", {"verdict": "correct"}, tag=real.tag)
    _after_a_checkpoint(f"run={world.chat} INVALID sequence {event.sequence_no}: tag by write key")


@pytest.mark.parametrize("event_type", ["GROUP_MEMBER_ADDED", "LEGAL_HOLD_LIFTED", "AUDIT_RUNS_PURGED"])
def test_insertion_a_governance_event(world, event_type):
    """A forged grant, a forged lift of the hold on the failed run, a purge backdated before that hold:
    named; none of them decides anything (the hold still holds, the grant grants nothing)."""
    hold = LegalHold.objects.get(pk=world.hold_id)
    details = {
        "GROUP_MEMBER_ADDED": {"userId": world.other_user},
        "LEGAL_HOLD_LIFTED": {"holdId": hold.pk, "scope": hold.scope, "targetId": hold.target_id},
        "AUDIT_RUNS_PURGED": {"runIds": [world.failed], "runs": 1, "retentionDays": 0},
    }[event_type]
    forged = forge_governance(
        event_type,
        actor="matrix-root",
        details=details,
        subject_user="matrix-other",
        group=REASONING_GROUP,
        created_at=hold.placed_at - dt.timedelta(days=1),
    )
    other = get_user_model().objects.get(pk=world.other_user)
    assert not authority.permitted(other, "reasoning.view_reasoning_content")
    assert DiagnosisRun.objects.filter(held(), run_id=world.failed).exists()  # the forged lift lifts nothing
    with pytest.raises(ChainNotAuthentic):  # nothing is chained after a forged head: the purge stops
        purge_expired_runs(now=timezone.now(), retention_days=0)
    assert DiagnosisRun.objects.filter(run_id=world.failed).exists()
    _after_a_checkpoint(f"governance INVALID governance event {forged.sequence_no}: no write tag")


def test_insertion_a_reasoning_read_row_and_a_deleted_one(world):
    row = _row(ReasoningAccessLog, world, "")
    _copy_row(ReasoningAccessLog, row, accessed_at=row.accessed_at)
    assert_caught("no chained REASONING_READ records it", incremental="caught")
    ReasoningAccessLog.objects.filter(pk=row.pk).delete()
    assert_caught(f"reasoning read {row.pk} (governance event", incremental="caught")


def test_attack_the_review_queue_emptied_on_the_run_rows(world):
    """Issue 43: the run's review facts (`needs_review`, `reviewed_at`, `review_verdict`, `downvoted`)
    were never compared with the chain: setting them empties the queue."""
    DiagnosisRun.objects.filter(run_id=world.chat).update(
        needs_review=False, downvoted=False, review_verdict="correct"
    )
    out = assert_caught(f"run={world.chat} FACTS")
    assert "stored downvoted is False, the chain says True" in out
    assert "stored review_verdict is 'correct', the chain says 'unsafe'" in out


def test_attack_a_stored_prompt_text_changed(world):
    row = _row(RunConfiguration, world, "")
    role = sorted(row.prompts)[0]
    RunConfiguration.objects.filter(pk=row.pk).update(prompts={**row.prompts, role: "Always say yes."})
    assert_caught(f"configuration {row.fingerprint[:12]}: the prompt text of {role} does not hash")


def _copy_row(model, row, **changes):
    values = {f.attname: getattr(row, f.attname) for f in model._meta.concrete_fields if not f.primary_key}
    values.update(changes)
    return model.objects.create(**values)
