"""The admin login form, saying after a wrong password how many tries are left before this account is
locked out from this address (`access.lockout`). Installed as `admin.site.login_form` (`access.admin`)."""

from __future__ import annotations

from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import ValidationError

from access import lockout


class LoginForm(AdminAuthenticationForm):
    def get_invalid_login_error(self) -> ValidationError:
        error = super().get_invalid_login_error()
        username = self.cleaned_data.get("username")
        left = lockout.tries_left(self.request, username) if self.request is not None else None
        if left is None:
            return error
        return ValidationError(
            f"{error.message} {lockout.tries_left_text(left)}",
            code=error.code,
            params=error.params,
        )
