"""Who a command acts as: the named user, or the first superuser (the experiment and benchmark commands)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError


def acting_user(username: str):
    users = get_user_model().objects
    user = (
        users.filter(username=username).first()
        if username
        else users.filter(is_superuser=True).order_by("id").first()
    )
    if user is None:
        raise CommandError("no such user (give --user)")
    return user
