"""`python -m config.serve SERVER LOOP ARGS…`: serve `config.asgi:application` with daphne (or uvicorn, a
development dependency) on the asyncio or the uvloop event loop (`daphne uvloop` installs uvloop's policy
first; `uvicorn LOOP ARGS` is `uvicorn --loop LOOP ARGS`). Under daphne, which sends no ASGI lifespan, it
starts the background duties on the reactor's loop at process start and awaits `supervisor.shutdown`
before the reactor stops: why the shipped units use it. SIGTERM drains (`agent.runtime.drain`), a second
one stops at once; once the reactor is stopping, the process ends within `EXIT_AFTER_SECONDS` whatever a
shutdown step waits on (a watchdog logs what still ran). Details: docs/deployment.md, *Background
duties* and *Draining restarts*; docs/performance.md (daphne, uvicorn, uvloop in B3).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import signal
import sys
import threading
import time

# After the reactor is asked to stop: our shutdown steps' bound (`agent.runtime.shutdown`, ≤ 12 s with
# their floors) and a margin; the unit's TimeoutStopSec=65 exceeds grace + 2 × window + this.
EXIT_AFTER_SECONDS = 15.0


def main(argv: list[str]) -> None:
    server, loop, args = argv[0], argv[1], argv[2:]
    if server == "daphne":
        if loop == "uvloop":
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        from daphne.cli import CommandLineInterface

        _duties_with_the_reactor()
        _warm_up()
        CommandLineInterface().run(args)
    elif server == "uvicorn":
        from uvicorn.main import main as uvicorn_main

        _warm_up()
        uvicorn_main([*args, "--loop", loop, "--ws", "websockets"])
    else:
        raise SystemExit(f"unknown server {server!r}")


def _warm_up() -> None:
    """Before the port opens: Django set up and what the first chats would wait for built
    (`supervisor.warm_up`), then this thread's database connection closed (its event loop runs here)."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from django.db import connections

    from agent.runtime.supervisor import warm_up

    if warm_up():
        logging.getLogger(__name__).info("knowledge index built before the port opened")
    connections.close_all()


def _duties_with_the_reactor() -> None:
    """Start the background duties when daphne's reactor loop starts; stop them before it shuts down."""
    import daphne.server  # noqa: F401  (installs Twisted's asyncio reactor, as daphne's CLI would)
    from twisted.internet import defer, reactor

    loop = reactor._asyncioEventloop  # the asyncio loop the reactor runs (daphne.server's `twisted_loop`)

    def start() -> None:
        from agent.runtime.supervisor import start_serving

        start_serving()
        logging.getLogger(__name__).info("background duties started at process start")

    def stop():
        from agent.runtime.supervisor import shutdown

        async def stopping() -> None:
            if await shutdown():
                logging.getLogger(__name__).info("background duties stopped, model clients closed")
            else:  # the warnings above name what was left behind
                logging.getLogger(__name__).warning("shutdown finished with steps left behind")

        return defer.Deferred.fromFuture(asyncio.ensure_future(stopping(), loop=loop))

    loop.call_soon(start)
    loop.call_soon(_drain_on_sigterm, loop, reactor)
    reactor.addSystemEventTrigger("before", "shutdown", stop)


def _drain_on_sigterm(loop: asyncio.AbstractEventLoop, reactor) -> None:
    """Replace the reactor's SIGTERM handler (installed when it started): the first SIGTERM drains the
    process and then stops the reactor; a second one stops it at once."""
    from twisted.internet import tcp

    log = logging.getLogger(__name__)
    draining: list[asyncio.Task] = []
    stopping: list[bool] = []

    def stop_listening() -> None:
        # New connections go to the other processes (the proxy's `error` next-upstream case), and the
        # proxy's idle keep-alive connections close now, so it sends no new request here on one (a
        # request that still arrives is refused 503 `service_draining`); connections serving a request
        # (a stream following a run) and WebSockets stay open.
        for reader in reactor.getReaders():
            if isinstance(reader, tcp.Port):
                reader.stopListening()
            elif isinstance(reader, tcp.Server) and _idle_http(reader.protocol):
                reader.loseConnection()

    def stop_reactor() -> None:
        if not stopping:
            stopping.append(True)
            _exit_if_still_running(loop, EXIT_AFTER_SECONDS)
        with contextlib.suppress(Exception):  # stopping already (ReactorNotRunning)
            reactor.stop()

    async def drain_then_stop() -> None:
        from agent.runtime import drain

        drain.begin()
        stop_listening()
        try:
            await drain.drain()
        except Exception as exc:  # whatever happened, the process still stops
            log.error("drain failed error=%s", type(exc).__name__)
        stop_reactor()

    def begin() -> None:
        if stopping:  # the reactor's shutdown has begun and not ended: end the process now
            _exit_now(loop, "second SIGTERM while stopping")
        if draining:
            log.info("second SIGTERM: stopping without waiting for the drain")
            stop_reactor()
            return
        log.info("SIGTERM: draining")
        draining.append(loop.create_task(drain_then_stop(), name="process:drain"))

    signal.signal(signal.SIGTERM, lambda _signum, _frame: loop.call_soon_threadsafe(begin))


def _exit_if_still_running(loop: asyncio.AbstractEventLoop, seconds: float) -> None:
    """A watchdog: once the reactor is asked to stop, the process ends within `seconds` even when a
    shutdown step never returns (ours are bounded, `agent.runtime.shutdown`; daphne's own waits for
    every application instance it cancelled). The drain has ended by then: ending the process loses
    what systemd's SIGKILL would, earlier and with the log saying why."""

    def watch() -> None:
        time.sleep(seconds)
        _exit_now(loop, f"the reactor did not stop within {seconds:.0f} s")

    threading.Thread(target=watch, name="shutdown-watchdog", daemon=True).start()


def _exit_now(loop: asyncio.AbstractEventLoop, why: str) -> None:
    """Log `why` and every task the loop still runs (where each is suspended: code locations only),
    then end the process with status 0: the drain ended, and what is left behind is named."""
    from agent.runtime.shutdown import describe_tasks

    found: concurrent.futures.Future[str] = concurrent.futures.Future()

    def describe() -> None:
        with contextlib.suppress(Exception):
            found.set_result(describe_tasks(asyncio.all_tasks(loop)))

    try:
        try:
            on_the_loop = asyncio.get_running_loop() is loop
        except RuntimeError:  # the watchdog's thread
            on_the_loop = False
        if on_the_loop:
            describe()
        else:
            loop.call_soon_threadsafe(describe)
        tasks = found.result(timeout=1.0)
    except Exception:  # the loop did not answer: the process ends all the same
        tasks = "(the event loop did not answer)"
    logging.getLogger(__name__).warning("%s: exiting; still running: %s", why, tasks)
    logging.shutdown()
    os._exit(0)


def _idle_http(protocol) -> bool:
    """Whether `protocol` is an HTTP/1.1 connection with no request in progress (a keep-alive one)."""
    from twisted.web.http import HTTPChannel

    return isinstance(protocol, HTTPChannel) and not getattr(protocol, "requests", None)


if __name__ == "__main__":
    main(sys.argv[1:])
