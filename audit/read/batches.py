"""Traces of many runs, a chunk at a time (`iter_traces`): what `manage.py export_traces` and the
admin's export stream. Each trace is built by `audit.read.trace.assemble` from rows read per chunk
(`audit.read.chunks.run_chunks`), so it equals `get_trace` of the run."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from types import SimpleNamespace

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from audit.models import AgentStep, RunReview, ToolInvocation
from audit.read.chunks import run_chunks
from audit.read.trace import Trace, annotate_covering, assemble
from audit.transparency.store import leaves_and_tails
from audit.verify.row_digests import stored_reasoning_rows
from core.db_router import reads_from_replica
from diagnosis.models import ChatSession, DiagnosisRun
from diagnosis.selectors import RunResolution, feedback_of
from pricing.costs import load_price_book

EXPORT_CHUNK = 200


@reads_from_replica
def iter_traces(
    runs: QuerySet[DiagnosisRun], *, viewer: AbstractBaseUser | None = None, chunk: int = EXPORT_CHUNK
) -> Iterator[Trace]:
    """The trace of each run of `runs`, in primary-key order, `chunk` runs at a time: per chunk one
    query each for the runs, their events, steps, tools, reasoning rows' stored columns, reviews, leaves,
    sessions and (with a `viewer`) the viewer's feedback, so memory holds one chunk whatever the number
    of runs (`manage.py export_traces`, the admin's export), from the read replica when it is usable
    (`core.db_router`). Each trace equals `get_trace(run=run, viewer=viewer)`."""
    book = load_price_book()
    for batch, events in run_chunks(runs, chunk):
        ids = [r.run_id for r in batch]
        steps: dict[str, list[AgentStep]] = defaultdict(list)
        for st in AgentStep.objects.filter(run_id__in=ids).order_by("run_id", "id"):
            steps[st.run_id].append(st)
        tools: dict[str, list[ToolInvocation]] = defaultdict(list)
        for t in ToolInvocation.objects.filter(run_id__in=ids).order_by("run_id", "started_at", "id"):
            tools[t.run_id].append(t)
        reasoning: dict[str, list[dict]] = defaultdict(list)
        for row in stored_reasoning_rows(run_id__in=ids):
            reasoning[row["run_id"]].append(row)
        reviews: dict[str, list[RunReview]] = defaultdict(list)
        for review in RunReview.objects.filter(run_id__in=ids).order_by("run_id", "sequence_no"):
            reviews[review.run_id].append(review)
        leaves, tails = {}, defaultdict(list)
        for found in leaves_and_tails(ids):
            for lf in annotate_covering(found):
                if lf.tail_of is not None:
                    tails[lf.tail_of].append(lf)
                elif lf.run_id is not None:
                    leaves[lf.run_id] = lf
        feedback = feedback_of(run_ids=ids, user=viewer) if viewer is not None else {}
        sessions = {
            row["session_id"]: SimpleNamespace(**row)
            for row in ChatSession.objects.filter(session_id__in={r.session_id for r in batch}).values(
                "session_id", "owner_id", "created_at"
            )
        }
        for run in batch:
            yield assemble(
                run,
                run_resolution=RunResolution.EXACT,
                feedback=feedback.get(run.run_id),
                events=events.pop(run.run_id, []),
                steps=steps.pop(run.run_id, []),
                tools=tools.pop(run.run_id, []),
                reasoning=reasoning.pop(run.run_id, []),
                reviews=reviews.pop(run.run_id, []),
                leaf=leaves.get(run.run_id),
                tails=tails.get(run.run_id, ()),
                book=book,
                session=sessions.get(run.session_id),
            )
