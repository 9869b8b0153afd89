"""Verification reads each next chunk on a thread of its own while it checks one (`audit.verify.parallel`,
issue 49 item 3): the verdicts are those of reading every chunk here, tampering in a chunk the reader
read is named, and the reader's connection is closed however the verification ends."""

from __future__ import annotations

import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import DEFAULT_DB_ALIAS, connections

from audit.models import AgentStep, TraceEvent
from audit.transparency.log import checkpoint
from audit.verify import parallel
from tests.factories import make_recorded_run


@pytest.fixture
def reads(monkeypatch):
    """Each chunk read: (the thread that read it, the connection wrapper it read on)."""
    seen: list[tuple[int, object]] = []
    read = parallel._read

    def spy(chunk, **kwargs):
        seen.append((threading.get_ident(), connections[DEFAULT_DB_ALIAS]))  # this thread's own
        return read(chunk, **kwargs)

    monkeypatch.setattr(parallel, "_read", spy)
    return seen


def _store(user, n: int = 6):
    if not parallel.others_can_read():
        pytest.skip("in-memory SQLite: no other connection sees what this one wrote")
    runs = [make_recorded_run(user) for _ in range(n)]
    checkpoint()
    # Tampering in the second and third chunks of two runs: both read by the reader thread.
    TraceEvent.objects.filter(run_id=runs[3].run_id, sequence_no=2).update(summary="edited")
    AgentStep.objects.filter(run_id=runs[5].run_id).update(finish_reason="edited")
    return runs


@pytest.mark.django_db(transaction=True)
def test_chunks_read_ahead_give_the_verdicts_of_chunks_read_here(user, reads):
    runs = _store(user)
    chunks = parallel.range_chunks(2)
    context = parallel._Context.load()
    here = [v for chunk in chunks for v in parallel._verify(context, chunk)]
    assert {t for t, _ in reads} == {threading.get_ident()}
    reads.clear()

    ahead = [v for verdicts in parallel._read_ahead(context, chunks) for v in verdicts]

    assert ahead == here and [v.run_id for v in ahead] == [r.run_id for r in runs]
    assert [v.run_id for v in ahead if not v.ok] == [runs[3].run_id, runs[5].run_id]
    assert len(reads) == len(chunks) == 3
    assert threading.get_ident() not in {t for t, _ in reads}
    reader = {id(c): c for _, c in reads}
    assert len(reader) == 1 and next(iter(reader.values())) is not connections[DEFAULT_DB_ALIAS]
    assert next(iter(reader.values())).connection is None  # closed on its thread at the end


@pytest.mark.django_db(transaction=True)
def test_a_verification_stopped_early_closes_the_readers_connection(user, reads):
    _store(user)
    checked = parallel._read_ahead(parallel._Context.load(), parallel.range_chunks(2))
    first = next(checked)
    assert len(first) == 2
    checked.close()  # the consumer stops: the next chunk's read under way, or cancelled before it began
    assert 1 <= len(reads) <= 2 and {t for t, _ in reads} != {threading.get_ident()}
    assert reads[0][1].connection is None


@pytest.mark.django_db(transaction=True)
def test_workers_take_groups_of_chunks_and_print_what_one_process_prints(user, capsys):
    runs = _store(user, 8)
    outputs = []
    for workers in ("1", "2"):
        with pytest.raises(CommandError):
            call_command("verify_audit", "--all", "--workers", workers, "--batch-size", "1")
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    assert f"run={runs[3].run_id} INVALID" in outputs[0] and f"run={runs[5].run_id} INVALID" in outputs[0]
    assert [len(g) for g in parallel.groups(parallel.range_chunks(1), 2)] == [2, 2, 2, 2]  # reads ahead


def test_every_worker_takes_at_least_two_groups_of_at_most_four_chunks():
    chunks = [("range", i, i, 1) for i in range(55)]
    assert [len(g) for g in parallel.groups(chunks, 2)] == [4] * 13 + [3]
    assert [len(g) for g in parallel.groups(chunks[:5], 2)] == [1] * 5
    assert [len(g) for g in parallel.groups(chunks[:9], 2)] == [2, 2, 2, 2, 1]
    assert [c for g in parallel.groups(chunks, 3) for c in g] == chunks
