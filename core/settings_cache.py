"""A value built from Django settings once per process, and again after one of those settings changed
(`setting_changed`, which `override_settings` and pytest-django's `settings` fixture send): the write
keys' verifier and the reasoning keyring, asked for on every write, are each built by one such function.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_MISSING = object()


def built_from_settings(*names: str) -> Callable[[Callable[[], T]], Callable[[], T]]:
    """Decorate a function of no arguments that builds a value from the settings `names`: its result is
    kept until a `setting_changed` names one of them. A build that raises keeps nothing (the next call
    builds again), so a missing key stays an error on every call. `fn.forget()` drops the value."""
    watched = frozenset(names)

    def decorate(build: Callable[[], T]) -> Callable[[], T]:
        value: list[object] = [_MISSING]
        connected: list[bool] = [False]
        lock = threading.Lock()

        def forget() -> None:
            value[0] = _MISSING

        @functools.wraps(build)
        def get() -> T:
            found = value[0]
            if found is _MISSING:
                with lock:
                    if not connected[0]:  # at first use: the signal's module needs Django set up
                        _connect(forget, watched)
                        connected[0] = True
                    found = value[0]
                    if found is _MISSING:
                        found = value[0] = build()
            return found  # type: ignore[return-value]

        get.forget = forget  # type: ignore[attr-defined]
        return get

    return decorate


def _connect(forget: Callable[[], None], watched: frozenset[str]) -> None:
    from django.test.signals import setting_changed

    def on_change(*, setting: str, **_kwargs) -> None:
        if setting in watched:
            forget()

    setting_changed.connect(on_change, weak=False)
