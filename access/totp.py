"""What happened to a TOTP code (`check_code`): verified, reused, delayed by django-otp's throttle, or
wrong — so the step-up page and `issue_token --otp` say which, and only a wrong or reused code counts as
a failed TOTP attempt (`access.lockout`, the `totp` counter). A code offered while every device is
throttled is not checked (django-otp would refuse it unchecked) and not counted: a right code typed
during the delay is never recorded as a failure. Details: docs/security.md, *1. No unlimited guessing*.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from django.utils import timezone
from django_otp.oath import TOTP

VERIFIED = "verified"
THROTTLED = "throttled"
REUSED = "reused"
WRONG = "wrong"


@dataclass(frozen=True, slots=True)
class Checked:
    outcome: str  # VERIFIED, THROTTLED, REUSED or WRONG
    device: object | None = None  # the device that verified it
    wait_seconds: int = 0  # THROTTLED: until the soonest device accepts a code again

    @property
    def counts_as_failure(self) -> bool:
        return self.outcome in (WRONG, REUSED)

    def message(self) -> str:
        """What happened, in words for the person who typed the code."""
        if self.outcome == REUSED:
            return "That code was already used. Wait for the next code of your authenticator and enter it."
        if self.outcome == THROTTLED:
            seconds = max(1, self.wait_seconds)
            unit = "second" if seconds == 1 else "seconds"
            return (
                f"After a wrong code the next one is checked only after a delay: try again in {seconds} "
                f"{unit}. This code was not checked and not counted."
            )
        return "That code is not valid. Enter the current code of your authenticator."


def _used_before(device, code: str) -> bool:
    """Whether `code` is the device's code at a time step it already accepted (within its tolerance)."""
    try:
        token = int(code)
    except ValueError:
        return False
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    return totp.verify(token, device.tolerance) and totp.t() <= device.last_t


def check_code(devices, code: str) -> Checked:
    """Check `code` against the user's confirmed TOTP `devices` (see the module docstring)."""
    code = (code or "").strip()
    devices = list(devices)
    waits = []
    allowed = []
    for device in devices:
        ok, data = device.verify_is_allowed()
        if ok:
            allowed.append(device)
        else:
            until = (data or {}).get("locked_until") or timezone.now()
            waits.append(math.ceil((until - timezone.now()) / dt.timedelta(seconds=1)))
    if devices and not allowed:
        return Checked(THROTTLED, wait_seconds=min(waits))
    for device in allowed:
        if code and device.verify_token(code):
            return Checked(VERIFIED, device=device)
    if code and any(_used_before(device, code) for device in allowed):
        return Checked(REUSED)
    return Checked(WRONG)
