"""The test servers themselves, as the webhook tests rely on them: Alertmanager delivers the firing
rule's group to a routed webhook with the bearer token (payload version 4), and again to the next
routed webhook; Prometheus comes back on the same port after `stopped()`."""

from __future__ import annotations

import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.agent.aiops.servers import ALERT_DEADLINE, ALERT_NAME


class Receiver:
    """A local HTTP endpoint that keeps every POST (headers and JSON body) in `received`."""

    def __init__(self) -> None:
        self.received: queue.Queue[tuple[dict, dict]] = queue.Queue()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.received.put((dict(self.headers), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def next_firing(self) -> tuple[dict, dict]:
        deadline = time.monotonic() + ALERT_DEADLINE
        while (left := deadline - time.monotonic()) > 0:
            try:
                headers, body = self.received.get(timeout=left)
            except queue.Empty:
                break
            if body.get("status") == "firing" and body.get("commonLabels", {}).get("alertname") == ALERT_NAME:
                return headers, body
        pytest.fail(f"no firing {ALERT_NAME} notification within {ALERT_DEADLINE:g} s")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    endpoint = Receiver()
    yield endpoint
    endpoint.close()


def test_alertmanager_delivers_the_firing_group_to_the_routed_webhook(
    prometheus, alertmanager_webhook, receiver
):
    alertmanager_webhook(receiver.url, bearer_token="hook-token-1")
    headers, body = receiver.next_firing()
    assert headers["Authorization"] == "Bearer hook-token-1"
    assert body["version"] == "4" and body["groupKey"]
    [alert] = [a for a in body["alerts"] if a["labels"]["alertname"] == ALERT_NAME]
    assert alert["status"] == "firing" and alert["labels"]["severity"] == "warning" and alert["fingerprint"]

    second = Receiver()  # a re-route is a new receiver: the group is notified there as well
    try:
        alertmanager_webhook(second.url)
        headers, again = second.next_firing()
        assert "Authorization" not in headers and again["groupKey"] == body["groupKey"]
    finally:
        second.close()


def test_prometheus_is_back_on_its_port_after_being_stopped(prometheus):
    url = prometheus.url
    with prometheus.stopped():
        assert not prometheus.running
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/-/ready", timeout=1.0)
    assert prometheus.running and prometheus.url == url
    assert httpx.get(f"{url}/-/ready", timeout=2.0).status_code == 200
