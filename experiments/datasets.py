"""Writing datasets: every version is a new set of rows (`experiments.models`, append-only).

`add_runs` writes a new version holding the previous one's items as they were plus the given finished
production runs not in it yet (nothing new: the current version, unchanged); `import_jsonl` does the same
from JSON Lines; `item_json` / `export_jsonl` write items back out. An item's snapshot (`snapshot_of`:
question, released answer as the reference, reviews, scores) is read when it is taken and never
refreshed.
Details: docs/experiments.md, *Datasets*.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from agent.redaction import Redactor
from audit.models import RunReview
from diagnosis.models import TERMINAL_RUN_STATUSES, DiagnosisRun
from diagnosis.selectors import production
from evaluations.models import EvaluationScore
from experiments.models import Dataset, DatasetItem

NAME_CHARS = 100
NOTE_CHARS = 500
IMPORT_MAX_ITEMS = 10_000
MAX_ADD = 10_000  # runs added in one version (the console's action, `make_dataset`)


class DatasetError(ValueError):
    """A request that cannot make a dataset version; the message is safe to show."""


def _name(name: str) -> str:
    name = " ".join(str(name or "").split())
    if not name or len(name) > NAME_CHARS:
        raise DatasetError(f"A dataset needs a name of 1 to {NAME_CHARS} characters.")
    return name


def latest(name: str) -> Dataset | None:
    return Dataset.objects.filter(name=name).order_by("-version").first()


def snapshot_of(run: DiagnosisRun) -> dict[str, Any]:
    """The item fields of `run` (see the module docstring), as `item_json` spells them."""
    reviews = [
        {
            "verdict": r.verdict,
            "reviewer": r.reviewer_username,
            "note": r.note,
            "at": r.created_at.isoformat(),
            "sequenceNo": r.sequence_no,
        }
        for r in RunReview.objects.filter(run_id=run.run_id).order_by("sequence_no")
    ]
    scores = [
        {
            "evaluator": s.evaluator_name,
            "version": s.evaluator_version,
            "kind": s.kind,
            "value": s.value,
            "label": s.label,
            "at": s.created_at.isoformat(),
        }
        for s in EvaluationScore.objects.filter(run_id=run.run_id).order_by("sequence_no")
    ]
    return {
        "sourceRunId": run.run_id,
        "sourceSessionId": run.session_id,
        "agentFlow": run.agent_flow,
        "configFingerprint": run.config_fingerprint,
        "question": run.query,
        "reference": run.content,
        "releaseDecision": run.release_decision or "",
        "intent": run.intent or "",
        "reviews": reviews,
        "scores": scores,
    }


_FIELDS = {
    "sourceRunId": "source_run_id",
    "sourceSessionId": "source_session_id",
    "agentFlow": "agent_flow",
    "configFingerprint": "config_fingerprint",
    "question": "question",
    "reference": "reference",
    "releaseDecision": "release_decision",
    "intent": "intent",
    "reviews": "reviews",
    "scores": "scores",
    "expected": "expected",
}


def item_json(item: DatasetItem) -> dict[str, Any]:
    return {
        "dataset": item.dataset.name,
        "version": item.dataset.version,
        "position": item.position,
        **{key: getattr(item, attr) for key, attr in _FIELDS.items()},
    }


def export_jsonl(dataset: Dataset) -> Iterator[str]:
    """The version's items as JSON Lines (each line ends with a newline)."""
    for item in dataset.items.select_related("dataset").order_by("position"):
        yield json.dumps(item_json(item), ensure_ascii=False, sort_keys=True) + "\n"


