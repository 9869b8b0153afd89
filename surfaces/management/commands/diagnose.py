"""`manage.py diagnose "question" [--session ID] [--user NAME]`: run the diagnosis pipeline from a shell.

Prints the run's stages and tool status as they happen (and, under `CHAT_RELEASE=draft`, the unverified
draft as it streams), then prints the released answer, the release
decision and a one-screen trace summary read back from the database (`audit.read.get_trace`).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from agent.runtime.events import DraftEvent, ErrorEvent, OutcomeEvent, ProgressEvent, ToolEvent
from agent.runtime.executor import SessionNotFound, run_to_completion
from audit.read import get_trace
from diagnosis.models import ChatSession, DiagnosisRun


class PrintSink:
    """Writes live events to the command's stdout: stage lines, tool status lines, and draft text as it
    streams (draft release policy only, marked unverified)."""

    def __init__(self, out) -> None:
        self.out = out
        self.streaming = False

    async def emit(self, event) -> None:
        if isinstance(event, DraftEvent):
            if not self.streaming:
                self.out.write("Unverified draft:")
                self.streaming = True
            self.out.write(event.text, ending="")
            self.out.flush()
            return
        if self.streaming:
            self.out.write("")
            self.streaming = False
        if isinstance(event, ProgressEvent):
            facts = [
                f"{label} {value}"
                for label, value in (
                    ("step", event.step_index),
                    ("intent", event.intent),
                    ("verdict", event.verdict),
                )
                if value is not None
            ]
            self.out.write(
                f"  [{event.stage.lower()}] {event.status.lower()}"
                + (f": {', '.join(facts)}" if facts else "")
            )
        elif isinstance(event, ToolEvent):
            self.out.write(f"  [tool] {event.name} {event.status} ({event.tool_call_id})")
        elif isinstance(event, ErrorEvent):
            self.out.write(f"  [error] {event.code}: {event.message}")
        elif isinstance(event, OutcomeEvent):
            self.out.write(f"  [outcome] {event.status} {event.release_decision or '-'}")


class Command(BaseCommand):
    help = "Run the diagnosis agent on a question and print the answer and a summary of its trace."

    def add_arguments(self, parser):
        parser.add_argument("question", help="the question to diagnose")
        parser.add_argument(
            "--session", help="continue this session (its last published answers are context)"
        )
        parser.add_argument(
            "--user", help="run as this user (default: the session's owner, else the first superuser)"
        )

    def handle(self, *args, question: str, session: str | None = None, user: str | None = None, **options):
        owner = self._user(user, session)
        try:
            outcome = run_to_completion(
                user=owner, query=question, session_id=session, sink=PrintSink(self.stdout)
            )
        except SessionNotFound:
            raise CommandError(
                f"Session {session!r} does not exist or is not {owner.get_username()}'s."
            ) from None
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        run = DiagnosisRun.objects.get(run_id=outcome.run_id)
        self.stdout.write("")
        self.stdout.write(f"Answer ({outcome.status}, release {outcome.release_decision or '-'}):")
        self.stdout.write(outcome.content or "(no content)")
        if outcome.error_code:
            self.stdout.write(f"Error: {outcome.error_code}: {outcome.error_message}")
        self.stdout.write("")
        self._summary(run)

    def _user(self, username: str | None, session_id: str | None):
        User = get_user_model()
        if username:
            found = User.objects.filter(username=username).first()
            if found is None:
                raise CommandError(f"No user named {username!r}.")
            return found
        if session_id:
            session = ChatSession.objects.select_related("owner").filter(session_id=session_id).first()
            if session is None:
                raise CommandError(f"Session {session_id!r} does not exist.")
            return session.owner
        found = User.objects.filter(is_superuser=True, is_active=True).order_by("id").first()
        if found is None:
            raise CommandError(
                "No superuser exists; pass --user NAME (e.g. after `manage.py bootstrap_demo`)."
            )
        return found

    def _summary(self, run: DiagnosisRun) -> None:
        trace = get_trace(run=run)
        w = self.stdout.write
        w(
            f"Run {run.run_id}  session {run.session_id}  status {run.status}  intent {run.intent or '-'}  "
            f"release {run.release_decision or '-'}"
        )
        provider = trace.provider
        if provider is not None and provider.demo:
            w(
                f"Provider: {provider.name} (DEMO: offline demo model; its text and reasoning are not a "
                "real model's)"
            )
        else:
            w(f"Provider: {provider.name if provider is not None else '-'}")
        w(
            f"Timing: total {_ms(run.total_duration_ms)}, first output {_ms(run.first_output_latency_ms)}, "
            f"started {_t(run.started_at)}, first model request {_t(run.first_model_request_at)}, "
            f"first output {_t(run.first_output_at)}, finished {_t(run.finished_at)}"
        )
        w(
            f"Tokens: router {run.tokens_router}, agent {run.tokens_agent}, guard {run.tokens_guard}, "
            f"total {run.tokens_total} (reasoning {_n(run.tokens_reasoning)}, "
            f"cached input {_n(run.tokens_cached_input)}); "
            f"{run.model_calls} model call(s), {run.usage_unavailable_calls} without usage, "
            f"reconciled {'yes' if trace.summary.ledger.reconciled else 'no'}"
        )
        w("Steps:")
        for step in trace.steps:
            w(
                f"  #{step.step_index} {step.model}  finish {step.finish_reason or '-'}  "
                f"tokens {step.total_tokens if step.usage_available else 'n/a'}  "
                f"reasoning {'yes' if step.reasoning_available else 'no'} ({step.reasoning_bytes} B)  "
                f"{_ms(step.duration_ms)}"
            )
        if trace.tools:
            w("Tools:")
        for tool in trace.tools:
            retrieval = (
                f"  layer {tool.retrieval_layer or '-'} (L0 {tool.l0_match_count}, L1 {tool.l1_match_count})"
                if tool.l0_match_count is not None
                else ""
            )
            error = f"  error {tool.error_code}" if tool.error_code else ""
            w(
                f"  {tool.tool_call_id} {tool.tool_name} {tool.status} {_ms(tool.duration_ms)}  "
                f"output {tool.output_length or 0} chars{retrieval}{error}"
            )
        summary = trace.summary
        w(
            f"Timeline ({len(trace.timeline)} events, chain {'valid' if summary.chain_valid else 'INVALID'}, "
            f"audit {'complete' if summary.audit_complete else 'INCOMPLETE'}: events "
            f"{summary.persisted.events}/{summary.expected.events}, steps "
            f"{summary.persisted.steps}/{summary.expected.steps}, tools "
            f"{summary.persisted.tools}/{summary.expected.tools}, "
            f"write failures {summary.audit_write_failures}):"
        )
        for event in trace.timeline:
            w(f"  {event.sequence_no:>3} {event.event_type:<24} {event.status:<12} {event.summary[:80]}")
        for gap in summary.gaps:
            w(f"  gap: {gap}")


def _n(value: int | None) -> str:
    return "not reported" if value is None else str(value)


def _ms(value: int | None) -> str:
    return "n/a" if value is None else f"{value} ms"


def _t(value) -> str:
    return value.isoformat(timespec="milliseconds") if value else "-"
