"""`manage.py diagnose` with the demo provider and with the local fake provider, and the demo runs of
`manage.py bootstrap_demo`."""

import io
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command

from diagnosis.models import DiagnosisRun, ReleaseDecision
from tests.agent.runtime.support import AGENT, Provider, evidence_ids, load_corpus, use_fake_llm
from tests.fakes.openai_server import FakeLLMServer, stream_answer, stream_tool_calls, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]
RUNBOOKS = Path(django_settings.BASE_DIR) / "runbooks"


def diagnose(*args):
    out = io.StringIO()
    call_command("diagnose", *args, stdout=out)
    return out.getvalue()


def test_diagnose_with_the_demo_provider(settings, user):
    settings.LLM_PROVIDER = "demo"
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())
    output = diagnose("Nginx returns 502 Bad Gateway after the deploy", "--user", user.username)
    run = DiagnosisRun.objects.get()
    assert run.release_decision == ReleaseDecision.PUBLISHED
    assert "[routing] finished: intent DIAGNOSIS" in output and "[tool] lookup_knowledge RUNNING" in output
    assert "[release] finished: verdict PUBLISHED" in output
    assert "Unverified draft:" not in output  # the default release policy streams no draft
    assert "Answer (SUCCESS, release PUBLISHED):" in output and "[kb:nginx-502-bad-gateway#" in output
    assert run.content in output and f"Run {run.run_id}" in output
    assert "#1 demo-agent  finish tool_calls" in output and "lookup_knowledge SUCCEEDED" in output
    assert "chain valid, audit complete" in output and "reconciled yes" in output
    assert "RELEASE_DECISION" in output and "RUN_FINISHED" in output
    assert "Provider: demo (DEMO: offline demo model" in output

    # --session continues the conversation as the session's owner.
    output = diagnose("hello", "--session", run.session_id)
    second = DiagnosisRun.objects.exclude(pk=run.pk).get()
    assert second.session_id == run.session_id and second.intent == "CHITCHAT"
    assert "Answer (SUCCESS, release PUBLISHED):" in output


def test_diagnose_with_the_local_fake_provider(settings, user, tmp_path):
    load_corpus(tmp_path / "kb")
    with FakeLLMServer() as server:
        use_fake_llm(settings, server)
        provider = Provider(server)
        provider.route("DIAGNOSIS", usage=usage(20, 5))
        provider.add(
            AGENT,
            stream_tool_calls(
                [("call_1", "lookup_knowledge", '{"query": "disk full /var/log"}')],
                reasoning="Search first.",
                usage=usage(200, 20, reasoning=5),
            ),
            lambda request: stream_answer(
                f"Find the largest log directories with du [{evidence_ids(request)[0]}].",
                reasoning="Cite it.",
                usage=usage(400, 30, reasoning=4),
            ),
        )
        provider.supported(usage=usage(100, 10))
        output = diagnose("Disk full on /var/log", "--user", user.username)
    run = DiagnosisRun.objects.get()
    assert run.release_decision == ReleaseDecision.PUBLISHED and "[kb:disk-full#" in run.content
    assert "Answer (SUCCESS, release PUBLISHED):" in output and run.content in output
    assert "#1 fake-agent  finish tool_calls  tokens 220  reasoning yes" in output
    assert "Tokens: router 25, agent 650, guard 110, total 785" in output and "reconciled yes" in output
    assert "Provider: openai\n" in output and "DEMO" not in output


def test_diagnose_refuses_unknown_users_sessions_and_empty_questions(user):
    with pytest.raises(CommandError, match="No user named"):
        diagnose("q", "--user", "nobody")
    with pytest.raises(CommandError, match="does not exist"):
        diagnose("q", "--session", "ses_missing")
    with pytest.raises(CommandError, match="empty"):
        diagnose("   ", "--user", user.username)
    assert not DiagnosisRun.objects.exists()


def test_bootstrap_demo_creates_demo_runs_once(settings):
    settings.DEBUG = True
    settings.LLM_PROVIDER = "openai"  # the demo runs always use the offline demo model
    out = io.StringIO()
    call_command("bootstrap_demo", stdout=out)
    runs = list(DiagnosisRun.objects.order_by("created_at"))
    assert len(runs) == 4 and {r.session.owner.username for r in runs} == {"staff"}
    assert [r.release_decision for r in runs] == ["PUBLISHED", "PUBLISHED", "PUBLISHED", "BLOCKED"]
    assert [r.intent for r in runs][2] == "CHITCHAT" and all(r.tokens_reconciled for r in runs)
    assert "Demo runs (offline demo model, user staff):" in out.getvalue()
    # Anchored at once: `verify_audit` straight after `make run`'s start-up finds nothing to report.
    assert "appended 4 run(s)" in out.getvalue()
    verified = io.StringIO()
    call_command("verify_audit", stdout=verified)  # raises on any problem
    assert "verified 4 run(s): 4 ok" in verified.getvalue()
    call_command("bootstrap_demo", stdout=io.StringIO())
    assert DiagnosisRun.objects.count() == 4
