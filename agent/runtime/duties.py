"""Background duties that apps above the runtime add to every serving process (issue 45 item 5).

An app registers a `Duty` from its `AppConfig.ready()` (the runtime imports no app above it): its task
name, what a failed pass is logged as, the coroutine of one pass, and its interval in seconds, read
when the duties start (0 turns it off). `supervisor.ensure_background` runs each registered duty like
its own (`_periodically`) and `/healthz` reports it by its task name. Details: docs/deployment.md,
*Background duties*.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Duty:
    name: str  # the task's name, as `/healthz` reports it (e.g. `evaluations:score`)
    what: str  # a failed pass is logged as "periodic <what> failed"
    job: Callable[[], Awaitable[None]]
    interval: Callable[[], float]  # seconds between passes; 0: off


_registered: dict[str, Duty] = {}


def register(duty: Duty) -> None:
    """Add `duty` to the background duties of this process (once per name: a second call replaces it)."""
    _registered[duty.name] = duty


def registered() -> list[Duty]:
    return list(_registered.values())
