"""Helpers of the audit tests: writers on threads of their own (each with its own connection) and a
wait until a group committer holds a batch."""

from __future__ import annotations

import threading
import time

from django.db import connection


def in_threads(fns):
    """Start one thread per callable; returns the threads and the list their exceptions are put in."""
    errors = []

    def wrap(fn):
        try:
            fn()
        except Exception as exc:  # reported by join_threads
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=wrap, args=(fn,)) for fn in fns]
    for t in threads:
        t.start()
    return threads, errors


def join_threads(threads, errors):
    """Wait for the threads (60 s each at most); none may still run and none may have raised."""
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors


def wait_queued(committer, n):
    """Wait until `n` writers wait on the group committer (20 s at most)."""
    deadline = time.monotonic() + 20
    while committer.queued() < n:
        assert time.monotonic() < deadline, f"only {committer.queued()} of {n} writers queued"
        time.sleep(0.005)


def reasoning_row(run, *, step_index: int):
    """A bare reasoning row of `run` as the recorder's write path takes it (`audit.write.ops.Insert`)."""
    from django.utils import timezone

    from audit.write import ops
    from audit.write.rows import tables as _tables

    t = _tables()
    return ops.Insert(
        t.reasoning,
        t.reasoning.row(
            session_id=run.session_id,
            run_id=run.run_id,
            step_index=step_index,
            agent_name="a",
            reasoning_available=False,
            content_bytes=0,
            created_at=timezone.now(),
        ),
    )
