"""Helpers of the transparency log tests: finished runs through the real recorder, the database URL of
this test database for subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings
from django.db import connection

from tests.factories import make_recorded_run


def finished_runs(owner, n: int, **kwargs):
    return [make_recorded_run(owner, **kwargs) for _ in range(n)]


def database_url() -> str:
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    host = f"{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 3306}"
    return f"mysql://{db['USER']}:{db['PASSWORD']}@{host}/{db['NAME']}"


def manage(*args: str, env: dict[str, str] | None = None, popen: bool = False):
    """`manage.py ARGS` in another process on this test database (a CompletedProcess, or a Popen)."""
    full_env = {**os.environ, "DATABASE_URL": database_url(), **(env or {})}
    command = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), *args, "--skip-checks"]
    if popen:
        return subprocess.Popen(
            command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    return subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=120)


# --------------------------------------------------------------------------------------------------
# Attacks by someone who can write the database
# --------------------------------------------------------------------------------------------------
def rehash_chain(run_id: str, *, start: int = 1) -> None:
    """Recompute `prev_hash` and `hash` of the run's events from sequence `start` on, as an attacker who
    changed an event (or a row and its digest) would, so that the chain verifies again."""
    from audit.models import TraceEvent
    from audit.verify.hash_chain import GENESIS_HASH, link_hash

    prev = GENESIS_HASH
    for event in TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no"):
        if event.sequence_no >= start:
            event.prev_hash = prev
            event.hash = link_hash(event)
            TraceEvent.objects.filter(pk=event.pk).update(prev_hash=event.prev_hash, hash=event.hash)
        prev = event.hash


def rewrite_tool_output(run, *, preview: str) -> int:
    """Change a tool row's output preview, put its new digest into the event that binds it and re-hash the
    chain from there: every per-run check passes afterwards. Returns the rewritten event's sequence."""
    from audit.models import EventType, ToolInvocation, TraceEvent
    from audit.verify import row_digests

    tool = ToolInvocation.objects.filter(run_id=run.run_id).order_by("id").first()
    ToolInvocation.objects.filter(pk=tool.pk).update(output_preview=preview)
    tool.refresh_from_db()
    event = (
        TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.TOOL_INVOCATION)
        .exclude(status="RUNNING")
        .filter(details__toolCallId=tool.tool_call_id)
        .get()
    )
    details = dict(event.details)
    details["rowDigest"] = row_digests.TOOL.digest_of(tool)
    TraceEvent.objects.filter(pk=event.pk).update(details=details)
    rehash_chain(run.run_id, start=event.sequence_no)
    return event.sequence_no


def delete_run(run_id: str) -> None:
    """Delete a whole run: its row, events, steps, tools, reasoning rows and feedback."""
    from audit.models import AgentStep, ToolInvocation, TraceEvent
    from diagnosis.models import DiagnosisRun, RunFeedback
    from reasoning.models import AgentReasoningAudit

    for model in (TraceEvent, AgentStep, ToolInvocation, AgentReasoningAudit, RunFeedback):
        model.objects.filter(run_id=run_id).delete()
    DiagnosisRun.objects.filter(run_id=run_id).delete()


def rebuild_tree() -> None:
    """Recompute every stored node and the head from the stored leaves, as an attacker who changed leaves
    would (they cannot re-sign the checkpoints)."""
    from audit.models import LogHead, LogLeaf, LogNode
    from audit.transparency import merkle

    LogNode.objects.all().delete()
    frontier = merkle.Frontier()
    nodes = []
    for leaf in LogLeaf.objects.order_by("leaf_index"):
        nodes += [
            LogNode(level=lv, node_index=ix, hash=h.hex())
            for lv, ix, h in frontier.append(bytes.fromhex(leaf.leaf_hash))
        ]
    LogNode.objects.bulk_create(nodes)
    LogHead.objects.filter(pk=1).update(tree_size=frontier.size, root_hash=frontier.root().hex())


def legacy_checkpoints(*, upto: int | None = None) -> None:
    """Re-sign the stored checkpoints (those of at most `upto` leaves; all by default) in the JSON format
    of before issue 35 (`diagnosis-audit-checkpoint/v1`), chained as that format chains them, with the
    current key: the log a deployment signed before the switch to C2SP signed notes."""
    from audit.models import Checkpoint
    from audit.transparency import keys, note
    from audit.verify.hash_chain import timestamp

    key = keys.current_key()
    previous = ""
    for cp in Checkpoint.objects.order_by("tree_size"):
        if upto is not None and cp.tree_size > upto:
            if cp.previous_hash:  # the first checkpoint after the switch names the last legacy one
                body = note.parse_note_body(cp.body, cp.link or None)
                new = note.NoteBody(
                    body.origin, body.tree_size, body.root_hash, body.signed_at, previous, body.extended
                )
                text, link = new.text(), new.link()
                link_text = link.text() if link else ""
                Checkpoint.objects.filter(pk=cp.pk).update(
                    body=text,
                    previous_hash=previous,
                    signature=note.sign_note(new, key.private),
                    link=link_text,
                    link_signature=note.sign_note(new, key.private, link_text) if link else "",
                    checkpoint_hash=note.statement_hash(text, link_text),
                )
            break
        body = note.Body(
            origin=settings.AUDIT_LOG_ORIGIN,
            tree_size=cp.tree_size,
            root_hash=cp.root_hash,
            signed_at=timestamp(cp.signed_at),
            previous=previous,
            key_id=note.key_id(key.public),
        )
        text = body.text()
        previous = note.body_hash(text)
        Checkpoint.objects.filter(pk=cp.pk).update(
            body=text,
            previous_hash=body.previous,
            key_id=body.key_id,
            signature=note.sign(text, key.private),
            link="",
            link_signature="",
            checkpoint_hash=previous,
        )
