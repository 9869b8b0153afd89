"""The Prometheus and Alertmanager clients against the real servers of `tests/agent/aiops/conftest.py`: query
results as Prometheus gives them, Prometheus' own refusal of a bad query, the typed transport errors,
the response bound, and the alert of the test rule arriving at Alertmanager."""

from __future__ import annotations

import socket
import time

import pytest

from agent.aiops.alertmanager import AlertmanagerClient
from agent.aiops.http import (
    BadQuery,
    HTTPError,
    NotConfigured,
    RequestTimeout,
    ResponseTooLarge,
    Unreachable,
)
from agent.aiops.prometheus import PrometheusClient
from tests.agent.aiops.servers import ALERT_DEADLINE, ALERT_NAME, ALERT_SEVERITY, PrometheusServer, free_port


def _prom(url: str, **kw) -> PrometheusClient:
    return PrometheusClient(url, timeout=kw.pop("timeout", 5.0), max_bytes=kw.pop("max_bytes", 1 << 20))


def test_an_instant_query_returns_prometheus_own_vector(prometheus):
    result = _prom(prometheus.url).query('up{job="prometheus"}', time=time.time())
    assert result.result_type == "vector"
    [series] = result.result
    assert series["metric"] == {"__name__": "up", "instance": prometheus.address, "job": "prometheus"}
    assert series["value"][1] == "1"  # sample values stay strings, as Prometheus sends them


def test_a_range_query_returns_a_matrix_of_string_values(prometheus):
    end = time.time()
    result = _prom(prometheus.url).query_range("vector(1)", start=end - 30, end=end, step=1)
    assert result.result_type == "matrix"
    [series] = result.result
    assert len(series["values"]) == 31
    assert {value for _ts, value in series["values"]} == {"1"}


def test_a_bad_query_is_refused_with_prometheus_error_type(prometheus):
    with pytest.raises(BadQuery) as caught:
        _prom(prometheus.url).query("up{", time=time.time())
    assert caught.value.error_type == "bad_data"
    assert "parse error" in caught.value.error
    assert str(caught.value).startswith("bad_data: ")


def test_an_error_status_is_an_http_error_with_its_status(prometheus):
    with pytest.raises(HTTPError) as caught:
        _prom(f"{prometheus.url}/no-such-prefix").query("up", time=time.time())
    assert caught.value.status == 404


def test_a_body_over_the_bound_is_refused_while_it_is_read(prometheus):
    with pytest.raises(ResponseTooLarge):
        _prom(prometheus.url, max_bytes=200).query('{__name__=~"prometheus_.+"}', time=time.time())


def test_credentials_in_the_url_are_basic_auth_and_never_in_a_logged_url(prometheus, tmp_path, caplog):
    with PrometheusServer(tmp_path, basic_auth=("ops", "s3cret:pw")) as guarded:
        good = _prom(f"http://ops:s3cret%3Apw@{guarded.address}")
        with caplog.at_level("DEBUG", logger="httpx"):
            assert good.query("vector(7)", time=time.time()).result[0]["value"][1] == "7"
        assert "s3cret" not in caplog.text and guarded.address in caplog.text
        with pytest.raises(HTTPError) as caught:
            _prom(f"http://ops:wrong@{guarded.address}").query("vector(7)", time=time.time())
        assert caught.value.status == 401 and "wrong" not in str(caught.value)


def test_nothing_listening_is_unreachable():
    with pytest.raises(Unreachable) as caught:
        _prom(f"http://127.0.0.1:{free_port()}").query("up", time=time.time())
    assert "127.0.0.1" not in str(caught.value)  # the message names the server, not its URL


def test_a_peer_that_never_answers_is_a_timeout():
    with socket.socket() as silent:  # accepts connections (backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(RequestTimeout):
            _prom(url, timeout=0.3).query("up", time=time.time())
        assert time.monotonic() - started < 3


def test_an_empty_url_is_not_configured(settings):
    settings.PROMETHEUS_URL = ""
    settings.ALERTMANAGER_URL = ""
    with pytest.raises(NotConfigured, match="Prometheus is not configured"):
        PrometheusClient.from_settings()
    with pytest.raises(NotConfigured, match="Alertmanager is not configured"):
        AlertmanagerClient.from_settings()


def wait_for_alert(client: AlertmanagerClient, **kw) -> list[dict]:
    deadline = time.monotonic() + ALERT_DEADLINE
    while True:
        alerts = [a for a in client.alerts(**kw) if a["labels"].get("alertname") == ALERT_NAME]
        if alerts or time.monotonic() > deadline:
            return alerts
        time.sleep(0.2)


def test_the_test_rule_fires_and_reaches_alertmanager(aiops_settings):
    client = AlertmanagerClient.from_settings()
    [alert] = wait_for_alert(client)
    assert alert["labels"]["severity"] == ALERT_SEVERITY
    assert alert["status"]["state"] == "active"
    assert alert["annotations"]["summary"]
    assert client.alerts(filters=[f'alertname="{ALERT_NAME}"']) != []
    assert client.alerts(filters=['alertname="NoSuchAlert"']) == []


def test_a_matcher_alertmanager_refuses_is_a_bad_query(aiops_settings):
    with pytest.raises(BadQuery) as caught:
        AlertmanagerClient.from_settings().alerts(filters=["alertname=~("])
    assert caught.value.error_type == "bad_filter"