def _new_version(*, name: str, snapshots: list[dict[str, Any]], origin: str, by: str, note: str) -> Dataset:
    """Write version n+1 of `name`: the previous items copied, then `snapshots` (already deduplicated)."""
    with transaction.atomic():
        previous = Dataset.objects.select_for_update().filter(name=name).order_by("-version").first()
        old = list(previous.items.order_by("position")) if previous is not None else []
        dataset = Dataset.objects.create(
            name=name,
            version=(previous.version + 1) if previous is not None else 1,
            parent=previous,
            origin=origin,
            note=note[:NOTE_CHARS],
            created_by=by[:150],
            item_count=len(old) + len(snapshots),
            description=previous.description if previous is not None else "",
        )
        rows = [
            DatasetItem(dataset=dataset, position=i, **{f: getattr(o, f) for f in _FIELDS.values()})
            for i, o in enumerate(old, start=1)
        ]
        rows += [
            DatasetItem(dataset=dataset, position=len(old) + i, **{_FIELDS[k]: v for k, v in s.items()})
            for i, s in enumerate(snapshots, start=1)
        ]
        DatasetItem.objects.bulk_create(rows)
    return dataset


def add_runs(*, name: str, runs: QuerySet | Iterable[DiagnosisRun], by: str = "", note: str = "") -> Dataset:
    """A new version of `name` with `runs` added (see the module docstring). `DatasetError` when none of
    the runs can be added and the dataset does not exist yet."""
    name = _name(name)
    current = latest(name)
    have = set(current.items.values_list("source_run_id", flat=True)) if current is not None else set()
    ids = [r.run_id if isinstance(r, DiagnosisRun) else str(r) for r in runs]
    chosen = {
        r.run_id: r
        for r in production(DiagnosisRun.objects.filter(run_id__in=ids, status__in=TERMINAL_RUN_STATUSES))
    }
    snapshots = [snapshot_of(chosen[i]) for i in dict.fromkeys(ids) if i in chosen and i not in have]
    if not snapshots:
        if current is None:
            raise DatasetError("None of these runs can be added: only finished production runs can.")
        return current
    return _new_version(name=name, snapshots=snapshots, origin="add", by=by, note=note)


def parse_jsonl(lines: Iterable[str | bytes]) -> list[dict[str, Any]]:
    """The items of a JSON Lines file (blank lines skipped); `DatasetError` naming the first bad line."""
    items: list[dict[str, Any]] = []
    for number, raw in enumerate(lines, start=1):
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except ValueError:
            raise DatasetError(f"line {number}: not JSON") from None
        if not isinstance(value, dict) or not str(value.get("question") or "").strip():
            raise DatasetError(f"line {number}: an item is an object with a question")
        items.append(value)
        if len(items) > IMPORT_MAX_ITEMS:
            raise DatasetError(f"more than {IMPORT_MAX_ITEMS} items")
    return items


def _clean(value: dict[str, Any], number: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _FIELDS:
        v = value.get(key)
        if key in ("reviews", "scores"):
            out[key] = v if isinstance(v, list) else []
        elif key == "expected":
            out[key] = v if isinstance(v, dict) else {}
        else:
            out[key] = "" if v is None else str(v)
    # An imported file is pasted text like any question: redacted before it lands in a table (one
    # redactor per item, so its question and reference name the same secret by the same placeholder).
    redactor = Redactor()
    out["question"], out["reference"] = redactor.redact(out["question"]), redactor.redact(out["reference"])
    if not out["sourceRunId"]:
        out["sourceRunId"] = f"import-{number}"
    out["sourceRunId"] = out["sourceRunId"][:64]
    return out


def import_jsonl(*, name: str, lines: Iterable[str | bytes], by: str = "", note: str = "") -> Dataset:
    """A new version of `name` from JSON Lines (see the module docstring)."""
    name = _name(name)
    items = parse_jsonl(lines)
    current = latest(name)
    have = set(current.items.values_list("source_run_id", flat=True)) if current is not None else set()
    snapshots, seen = [], set(have)
    for number, value in enumerate(items, start=1):
        cleaned = _clean(value, number)
        if cleaned["sourceRunId"] not in seen:
            seen.add(cleaned["sourceRunId"])
            snapshots.append(cleaned)
    if not snapshots:
        if current is None:
            raise DatasetError("The file holds no item.")
        return current
    return _new_version(name=name, snapshots=snapshots, origin="import", by=by, note=note)
