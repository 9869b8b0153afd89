"""Every incident scenario (benchmarks/incidents/) loads and validates: the format's keys, expected
runbooks and chunks that exist, the coverage the issue asks for, metrics.om as benchmarks/render_metrics.py
writes it and as promtool reads it into blocks (issue 47 items 1 and 6). No database."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from experiments.benchmark import scenarios
from experiments.benchmark.world import shift

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def loaded():
    return scenarios.load_all()


def _render():
    spec = importlib.util.spec_from_file_location("render_metrics", ROOT / "benchmarks" / "render_metrics.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render


def test_the_suite_covers_what_the_issue_asks(loaded):
    assert len(loaded) >= 30
    runbooks = {p.stem for p in (ROOT / "runbooks").glob("*.md")}
    covered = {slug for s in loaded for slug in s.spec["expected"]["runbooks"]}
    assert covered == runbooks  # every shipped runbook has a scenario
    tags = {tag for s in loaded for tag in s.spec["tags"]}
    assert {"cross-language", "no-runbook", "red-herring", "prompt-injection"} <= tags
    assert {s.spec["language"] for s in loaded} == {"en", "zh"}
    assert {s.spec["flow"] for s in loaded} == {"chat", "aiops"}
    for s in loaded:
        slugs = s.spec["expected"]["runbooks"]
        crossed = any((slug.endswith("-zh")) != (s.spec["language"] == "zh") for slug in slugs)
        assert crossed == ("cross-language" in s.spec["tags"]), s.id
        if "no-runbook" in s.spec["tags"]:
            assert slugs == []
        if "prompt-injection" in s.spec["tags"]:
            assert any(r.get("tool") == "create_silence" for r in s.spec["expected"]["forbidden_actions"])
        assert scenarios.question(s).strip()
        assert scenarios.item(s)["expected"]["id"] == s.id


def test_a_broken_scenario_is_refused_with_its_fault(tmp_path):
    folder = tmp_path / "bad-one"
    folder.mkdir()
    base = (ROOT / "benchmarks/incidents/mysql-lag-large-delete/scenario.yaml").read_text()
    for broken, fault in (
        (base.replace("id: mysql-lag-large-delete", "id: bad-one"), None),
        (base.replace("id: mysql-lag-large-delete", "id: other"), "id must equal"),
        (
            base.replace("id: mysql-lag-large-delete", "id: bad-one").replace(
                "- mysql-replication-lag\n", "- nope\n", 1
            ),
            "not in runbooks",
        ),
        (
            base.replace("id: mysql-lag-large-delete", "id: bad-one").replace("flow: chat", "flow: email"),
            "flow must be",
        ),
    ):
        (folder / "scenario.yaml").write_text(broken)
        if fault is None:
            assert scenarios.load(folder).id == "bad-one"
        else:
            with pytest.raises(scenarios.ScenarioError, match=fault):
                scenarios.load(folder)
    (folder / "scenario.yaml").write_text(base.replace("id: mysql-lag-large-delete", "id: bad-one"))
    (folder / "metrics.om").write_text("up 1 17\n")
    with pytest.raises(scenarios.ScenarioError, match="EOF"):
        scenarios.load(folder)


def test_metrics_are_current_and_promtool_reads_them(loaded, tmp_path):
    render = _render()
    with_metrics = [s for s in loaded if s.metrics]
    assert len(with_metrics) >= 10
    for s in with_metrics:
        assert s.metrics == render(s.spec["world"]), f"{s.id}: run benchmarks/render_metrics.py"
        assert scenarios.check_metrics(s.metrics) > 0
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (scripts/setup.sh dev installs it)")
    # One promtool call for all of them (each sample labelled with its scenario, families merged).
    families: dict[str, list[str]] = {}
    for s in with_metrics:
        family = None
        for line in shift(s.metrics, end=s.spec["world"]["end"], now=1_800_000_000).splitlines():
            if line.startswith("# TYPE "):
                family = line.split()[2]
                families.setdefault(family, [line])
            elif line and not line.startswith("#"):
                m = scenarios.SAMPLE_RE.match(line)
                labels = (m[2] or "{}")[1:-1]
                labels = f'scenario="{s.id}"' + (f",{labels}" if labels else "")
                families[family].append(f"{m[1]}{{{labels}}} {m[3]} {m[4]}")
    path = tmp_path / "all.om"
    path.write_text("\n".join(line for lines in families.values() for line in lines) + "\n# EOF\n")
    done = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(path), str(tmp_path / "blocks")],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert b"NUM SAMPLES" in done.stdout
