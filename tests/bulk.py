"""Many runs at once for the dashboard and export tests: bulk-inserted rows shaped like the recorder's
(runs with their stored facts and cost, two usage records, one tool call each), spread over days, so that
ten thousand take seconds. Their hash chains are not real (the trace of such a run says so); what the
tests read is counts, sums and shapes."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from audit.models import EventType, ToolInvocation, TraceEvent
from diagnosis.models import ChatSession, DiagnosisRun, ReleaseDecision, RunStatus
from reasoning.models import AccessChannel, ReasoningAccessLog

DAY0 = dt.datetime(2026, 10, 1, tzinfo=dt.UTC)


def bulk_runs(owner, n: int, *, days: int = 7, prefix: str = "bulk", readers=()) -> list[str]:
    """`n` runs created over `days` days from `DAY0` (run i on day i % days, at noon); returns their ids.
    Run i: FAILED when i % 13 == 0 (no release), else BLOCKED when i % 5 == 0, else PUBLISHED; provider
    demo when i % 6 == 0; cost priced (i % 100 µ$) except demo and i % 9 == 0 (unavailable);
    a ROUTER usage record (deepseek-chat) and an AGENT one (gpt-4o-mini when i % 3 == 0, else
    deepseek-chat; not reported when i % 19 == 0); one tool, FAILED when i % 8 == 0; audit incomplete
    when i % 11 == 0, unreconciled when i % 7 == 0; each of `readers` read run i's reasoning when
    i % 10 == 0."""
    sessions = [
        ChatSession(session_id=f"{prefix}s{k:07d}", owner=owner, title="bulk") for k in range(n // 10 + 1)
    ]
    ChatSession.objects.bulk_create(sessions, batch_size=2000)
    runs, events, tools, reads = [], [], [], []
    for i in range(n):
        day = DAY0 + dt.timedelta(days=i % days, hours=12)
        failed = i % 13 == 0
        demo = i % 6 == 0
        unavailable = not demo and i % 9 == 0
        run = DiagnosisRun(
            run_id=f"{prefix}{i:09d}",
            session_id=f"{prefix}s{i // 10:07d}",
            query="Why is replication lagging?",
            status=RunStatus.FAILED if failed else RunStatus.SUCCESS,
            provider="demo" if demo else "openai",
            release_decision=None if failed else ReleaseDecision.BLOCKED if i % 5 == 0 else "PUBLISHED",
            started_at=day,
            finished_at=day + dt.timedelta(seconds=5),
            total_duration_ms=100 + (i * 7919) % 60000,
            first_output_latency_ms=None if i % 17 == 0 else (i * 104729) % 5000,
            tokens_total=300,
            model_calls=2,
            tokens_reconciled=i % 7 != 0,
            audit_complete=i % 11 != 0,
            cost=None if demo or unavailable else Decimal(i % 100) / 1_000_000,
            cost_status="demo" if demo else "unavailable" if unavailable else "priced",
            cost_unpriced_calls=2 if demo else 1 if unavailable else 0,
        )
        runs.append(run)
        for seq, source, model, reported in (
            (1, "ROUTER", "deepseek-chat", True),
            (2, "AGENT", "gpt-4o-mini" if i % 3 == 0 else "deepseek-chat", i % 19 != 0),
        ):
            usage = {
                "usageAvailable": reported,
                "promptTokens": 100 + i % 50 if reported else None,
                "completionTokens": 20 + i % 10 if reported else None,
                "totalTokens": 120 + i % 50 + i % 10 if reported else None,
                "reasoningTokens": i % 5 if reported else None,
                "cachedTokens": i % 30 if reported else None,
            }
            events.append(
                TraceEvent(
                    run_id=run.run_id,
                    session_id=run.session_id,
                    sequence_no=seq,
                    phase="AGENT",
                    event_type=EventType.MODEL_TOKEN_USAGE,
                    status="REPORTED" if reported else "UNAVAILABLE",
                    summary="usage",
                    details={"source": source, "model": model, "stepIndex": 1, **usage},
                    prev_hash="0" * 64,
                    hash=f"{seq:064d}",
                    created_at=day,
                )
            )
        tools.append(
            ToolInvocation(
                run_id=run.run_id,
                session_id=run.session_id,
                step_index=1,
                tool_call_id="c1",
                tool_name="lookup_knowledge" if i % 2 else "query_metrics",
                status="FAILED" if i % 8 == 0 else "SUCCEEDED",
                started_at=day,
                created_at=day,
                updated_at=day,
            )
        )
        if i % 10 == 0:
            reads.extend(
                ReasoningAccessLog(
                    username=reader,
                    session_id=run.session_id,
                    run_id=run.run_id,
                    records_returned=1,
                    channel=AccessChannel.ADMIN,
                )
                for reader in readers
            )
    DiagnosisRun.objects.bulk_create(runs, batch_size=1000)
    TraceEvent.objects.bulk_create(events, batch_size=1000)
    ToolInvocation.objects.bulk_create(tools, batch_size=1000)
    ReasoningAccessLog.objects.bulk_create(reads, batch_size=1000)
    # created_at / accessed_at are auto_now_add: set each day's afterwards.
    for d in range(days):
        ids = [r.run_id for k, r in enumerate(runs) if k % days == d]
        when = DAY0 + dt.timedelta(days=d, hours=12)
        for k in range(0, len(ids), 900):
            DiagnosisRun.objects.filter(run_id__in=ids[k : k + 900]).update(created_at=when)
            ReasoningAccessLog.objects.filter(run_id__in=ids[k : k + 900]).update(accessed_at=when)
    return [r.run_id for r in runs]
