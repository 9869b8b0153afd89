"""Incident scenarios (benchmarks/incidents/<id>/): reading, validating, and what a replay is asked.

`load(folder)` reads scenario.yaml (and alert.json, logs/*.log, metrics.om) into a `Scenario` or raises
`ScenarioError` naming what is wrong; `load_all()` every folder of `INCIDENTS`. `question(scenario)` is
the run's query: the chat question, or for the AI Ops flow the alert described as the webhook intake
describes it (`agent.aiops.intake.describe_alerts`), with the log excerpts appended as pasted text.
`item(scenario, repeat=k)` is its dataset item (experiments.datasets.import_jsonl's keys, `expected`
included). Details: docs/benchmark.md, *Format*.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings

from agent.aiops.intake import Alert, describe_alerts
from audit.payloads import canonical_json, sha256_hex
from diagnosis.models import AgentFlow

INCIDENTS = Path(settings.BASE_DIR) / "benchmarks" / "incidents"
RUNBOOKS = Path(settings.BASE_DIR) / "runbooks"
ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
FLOWS = {"chat": AgentFlow.DIAGNOSIS_AGENT, "aiops": AgentFlow.AI_OPS}
LANGUAGES = ("en", "zh")
DIFFICULTIES = ("easy", "medium", "hard")
SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)\s+(\d+(?:\.\d+)?)$")
CHUNK_RE = re.compile(r"^(?:kb:)?([a-z0-9-]+)#(\d+)$")


class ScenarioError(ValueError):
    """A scenario folder that does not follow the format; the message names the folder and the fault."""


@dataclass(frozen=True)
class Scenario:
    id: str
    folder: Path
    spec: dict[str, Any]
    alert: dict[str, Any] | None = None
    logs: dict[str, str] = field(default_factory=dict)
    metrics: str = ""

    @property
    def flow(self) -> str:
        return FLOWS[self.spec["flow"]]

    @property
    def expected(self) -> dict[str, Any]:
        return {"id": self.id, **self.spec["expected"]}

    @property
    def firing(self) -> list[dict[str, Any]]:
        """The alerts Alertmanager holds in this world: alert.json's, then `world.alerts`."""
        alerts = list((self.alert or {}).get("alerts") or [])
        return alerts + list((self.spec.get("world") or {}).get("alerts") or [])

    @property
    def digest(self) -> str:
        """sha256 of everything the scenario is (spec, alert, logs, metrics): a changed file is a new item."""
        parts = {"spec": self.spec, "alert": self.alert, "logs": self.logs, "metrics": self.metrics}
        return sha256_hex(canonical_json(parts))


def _fail(folder: Path, message: str) -> ScenarioError:
    return ScenarioError(f"{folder.name}: {message}")


def _check_expected(folder: Path, expected: Any) -> None:
    if not isinstance(expected, dict) or not isinstance(expected.get("runbooks"), list):
        raise _fail(folder, "expected.runbooks must be a list")
    for slug in expected["runbooks"]:
        if not (RUNBOOKS / f"{slug}.md").exists():
            raise _fail(folder, f"expected runbook {slug!r} is not in runbooks/")
    for ref in expected.get("chunks") or []:
        m = CHUNK_RE.match(str(ref))
        if m is None or m[1] not in expected["runbooks"]:
            raise _fail(folder, f"expected chunk {ref!r} is not <one of the expected runbooks>#<n>")
    for key in ("tools", "minimal_tools", "forbidden_actions", "red_herrings"):
        if not isinstance(expected.get(key, []), list):
            raise _fail(folder, f"expected.{key} must be a list")
    for rule in expected.get("forbidden_actions") or []:
        if not isinstance(rule, dict) or not (rule.get("tool") or rule.get("pattern")):
            raise _fail(folder, "a forbidden action is {tool: NAME} or {pattern: REGEX}")
        if rule.get("pattern"):
            re.compile(rule["pattern"])
    cause = expected.get("root_cause")
    if cause is not None and (not isinstance(cause, dict) or not isinstance(cause.get("labels", {}), dict)):
        raise _fail(folder, "expected.root_cause is {labels: {...}, phrases: [...]}")


