"""Refusals that are the client's doing, raised below the transports (no DRF here): the record and
identity layers raise a `ClientRefusal`; the API (`core.api`) answers it in the contract's error shape
with its status, code and `Retry-After` (`wait`, seconds), and the other transports as they answer
errors. `access.lockout.LockedOut` (429 `locked_out`) is one."""

from __future__ import annotations


class ClientRefusal(Exception):
    """`status_code` and `code` say what the contract answers; `detail` is the message (never content,
    never a secret); `wait` the seconds after which trying again may succeed (None: not known)."""

    status_code = 400
    code = "invalid_request"

    def __init__(self, detail: str, *, wait: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.wait = wait
