"""The admin login form, saying after a wrong password how many tries are left before this account is
locked out from this address (`access.lockout`), and refusing local passwords the password policy
turned off (`access.passwords`, `LOCAL_PASSWORD_LOGIN=breakglass`): an unlisted username before its
password is checked (nothing counted, nothing confirmed), a listed one that is not an active superuser
after. A username that names another counter (`lockout.reserved`: no account can hold it) is refused
unchecked and uncounted, so a typed name never counts in another credential's counter. Installed as
`admin.site.login_form` (`surfaces.admin.access_users`)."""

from __future__ import annotations

from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import ValidationError

from access import lockout, passwords, services


class LoginForm(AdminAuthenticationForm):
    def clean(self):
        username = self.cleaned_data.get("username")
        if lockout.reserved(username):
            raise super().get_invalid_login_error()
        if username is not None and not passwords.may_try_password(username):
            raise ValidationError(passwords.refused_message(), code=passwords.REFUSED_CODE)
        return super().clean()

    def confirm_login_allowed(self, user) -> None:
        super().confirm_login_allowed(user)
        if not passwords.password_session_allowed(user):
            raise ValidationError(passwords.refused_message(), code=passwords.REFUSED_CODE)
        if passwords.breakglass_only():
            address = lockout.client_ip(self.request) if self.request is not None else ""
            services.record_break_glass_sign_in(user=user, address=address or "")

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
