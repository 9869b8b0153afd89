"""`python -m config.serve SERVER LOOP ARGS…`: serve `config.asgi:application` with daphne (or uvicorn, a
development dependency) on the asyncio or the uvloop event loop; B3 compares them on the same
application (docs/performance.md, issue 19), and `daphne uvloop` is the measured faster way to run one
process: `python -m config.serve daphne uvloop -b 0.0.0.0 -p 8000 config.asgi:application`.

* `daphne asyncio ARGS` is exactly `daphne ARGS`; `daphne uvloop ARGS` installs uvloop's event-loop
  policy before daphne imports Twisted's asyncio reactor (which creates its loop with
  `asyncio.new_event_loop()`), so the reactor runs on a uvloop loop.
* `uvicorn LOOP ARGS` is `uvicorn --loop LOOP ARGS` (WebSockets through the `websockets` library).
"""

from __future__ import annotations

import asyncio
import sys


def main(argv: list[str]) -> None:
    server, loop, args = argv[0], argv[1], argv[2:]
    if server == "daphne":
        if loop == "uvloop":
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        from daphne.cli import CommandLineInterface

        CommandLineInterface().run(args)
    elif server == "uvicorn":
        from uvicorn.main import main as uvicorn_main

        uvicorn_main([*args, "--loop", loop, "--ws", "websockets"])
    else:
        raise SystemExit(f"unknown server {server!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
