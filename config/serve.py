"""`python -m config.serve SERVER LOOP ARGS…`: serve `config.asgi:application` with daphne (or uvicorn, a
development dependency) on the asyncio or the uvloop event loop.

`daphne asyncio ARGS` is `daphne ARGS`; `daphne uvloop ARGS` installs uvloop's policy before daphne
builds its reactor's loop; `uvicorn LOOP ARGS` is `uvicorn --loop LOOP ARGS`. Under daphne, which sends
no ASGI lifespan, it schedules the background duties on the reactor's loop before any connection and
awaits `supervisor.shutdown` before the reactor stops (SIGTERM, SIGINT): why the shipped units use it.
Details: docs/deployment.md, *Background duties*; docs/performance.md (daphne, uvicorn, uvloop in B3).
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
        from agent.runtime.supervisor import start_serving

        start_serving()
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
