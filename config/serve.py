"""`python -m config.serve SERVER LOOP ARGS…`: serve `config.asgi:application` with daphne (or uvicorn, a
development dependency) on the asyncio or the uvloop event loop; B3 compares them on the same
application (docs/performance.md, issue 19), and `daphne uvloop` is the measured faster way to run one
process: `python -m config.serve daphne uvloop -b 0.0.0.0 -p 8000 config.asgi:application`.

* `daphne asyncio ARGS` is exactly `daphne ARGS`; `daphne uvloop ARGS` installs uvloop's event-loop
  policy before daphne imports Twisted's asyncio reactor (which creates its loop with
  `asyncio.new_event_loop()`), so the reactor runs on a uvloop loop.
* `uvicorn LOOP ARGS` is `uvicorn --loop LOOP ARGS` (WebSockets through the `websockets` library).

Background duties at process start (issue 37): daphne sends no ASGI lifespan, so under daphne this
module schedules `agent.runtime.supervisor.ensure_background` on the reactor's event loop, to run as
soon as the loop starts (after daphne imported the application, before any connection), and adds a
"before shutdown" trigger that awaits `supervisor.shutdown` (the duties, then the model clients):
Twisted stops the reactor on SIGTERM and SIGINT, daphne closes its connections and the duties are
cancelled and awaited before the process exits. uvicorn sends lifespan, which `BackgroundDuties` in
`config.asgi` answers the same way. This is why the shipped systemd units
(deploy/systemd/) run daphne through this module.
"""

from __future__ import annotations

import asyncio
import logging
import sys


def main(argv: list[str]) -> None:
    server, loop, args = argv[0], argv[1], argv[2:]
    if server == "daphne":
        if loop == "uvloop":
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        from daphne.cli import CommandLineInterface

        _duties_with_the_reactor()
        CommandLineInterface().run(args)
    elif server == "uvicorn":
        from uvicorn.main import main as uvicorn_main

        uvicorn_main([*args, "--loop", loop, "--ws", "websockets"])
    else:
        raise SystemExit(f"unknown server {server!r}")


def _duties_with_the_reactor() -> None:
    """Start the background duties when daphne's reactor loop starts; stop them before it shuts down."""
    import daphne.server  # noqa: F401  (installs Twisted's asyncio reactor, as daphne's CLI would)
    from twisted.internet import defer, reactor

    loop = reactor._asyncioEventloop  # the asyncio loop the reactor runs (daphne.server's `twisted_loop`)

    def start() -> None:
        from agent.runtime.supervisor import ensure_background

        ensure_background()
        logging.getLogger(__name__).info("background duties started at process start")

    def stop():
        from agent.runtime.supervisor import shutdown

        async def stopping() -> None:
            await shutdown()
            logging.getLogger(__name__).info("background duties stopped, model clients closed")

        return defer.Deferred.fromFuture(asyncio.ensure_future(stopping(), loop=loop))

    loop.call_soon(start)
    reactor.addSystemEventTrigger("before", "shutdown", stop)


if __name__ == "__main__":
    main(sys.argv[1:])
