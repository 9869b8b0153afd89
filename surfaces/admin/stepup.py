"""The admin's TOTP step-up page (`/admin/verify-otp/`): a staff user enters a code from their TOTP
device; a right code marks the session verified (`django_otp.login`), which `access.stepup` requires for
reading reasoning when `REASONING_REQUIRE_OTP` is on. A wrong or reused code is a failure in the user's
own TOTP counter for the address (`access.lockout`: never their password's or tokens'), so codes cannot be
guessed without bound; the page says what happened (`access.totp`) and how many tries are left. The
page says what the code is for; a right code is confirmed (a message on the page the user returns to).
"""

from __future__ import annotations

import django_otp
from django.contrib import messages
from django.contrib.admin import site
from django.contrib.admin.views.decorators import staff_member_required
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django_otp.plugins.otp_totp.models import TOTPDevice

from access import lockout
from access.stepup import otp_required, session_verified
from access.totp import VERIFIED, check_code

VERIFIED_MESSAGE = (
    "Second factor verified: this session may now read providers' reasoning until you sign out."
)


@never_cache
@staff_member_required
def verify_otp(request):
    user = request.user
    next_url = request.POST.get("next") or request.GET.get("next") or ""
    if not url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()}):
        next_url = ""
    devices = list(TOTPDevice.objects.devices_for_user(user, confirmed=True))
    error = ""
    if request.method == "POST" and devices:
        username = lockout.counter_name(user.get_username(), lockout.TOTP)
        if lockout.is_locked(request, username=username):
            return lockout.lockout_response(request, credentials={"username": username})
        checked = check_code(devices, request.POST.get("otp_token") or "")
        if checked.outcome == VERIFIED:
            django_otp.login(request, checked.device)
            messages.success(request, VERIFIED_MESSAGE)
            return redirect(next_url or "admin:index")
        error = checked.message()
        if checked.counts_as_failure:
            if lockout.record_failure(request, username=username):
                return lockout.lockout_response(request, credentials={"username": username})
            left = lockout.tries_left(request, username)
            if left is not None:
                error += f" {lockout.tries_left_text(left, lockout.TOTP)}"
    context = {
        **site.each_context(request),
        "title": "Verify your second factor",
        "otp_required": otp_required(),
        "has_device": bool(devices),
        "verified": session_verified(request),
        "next": next_url,
        "error": error,
    }
    return TemplateResponse(request, "admin/access/verify_otp.html", context)
