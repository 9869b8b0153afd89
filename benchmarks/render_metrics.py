"""Write each scenario's metrics.om (OpenMetrics text) from the `world.series` of its scenario.yaml.

    .venv/bin/python benchmarks/render_metrics.py [SCENARIO_ID ...]

A series is `{metric, type: gauge|counter, help, labels, base, peak?, from_minute?, to_minute?}`: flat at
`base` until `from_minute`, then linear to `peak` at `to_minute` (default: the end), with a small
deterministic ripple; for a counter, base and peak are per-second rates and the samples accumulate. The
samples end at `world.end` (a fixed epoch; the runner shifts them to the real now when it loads them), one
every `world.step_seconds` over `world.minutes`. Commit the .om files this writes.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent / "incidents"


def _value(series: dict, minute: float, minutes: int) -> float:
    base, peak = float(series["base"]), series.get("peak")
    if peak is None:
        level = base
    else:
        start, end = float(series.get("from_minute", 0)), float(series.get("to_minute", minutes))
        share = 0.0 if minute <= start else min(1.0, (minute - start) / max(end - start, 1e-9))
        level = base + (float(peak) - base) * share
    return level * (1 + 0.02 * math.sin(minute * 1.7))


def _labels(labels: dict) -> str:
    body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return "{" + body + "}" if body else ""


def render(world: dict) -> str:
    minutes, step, end = int(world["minutes"]), int(world["step_seconds"]), int(world["end"])
    families: dict[str, list[dict]] = {}
    for series in world.get("series") or []:
        families.setdefault(series["metric"], []).append(series)
    lines: list[str] = []
    points = minutes * 60 // step
    for metric, members in families.items():
        kind = members[0].get("type", "gauge")
        family = metric.removesuffix("_total") if kind == "counter" else metric
        lines.append(f"# HELP {family} {members[0].get('help') or metric}")
        lines.append(f"# TYPE {family} {kind}")
        for series in members:
            total = 0.0
            for i in range(points + 1):
                ts = end - (points - i) * step
                value = _value(series, i * step / 60, minutes)
                if kind == "counter":
                    total += max(value, 0.0) * (step if i else 0)
                    value = total
                lines.append(f"{metric}{_labels(series.get('labels') or {})} {value:.6g} {ts}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def main(ids: list[str]) -> None:
    for folder in sorted(ROOT.iterdir()):
        spec = folder / "scenario.yaml"
        if not spec.exists() or (ids and folder.name not in ids):
            continue
        world = (yaml.safe_load(spec.read_text(encoding="utf-8")) or {}).get("world")
        if world and world.get("series"):
            (folder / "metrics.om").write_text(render(world), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