def check_metrics(text: str) -> int:
    """The number of samples of an OpenMetrics text as the world writes it (one sample a line with a
    timestamp, `# EOF` last); ValueError naming the first line that is not."""
    lines = text.rstrip("\n").split("\n")
    if not lines or lines[-1] != "# EOF":
        raise ValueError("metrics.om must end with '# EOF'")
    samples = 0
    for number, line in enumerate(lines[:-1], start=1):
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        if SAMPLE_RE.match(line) is None:
            raise ValueError(f"metrics.om line {number} is not 'name{{labels}} value timestamp'")
        float(SAMPLE_RE.match(line)[3])
        samples += 1
    return samples


def load(folder: Path) -> Scenario:
    path = folder / "scenario.yaml"
    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise _fail(folder, f"scenario.yaml cannot be read ({type(exc).__name__})") from None
    if not isinstance(spec, dict):
        raise _fail(folder, "scenario.yaml is not a mapping")
    if spec.get("id") != folder.name or not ID_RE.match(folder.name):
        raise _fail(folder, "id must equal the folder's name (lowercase, digits, hyphens)")
    for key, allowed in (("flow", FLOWS), ("language", LANGUAGES), ("difficulty", DIFFICULTIES)):
        if spec.get(key) not in allowed:
            raise _fail(folder, f"{key} must be one of {', '.join(allowed)}")
    if not isinstance(spec.get("title"), str) or not isinstance(spec.get("tags", []), list):
        raise _fail(folder, "title is a string and tags a list")
    _check_expected(folder, spec.get("expected"))
    alert = None
    if (folder / "alert.json").exists():
        alert = json.loads((folder / "alert.json").read_text(encoding="utf-8"))
        if not isinstance(alert, dict) or not isinstance(alert.get("alerts"), list) or not alert["alerts"]:
            raise _fail(folder, "alert.json is an Alertmanager webhook payload with alerts")
    if spec["flow"] == "chat" and not str(spec.get("question") or "").strip():
        raise _fail(folder, "a chat scenario has a question")
    if spec["flow"] == "aiops" and alert is None and not str(spec.get("question") or "").strip():
        raise _fail(folder, "an aiops scenario has alert.json or a question")
    logs = {p.name: p.read_text(encoding="utf-8") for p in sorted((folder / "logs").glob("*.log"))}
    metrics = (folder / "metrics.om").read_text(encoding="utf-8") if (folder / "metrics.om").exists() else ""
    if metrics:
        try:
            check_metrics(metrics)
        except ValueError as exc:
            raise _fail(folder, str(exc)) from None
    return Scenario(folder.name, folder, spec, alert, logs, metrics)


def load_all(ids: list[str] | None = None, root: Path = INCIDENTS) -> list[Scenario]:
    """Every scenario of `root` (or those of `ids`, in that order); ScenarioError for an unknown id."""
    folders = {p.name: p for p in sorted(root.iterdir()) if (p / "scenario.yaml").exists()}
    if ids:
        unknown = [i for i in ids if i not in folders]
        if unknown:
            raise ScenarioError(f"no such scenario: {', '.join(unknown)}")
        return [load(folders[i]) for i in ids]
    return [load(folder) for folder in folders.values()]


def question(scenario: Scenario) -> str:
    """What the replay is asked (see the module docstring)."""
    text = str(scenario.spec.get("question") or "").strip()
    if not text and scenario.alert is not None:
        payload = scenario.alert
        alerts = [
            Alert(
                status=str(a.get("status") or "firing"),
                labels={**(payload.get("commonLabels") or {}), **(a.get("labels") or {})},
                annotations={**(payload.get("commonAnnotations") or {}), **(a.get("annotations") or {})},
                starts_at=str(a.get("startsAt") or ""),
            )
            for a in payload["alerts"]
        ]
        text = describe_alerts(alerts=alerts, group_labels=payload.get("groupLabels") or None)
    for name, body in scenario.logs.items():
        text += f"\n\nLog excerpt ({name}):\n{body.strip()}"
    return text


def item(scenario: Scenario, *, repeat: int = 1) -> dict[str, Any]:
    """The scenario's dataset item for repeat `repeat` (import_jsonl's keys)."""
    return {
        "sourceRunId": f"bench:{scenario.id}@{scenario.digest[:8]}#{repeat}",
        "agentFlow": scenario.flow,
        "question": question(scenario),
        "expected": {**scenario.expected, "digest": scenario.digest},
    }
