"""Running the incident benchmark: scenarios → a dataset → an experiment (issue 47 item 2).

`run_benchmark(chosen=…, repeat=N, user=…)` imports the scenarios as items of the dataset
`incident-benchmark <digest>` (one per scenario and repeat, with its expected findings; the same files
and repeat give the same version, so two configurations replay the same items), makes sure the
diagnosis evaluators exist and runs `experiments.runner.run_experiment` with each scenario's world
loaded around its replays (`experiments.benchmark.world`). Replays are experiment runs, so sandboxed: a
tool that changes the world is never executed nor asks a person. Details: docs/benchmark.md.
"""

from __future__ import annotations

import json

from django.contrib.auth.models import AbstractBaseUser

from agent.runtime.candidate import Candidate
from agent.runtime.llm import ModelClient
from audit.payloads import canonical_json, sha256_hex
from evaluations.diagnosis import ensure_evaluators
from experiments import datasets
from experiments.benchmark import scenarios as scenario_files
from experiments.benchmark.world import Worlds
from experiments.models import Dataset, Experiment
from experiments.runner import run_experiment


def dataset_for(chosen: list[scenario_files.Scenario], *, repeat: int, by: str = "") -> Dataset:
    """The dataset version holding exactly these scenarios × `repeat` (see the module docstring)."""
    key = sha256_hex(canonical_json([[s.id, s.digest] for s in chosen] + [repeat]))[:12]
    lines = [
        json.dumps(scenario_files.item(s, repeat=k), ensure_ascii=False)
        for s in chosen
        for k in range(1, repeat + 1)
    ]
    note = f"{len(chosen)} scenario(s) × {repeat}: " + ", ".join(s.id for s in chosen)
    return datasets.import_jsonl(name=f"incident-benchmark {key}", lines=lines, by=by, note=note)


def run_benchmark(
    *,
    chosen: list[scenario_files.Scenario],
    user: AbstractBaseUser,
    repeat: int = 1,
    candidate: Candidate | None = None,
    name: str = "",
    prometheus_url: str = "",
    alertmanager_url: str = "",
    judge_model: str | None = None,
    client: ModelClient | None = None,
) -> Experiment:
    """Run the chosen scenarios (see the module docstring); returns the finished experiment."""
    dataset = dataset_for(chosen, repeat=max(1, repeat), by=getattr(user, "username", ""))
    ensure_evaluators(judge_model=judge_model)
    candidate = candidate or Candidate(name=name or "incident benchmark")
    with Worlds(prometheus_url=prometheus_url, alertmanager_url=alertmanager_url, scenarios=chosen) as worlds:
        return run_experiment(
            dataset=dataset, candidate=candidate, user=user, name=name, client=client, around=worlds.around
        )
