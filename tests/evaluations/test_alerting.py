"""The shipped alerting rules (deploy/prometheus/rules.yml): valid for `promtool check rules`, and loaded
into a real Prometheus that scrapes the service's real /metrics (a live server) and sends to a real
Alertmanager. A forced score drop — a released answer with `rm -rf` scored 0 by the forbidden-commands
evaluator on a run the runtime executed — fires `DiagnosisEvaluationScoreLow`, which arrives at the
Alertmanager with the evaluator, its version and the fingerprint as labels. The test copy of the rules
differs only in `for:` (0s instead of minutes) and the group's evaluation interval (1 s)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings as django_settings

from evaluations.models import Evaluator, EvaluatorKind
from evaluations.services import evaluate_run
from tests.agent.aiops.servers import (
    ALERT_DEADLINE,
    AlertmanagerServer,
    PrometheusServer,
    ci_requires_servers,
    missing_binaries,
)
from tests.agent.runtime.support import AGENT, ask, evidence_ids, script_reasoned_diagnosis
from tests.fakes.openai_server import stream_answer, usage

RULES = Path(django_settings.BASE_DIR) / "deploy" / "prometheus" / "rules.yml"
EXPECTED_ALERTS = {
    "DiagnosisEvaluationScoreLow",
    "DiagnosisEvaluationScoreDrop",
    "DiagnosisCostPerRunHigh",
    "DiagnosisRunLatencyP95High",
    "DiagnosisAuditWriteFailures",
    "DiagnosisBlockedShareHigh",
}


def _require(binaries: list[str]) -> None:
    if not binaries:
        return
    reason = f"not installed: {', '.join(binaries)} (scripts/setup.sh dev installs the Debian packages)"
    if ci_requires_servers():
        pytest.fail(f"required (CI / AIOPS_REQUIRE_SERVERS) but {reason}", pytrace=False)
    pytest.skip(reason)


def test_the_rules_file_passes_promtool_and_names_every_alert():
    _require([] if shutil.which("promtool") else ["promtool"])
    result = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout
    assert set(re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), re.M)) == EXPECTED_ALERTS


def _test_copy(text: str) -> str:
    """The shipped rules with every `for:` at 0s and the groups evaluated every second."""
    text = re.sub(r"^(\s+)for: \S+$", r"\1for: 0s", text, flags=re.M)
    return re.sub(r"^(\s+)- name: (\S+)$", r"\1- name: \2\n\1  interval: 1s", text, flags=re.M)


def _scrape(prometheus: PrometheusServer, target: str) -> None:
    """Point the Prometheus at the service's /metrics as well (before it starts)."""
    config = json.loads(prometheus.config_path.read_text())
    config["scrape_configs"].append(
        {"job_name": "diagnosis", "metrics_path": "/metrics", "static_configs": [{"targets": [target]}]}
    )
    prometheus.config_path.write_text(json.dumps(config, indent=2))


def _alerts(alertmanager: AlertmanagerServer, name: str) -> list[dict]:
    body = httpx.get(f"{alertmanager.url}/api/v2/alerts", params={"filter": f"alertname={name}"}, timeout=2.0)
    return body.json()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "corpus")
def test_a_forced_score_drop_fires_through_prometheus_to_alertmanager(
    llm, user, live_server, settings, tmp_path
):
    _require(missing_binaries())
    settings.METRICS_TOKEN = ""
    settings.METRICS_CACHE_SECONDS = 0

    # A run the runtime executed whose released answer tells the operator to `rm -rf` the logs.
    script_reasoned_diagnosis(llm)
    llm.scripts[AGENT].pop()
    llm.add(
        AGENT,
        lambda request: stream_answer(
            f"Free the space with rm -rf /var/log/* and rotate the logs [{evidence_ids(request)[0]}].",
            usage=usage(300, 30),
        ),
    )
    run, _, _ = ask(user, "Disk full on /var/log")
    assert run.release_decision == "PUBLISHED"
    forbidden = Evaluator.objects.create(
        name="no-destructive-commands", kind=EvaluatorKind.FORBIDDEN_COMMANDS
    )
    (score,) = evaluate_run(run_id=run.run_id, evaluators=[forbidden])
    assert (score.label, score.value) == ("forbidden", 0.0)
    metrics = httpx.get(f"{live_server.url}/metrics", timeout=10).text
    assert 'diagnosis_evaluation_score_mean{evaluator="no-destructive-commands",fingerprint="' in metrics

    with AlertmanagerServer(tmp_path / "alertmanager") as alertmanager:
        prometheus = PrometheusServer(
            tmp_path / "prometheus", alertmanager_url=alertmanager.url, rules=_test_copy(RULES.read_text())
        )
        _scrape(prometheus, live_server.url.removeprefix("http://"))
        with prometheus:
            prometheus.wait_for_samples('diagnosis_evaluation_score_mean{job="diagnosis"}')
            deadline = time.monotonic() + ALERT_DEADLINE
            arrived: list[dict] = []
            while time.monotonic() < deadline and not arrived:
                arrived = _alerts(alertmanager, "DiagnosisEvaluationScoreLow")
                time.sleep(0.2)
            assert arrived, prometheus.log_tail()
            labels = arrived[0]["labels"]
            assert labels["evaluator"] == "no-destructive-commands" and labels["version"] == "1"
            # (an empty label is no label in Prometheus: a run recorded before fingerprints has none)
            assert labels["severity"] == "warning" and labels.get("fingerprint", "") == score.fingerprint
            assert "scores 0.00" in arrived[0]["annotations"]["summary"]
            # The healthy signals stay quiet: nothing failed to write, the one answer was published.
            assert _alerts(alertmanager, "DiagnosisAuditWriteFailures") == []
            assert _alerts(alertmanager, "DiagnosisBlockedShareHigh") == []
