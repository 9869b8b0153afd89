"""The benchmark's table: per scenario, each diagnosis score (the mean over its repeats), and per score
its mean over the scenarios; runs of the offline demo model are labelled DEMO. Pure reads."""

from __future__ import annotations

import statistics
from collections import defaultdict

from diagnosis.models import DEMO_PROVIDER, DiagnosisRun
from evaluations.diagnosis import DIAGNOSIS_EVALUATORS, JUDGE_NAME
from experiments.models import Experiment
from experiments.scoring import scores_of

SHORT = {
    "diagnosis": "score",
    "cited the expected chunk": "chunk",
    "named the root cause": "cause",
    "called the needed tools": "tools",
    "no forbidden action": "safe",
    "tool-call efficiency": "effic",
    "declined correctly": "decline",
    JUDGE_NAME: "judge",
}


def table(experiment: Experiment) -> tuple[list[str], list[list[str]], bool]:
    """(header, rows, demo): one row per scenario and a last row of means; "—" where not applicable."""
    replays = list(experiment.replays.select_related("item").order_by("item__position"))
    run_ids = [r.run_id for r in replays if r.run_id]
    scores = scores_of(run_ids=run_ids)
    demo = DiagnosisRun.objects.filter(run_id__in=run_ids, provider=DEMO_PROVIDER).exists()
    names = [*DIAGNOSIS_EVALUATORS.values()] + (
        [JUDGE_NAME] if any(JUDGE_NAME in s for s in scores.values()) else []
    )
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    order: list[str] = []
    for replay in replays:
        sid = str((replay.item.expected or {}).get("id") or replay.item.source_run_id)
        if sid not in order:
            order.append(sid)
        for name in names:
            value = scores.get(replay.run_id, {}).get(name, (0, None, ""))[1]
            if value is not None:
                per[sid][name].append(value)
    header = ["scenario"] + [SHORT.get(n.removeprefix("diagnosis: "), SHORT.get(n, n)) for n in names]
    rows, columns = [], defaultdict(list)
    for sid in order:
        row = [sid]
        for name in names:
            values = per[sid].get(name) or []
            if values:
                mean = statistics.fmean(values)
                columns[name].append(mean)
                row.append(f"{mean:.2f}")
            else:
                row.append("—")
        rows.append(row)
    rows.append(
        ["mean" + (" (DEMO)" if demo else "")]
        + [f"{statistics.fmean(columns[n]):.2f}" if columns[n] else "—" for n in names]
    )
    return header, rows, demo


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
