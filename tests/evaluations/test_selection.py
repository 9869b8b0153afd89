"""Which runs an evaluator scores (filter and deterministic sample), the worker's pass and its claims,
the review queue fed by scores, and the OpenTelemetry export — on runs the real runtime executed against
the local OpenAI-compatible server."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from django.core.management import call_command
from django.utils import timezone
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from diagnosis.models import DiagnosisRun
from diagnosis.review_queue import queue_counts, queued_runs, reasons_of
from evaluations import otel
from evaluations.models import EvaluationClaim, EvaluationScore, Evaluator, EvaluatorKind
from evaluations.scorers import claims, sampled
from evaluations.services import claim, evaluate_run
from telemetry.spans import span_id_of, trace_id_of
from tests.agent.runtime.support import ask, script_reasoned_diagnosis
from tests.fakes.openai_server import stream_answer, usage

JUDGE = "fake-judge"


def test_sampling_is_reproducible_proportional_and_the_same_for_every_version():
    v1 = Evaluator(name="groundedness", version=1, kind=EvaluatorKind.LLM_JUDGE, sample_rate=0.3)
    v2 = Evaluator(name="groundedness", version=2, kind=EvaluatorKind.LLM_JUDGE, sample_rate=0.3)
    other = Evaluator(name="citations", version=1, kind=EvaluatorKind.CITATION_COVERAGE, sample_rate=0.3)
    ids = [f"run_{i:06d}" for i in range(4000)]
    picked = [r for r in ids if sampled(evaluator=v1, run_id=r)]
    assert 0.27 < len(picked) / len(ids) < 0.33
    assert picked == [r for r in ids if sampled(evaluator=v1, run_id=r)]  # the same runs again
    assert picked == [r for r in ids if sampled(evaluator=v2, run_id=r)]  # a new version, the same sample
    assert picked != [r for r in ids if sampled(evaluator=other, run_id=r)]  # another evaluator, another
    assert all(sampled(evaluator=Evaluator(name="x", sample_rate=1.0), run_id=r) for r in ids[:50])
    assert not any(sampled(evaluator=Evaluator(name="x", sample_rate=0.0), run_id=r) for r in ids[:50])


def test_claims_are_sentences_and_items_not_headings_code_or_confidence():
    answer = (
        "## Diagnosis\n"
        "The disk is full because logs grow [kb:disk-full#1]. Rotation is off.\n"
        "- Find the biggest directories with du [kb:disk-full#2]\n"
        "```\ndu -xh /var/log\n```\n"
        "Confidence: high"
    )
    assert claims(answer) == [
        "The disk is full because logs grow [kb:disk-full#1].",
        "Rotation is off.",
        "Find the biggest directories with du [kb:disk-full#2]",
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "corpus")
def test_filters_and_sample_choose_the_evaluators_and_the_worker_scores_once(llm, user):
    script_reasoned_diagnosis(llm)
    run, _, _ = ask(user, "Disk full on /var/log")
    assert (run.intent, run.release_decision) == ("DIAGNOSIS", "PUBLISHED")
    taken = [
        Evaluator.objects.create(name="any", kind=EvaluatorKind.CITATION_COVERAGE),
        Evaluator.objects.create(
            name="published-diagnoses",
            kind=EvaluatorKind.ANSWER_LENGTH,
            max_chars=2000,
            flows="DIAGNOSIS_AGENT",
            intents="DIAGNOSIS",
            release_decisions="PUBLISHED",
        ),
    ]
    Evaluator.objects.create(
        name="blocked-only", kind=EvaluatorKind.CITATION_COVERAGE, release_decisions="BLOCKED"
    )
    Evaluator.objects.create(name="ai-ops-only", kind=EvaluatorKind.CITATION_COVERAGE, flows="AI_OPS")
    Evaluator.objects.create(name="never-sampled", kind=EvaluatorKind.CITATION_COVERAGE, sample_rate=0.0)
    Evaluator.objects.create(name="disabled", kind=EvaluatorKind.CITATION_COVERAGE, enabled=False)
    out = io.StringIO()
    call_command("run_evaluations", "--once", stdout=out)
    assert "2 recorded" in out.getvalue()
    scored = set(EvaluationScore.objects.filter(run_id=run.run_id).values_list("evaluator_name", flat=True))
    assert scored == {e.name for e in taken}
    length = EvaluationScore.objects.get(run_id=run.run_id, evaluator_name="published-diagnoses")
    assert (length.label, length.value) == ("within", 1.0)
    # A second pass finds nothing left to do.
    out = io.StringIO()
    call_command("run_evaluations", "--once", stdout=out)
    assert "0 recorded" in out.getvalue()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "corpus")
def test_a_claim_keeps_a_second_worker_off_until_it_is_stale(llm, user, settings):
    script_reasoned_diagnosis(llm)
    run, _, _ = ask(user, "Disk full on /var/log")
    evaluator = Evaluator.objects.create(name="citations", kind=EvaluatorKind.CITATION_COVERAGE)
    assert claim(run_id=run.run_id, evaluator=evaluator, owner="worker-a")
    assert not claim(run_id=run.run_id, evaluator=evaluator, owner="worker-b")
    # The worker holding the claim died: once stale, another takes it over.
    settings.EVALUATION_CLAIM_SECONDS = 60
    EvaluationClaim.objects.update(claimed_at=timezone.now() - dt.timedelta(minutes=5))
    assert claim(run_id=run.run_id, evaluator=evaluator, owner="worker-b")
    assert EvaluationClaim.objects.get().owner == "worker-b"
    # While worker-b holds it, this process's pass skips the pair; released, it scores it.
    assert evaluate_run(run_id=run.run_id) == []
    EvaluationClaim.objects.all().delete()
    (score,) = evaluate_run(run_id=run.run_id)
    assert not EvaluationClaim.objects.exists()  # released after recording
    assert not claim(run_id=run.run_id, evaluator=evaluator, owner="worker-c")  # scored: nothing to claim
    assert score.evaluator_id == evaluator.pk


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "corpus")
def test_a_judge_finding_the_answer_unsupported_queues_the_run_and_the_score_is_exported(llm, user):
    script_reasoned_diagnosis(llm)
    run, _, _ = ask(user, "Disk full on /var/log")
    run.refresh_from_db()
    assert not run.needs_review
    verdict = {"score": 0.0, "label": "unsupported", "explanation": "The du claim cites the wrong chunk."}
    llm.add(JUDGE, stream_answer(json.dumps(verdict), usage=usage(400, 30)))
    judge = Evaluator.objects.create(name="groundedness", kind=EvaluatorKind.LLM_JUDGE, judge_model=JUDGE)
    (score,) = evaluate_run(run_id=run.run_id, evaluators=[judge])
    assert (score.label, score.value) == ("unsupported", 0.0)

    run.refresh_from_db()
    assert run.needs_review
    (queued,) = list(queued_runs(reason_key="evaluation"))
    assert queued.run_id == run.run_id
    assert "flagged by an online evaluator" in [r.label for r in reasons_of(queued)]
    _total, per_reason = queue_counts()
    assert {c.key: c.count for c in per_reason}["evaluation"] == 1

    # OpenTelemetry: one gen_ai.evaluation.result span, a child of the run's root span.
    exporter = InMemorySpanExporter()
    assert otel.export_scores(run=run, scores=[score], exporter=exporter)
    (span,) = exporter.get_finished_spans()
    assert span.name == "gen_ai.evaluation.result"
    assert span.context.trace_id == trace_id_of(run.run_id)
    assert span.parent.span_id == span_id_of(run.run_id, "run")
    attributes = dict(span.attributes)
    assert attributes["gen_ai.evaluation.name"] == "groundedness"
    assert attributes["gen_ai.evaluation.score.value"] == 0.0
    assert attributes["gen_ai.evaluation.score.label"] == "unsupported"
    assert attributes["diagnosis.evaluation.evaluator.version"] == 1
    assert attributes["gen_ai.request.model"] == JUDGE
    assert attributes["gen_ai.usage.input_tokens"] == 400
    # A judge's explanation is model output about the run: exported only when content capture is on.
    assert "gen_ai.evaluation.explanation" not in attributes
    assert span.events[0].name == "gen_ai.evaluation.result"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "corpus")
def test_a_deterministic_explanation_is_exported_and_content_capture_adds_the_judges(llm, user, settings):
    script_reasoned_diagnosis(llm)
    run, _, _ = ask(user, "Disk full on /var/log")
    citations = Evaluator.objects.create(name="citations", kind=EvaluatorKind.CITATION_COVERAGE)
    (score,) = evaluate_run(run_id=run.run_id, evaluators=[citations])
    attributes = otel.attributes_of(score)
    assert attributes["gen_ai.evaluation.explanation"].startswith("1 of 1 claims cite evidence")
    judged = EvaluationScore(
        **{f.attname: getattr(score, f.attname) for f in EvaluationScore._meta.concrete_fields},
    )
    judged.kind, judged.explanation = EvaluatorKind.LLM_JUDGE, "claims checked"
    assert "gen_ai.evaluation.explanation" not in otel.attributes_of(judged)
    settings.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = True
    assert otel.attributes_of(judged)["gen_ai.evaluation.explanation"] == "claims checked"
    assert DiagnosisRun.objects.filter(run_id=run.run_id, needs_review=False).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "corpus")
def test_the_worker_scores_only_runs_finished_within_the_look_back(llm, user, settings):
    script_reasoned_diagnosis(llm)
    run, _, _ = ask(user, "Disk full on /var/log")
    Evaluator.objects.create(name="citations", kind=EvaluatorKind.CITATION_COVERAGE)
    DiagnosisRun.objects.filter(run_id=run.run_id).update(finished_at=timezone.now() - dt.timedelta(hours=3))
    settings.EVALUATION_LOOKBACK_HOURS = 2
    call_command("run_evaluations", "--once", stdout=io.StringIO())
    assert not EvaluationScore.objects.exists()
    settings.EVALUATION_LOOKBACK_HOURS = 4
    call_command("run_evaluations", "--once", stdout=io.StringIO())
    assert EvaluationScore.objects.filter(run_id=run.run_id).count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "corpus")
def test_experiment_replays_are_left_to_their_experiment_and_out_of_production_figures(llm, user):
    from diagnosis.models import RunPurpose
    from evaluations.metrics import evaluation_metrics
    from evaluations.selectors import by_fingerprint

    script_reasoned_diagnosis(llm)
    run, _, _ = ask(user, "Disk full on /var/log")
    DiagnosisRun.objects.filter(run_id=run.run_id).update(purpose=RunPurpose.EXPERIMENT)
    citations = Evaluator.objects.create(name="citations", kind=EvaluatorKind.CITATION_COVERAGE)
    call_command("run_evaluations", "--once", stdout=io.StringIO())
    assert not EvaluationScore.objects.exists()  # the worker scores production runs only
    (score,) = evaluate_run(run_id=run.run_id, evaluators=[citations])  # what an experiment calls
    assert score.label == "covered"
    now = timezone.now()
    assert by_fingerprint(since=now - dt.timedelta(days=1), until=now + dt.timedelta(days=1)) == []
    mean = next(m for m in evaluation_metrics() if m.name == "diagnosis_evaluation_score_mean")
    assert mean.samples == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "corpus")
def test_a_score_is_exported_over_otlp_http_when_recorded(llm, user, settings):
    """The real OTLP/HTTP exporter (`telemetry.outbox.make_exporter`) posts the score's span to the
    configured endpoint as it is recorded: a local receiver decodes the protobuf it gets."""
    import http.server
    import threading as _threading

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received: list[ExportTraceServiceRequest] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            received.append(request)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    thread = _threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        settings.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = f"http://127.0.0.1:{server.server_port}/v1/traces"
        script_reasoned_diagnosis(llm)
        run, _, _ = ask(user, "Disk full on /var/log")
        citations = Evaluator.objects.create(name="citations", kind=EvaluatorKind.CITATION_COVERAGE)
        (score,) = evaluate_run(run_id=run.run_id, evaluators=[citations])
    finally:
        server.shutdown()
        server.server_close()
    spans = [s for r in received for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    (span,) = [s for s in spans if s.name == "gen_ai.evaluation.result"]
    assert int.from_bytes(span.trace_id, "big") == trace_id_of(run.run_id)
    assert int.from_bytes(span.parent_span_id, "big") == span_id_of(run.run_id, "run")
    attributes = {a.key: a.value for a in span.attributes}
    assert attributes["gen_ai.evaluation.name"].string_value == "citations"
    assert attributes["gen_ai.evaluation.score.label"].string_value == "covered"
    assert attributes["gen_ai.evaluation.score.value"].double_value == 1.0
    assert attributes["diagnosis.evaluation.evaluator.version"].int_value == 1
    assert attributes["diagnosis.evaluation.score.id"].string_value == score.score_id
    assert "cite evidence" in attributes["gen_ai.evaluation.explanation"].string_value


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "corpus")
def test_a_failing_judge_is_retried_by_later_passes_then_recorded_as_a_judge_error(llm, user, settings):
    from tests.fakes.openai_server import HTTPError

    settings.LLM_MAX_RETRIES = 0
    settings.EVALUATION_JUDGE_ATTEMPTS = 2
    settings.EVALUATION_CLAIM_SECONDS = 60
    script_reasoned_diagnosis(llm)
    run, _, _ = ask(user, "Disk full on /var/log")
    Evaluator.objects.create(name="groundedness", kind=EvaluatorKind.LLM_JUDGE, judge_model=JUDGE)
    down = HTTPError(503, body={"error": {"message": "overloaded"}}, headers={"x-should-retry": "false"})
    llm.add(JUDGE, down, down)

    def one_pass() -> str:
        out = io.StringIO()
        call_command("run_evaluations", "--once", stdout=out)
        return out.getvalue()

    assert "0 recorded, 0 skipped, 1 failed" in one_pass()
    assert not EvaluationScore.objects.exists() and EvaluationClaim.objects.get().attempts == 2
    assert "0 recorded, 1 skipped" in one_pass()  # the claim is not stale yet: nobody retries
    EvaluationClaim.objects.update(claimed_at=timezone.now() - dt.timedelta(minutes=2))
    assert "1 recorded" in one_pass()  # the last attempt failed too: recorded as such
    score = EvaluationScore.objects.get(run_id=run.run_id)
    assert (score.label, score.value, score.judge_model) == ("judge_error", None, JUDGE)
    assert len(llm.requests[JUDGE]) == 2 and not EvaluationClaim.objects.exists()
    from audit.models import EventType, TraceEvent

    event = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.EVALUATION_RECORDED)
    assert event.details["judgeError"] and event.details["judgeAttempts"][0]["status"] == 503
