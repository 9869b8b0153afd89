"""`python -m config.serve daphne …` ends once its reactor is stopping, whatever a shutdown step waits on
(`config.serve`: the watchdog, `EXIT_AFTER_SECONDS`; a second SIGTERM then ends it at once). The
application instance the test leaves open ignores its cancellation, so daphne's own "before shutdown"
step (it waits for every instance it cancelled) never ends: without the watchdog the process would live
until its supervisor's SIGKILL. The log names what was still running and where (code locations only)."""

from __future__ import annotations

import re
import signal
import threading
import time

import httpx
import pytest

from config.serve import EXIT_AFTER_SECONDS
from tests.fakes.stuck_asgi import STUCK_PATH
from tests.surfaces.chat.support import DaphneServer

pytestmark = pytest.mark.django_db(transaction=True)

APP = "tests.fakes.stuck_asgi:application"


def _hold_a_stuck_response(server: DaphneServer) -> None:
    """Open the stuck response in a thread and return once its first bytes arrived."""
    answered, received = threading.Event(), []

    def hold() -> None:
        try:
            with httpx.stream("GET", f"{server.url}{STUCK_PATH}", timeout=60) as response:
                for chunk in response.iter_bytes():
                    received.append(chunk)
                    answered.set()
        except httpx.HTTPError:
            pass  # the process ended under it
        finally:
            answered.set()

    threading.Thread(target=hold, daemon=True).start()
    assert answered.wait(20) and received == [b"started\n"], received


def _wait_for(server: DaphneServer, pattern: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(pattern, server.output()):
            return
        time.sleep(0.05)
    raise AssertionError(f"{pattern!r} not in the log:\n{server.output()[-3000:]}")


def test_a_stopping_process_ends_within_the_bound_though_an_instance_never_ends():
    server = DaphneServer(app=APP, name="stuck-exit", serve=True).start()
    try:
        _hold_a_stuck_response(server)
        began = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(EXIT_AFTER_SECONDS + 20) == 0
        took = time.monotonic() - began
        assert EXIT_AFTER_SECONDS - 1 <= took < EXIT_AFTER_SECONDS + 10, took
        output = server.output()
        assert "Killed 1 pending application instances" in output
        assert "background duties stopped, model clients closed" in output  # our steps ended
        (line,) = [x for x in output.splitlines() if "did not stop within" in x]
        assert f"the reactor did not stop within {EXIT_AFTER_SECONDS:.0f} s: exiting; still running: " in line
        assert "tests/fakes/stuck_asgi.py:" in line  # where the instance is suspended
    finally:
        server.stop()


def test_a_second_sigterm_while_stopping_ends_the_process_at_once():
    server = DaphneServer(app=APP, name="stuck-second", serve=True).start()
    try:
        _hold_a_stuck_response(server)
        server.proc.send_signal(signal.SIGTERM)
        _wait_for(server, r"Killed 1 pending application instances", 20)
        began = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(10) == 0
        assert time.monotonic() - began < 5
        (line,) = [x for x in server.output().splitlines() if "second SIGTERM while stopping" in x]
        assert "tests/fakes/stuck_asgi.py:" in line
    finally:
        server.stop()
