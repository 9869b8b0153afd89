"""Governance events from signals: every change to who may do what that the ORM can see.

Group membership of governed groups, governed groups and users with sensitive rights deleted, sensitive
permissions granted or taken, a user's superuser/staff/active flags, TOTP devices, lockouts and their
lifting: each one event, written by `audit.write.record_governance_event` in the transaction of the
change, with the request's user as actor (`access.middleware.current_actor`). Changes made with raw SQL
bypass every signal and are not recorded. Details: docs/security.md, *4. The governance log*.
"""

from __future__ import annotations

from axes.models import AccessAttempt
from axes.signals import user_locked_out
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save
from django.dispatch import receiver
from django_otp.plugins.otp_totp.models import TOTPDevice

from access import lockout
from access.middleware import current_actor, current_source
from access.selectors import (
    holds_sensitive_rights,
    is_governed_group,
    is_sensitive,
    permission_name,
    sensitive_permissions_of_group,
    sensitive_rights_of_user,
)
from audit.models import GovernanceEventType as T
from audit.write import record_governance_event

User = get_user_model()

_FLAGS = (
    ("is_superuser", T.SUPERUSER_GRANTED, T.SUPERUSER_REVOKED),
    ("is_staff", T.STAFF_GRANTED, T.STAFF_REVOKED),
    ("is_active", T.USER_REACTIVATED, T.USER_DEACTIVATED),
)


def _record(**kwargs) -> None:
    source = current_source()
    if source:  # e.g. single sign-on: the identity provider and the groups it asserted (access.sso)
        kwargs["details"] = {**kwargs.get("details", {}), "source": source}
    record_governance_event(actor=current_actor(), **kwargs)


# --------------------------------------------------------------------------------------------------
# Group membership
# --------------------------------------------------------------------------------------------------
@receiver(m2m_changed, sender=User.groups.through, dispatch_uid="access.group_membership")
def group_membership(sender, instance, action, reverse, model, pk_set, **kwargs) -> None:
    if action == "pre_clear":
        # What a clear removes, captured before it happens (post_clear has no pk_set).
        instance._access_cleared = set(
            (instance.user_set if reverse else instance.groups).values_list("pk", flat=True)
        )
        return
    if action not in ("post_add", "post_remove", "post_clear"):
        return
    if action == "post_clear":
        pk_set = getattr(instance, "_access_cleared", set())
    added = action == "post_add"
    if reverse:  # group.user_set.add(users)
        pairs = [(user, instance) for user in User.objects.filter(pk__in=pk_set or ())]
    else:  # user.groups.add(groups)
        pairs = [(instance, group) for group in Group.objects.filter(pk__in=pk_set or ())]
    for user, group in pairs:
        granted = sensitive_permissions_of_group(group)
        if not is_governed_group(group, granted):
            continue
        _record(
            event_type=T.GROUP_MEMBER_ADDED if added else T.GROUP_MEMBER_REMOVED,
            subject_user=user.get_username(),
            group=group.name,
            details={"userId": user.pk, "groupId": group.pk, "sensitivePermissions": granted},
        )


@receiver(pre_delete, sender=Group, dispatch_uid="access.group_deleted")
def group_deleted(sender, instance, **kwargs) -> None:
    granted = sensitive_permissions_of_group(instance)
    if not is_governed_group(instance, granted):
        return
    members = list(instance.user_set.order_by("username").values_list("username", flat=True))
    _record(
        event_type=T.GROUP_DELETED,
        group=instance.name,
        details={"groupId": instance.pk, "members": members, "sensitivePermissions": granted},
    )


@receiver(pre_delete, sender=User, dispatch_uid="access.user_deleted")
def user_deleted(sender, instance, **kwargs) -> None:
    rights = sensitive_rights_of_user(instance)
    if not holds_sensitive_rights(rights):
        return
    _record(
        event_type=T.USER_DELETED,
        subject_user=instance.get_username(),
        details={"userId": instance.pk, **rights},
    )


# --------------------------------------------------------------------------------------------------
# Permission grants to users and groups
# --------------------------------------------------------------------------------------------------
def _permission_change(instance, action, reverse, pk_set, *, holder_kind: str) -> None:
    if action == "pre_clear":
        instance._access_cleared = set(
            (
                (instance.user_set if holder_kind == "user" else instance.group_set)
                if reverse
                else (instance.user_permissions if holder_kind == "user" else instance.permissions)
            ).values_list("pk", flat=True)
        )
        return
    if action not in ("post_add", "post_remove", "post_clear"):
        return
    if action == "post_clear":
        pk_set = getattr(instance, "_access_cleared", set())
    granted = action == "post_add"
    holder_model = User if holder_kind == "user" else Group
    if reverse:  # permission.user_set.add(...) / permission.group_set.add(...)
        pairs = [(holder, instance) for holder in holder_model.objects.filter(pk__in=pk_set or ())]
    else:
        perms = Permission.objects.select_related("content_type").filter(pk__in=pk_set or ())
        pairs = [(instance, perm) for perm in perms]
    for holder, perm in pairs:
        if not is_sensitive(perm):
            continue
        name = permission_name(perm)
        if holder_kind == "user":
            _record(
                event_type=T.PERMISSION_GRANTED if granted else T.PERMISSION_REVOKED,
                subject_user=holder.get_username(),
                permission=name,
                details={"userId": holder.pk, "via": "user"},
            )
        else:
            members = list(holder.user_set.order_by("username").values_list("username", flat=True))
            _record(
                event_type=T.PERMISSION_GRANTED if granted else T.PERMISSION_REVOKED,
                group=holder.name,
                permission=name,
                details={"groupId": holder.pk, "via": "group", "members": members},
            )


@receiver(m2m_changed, sender=User.user_permissions.through, dispatch_uid="access.user_permissions")
def user_permissions(sender, instance, action, reverse, pk_set, **kwargs) -> None:
    _permission_change(instance, action, reverse, pk_set, holder_kind="user")


@receiver(m2m_changed, sender=Group.permissions.through, dispatch_uid="access.group_permissions")
def group_permissions(sender, instance, action, reverse, pk_set, **kwargs) -> None:
    _permission_change(instance, action, reverse, pk_set, holder_kind="group")


# --------------------------------------------------------------------------------------------------
# Superuser, staff and active flags
# --------------------------------------------------------------------------------------------------
def _flags_untouched(update_fields) -> bool:
    """A save limited to other fields (e.g. `last_login` at every login) cannot change a flag."""
    return update_fields is not None and not ({f for f, _, _ in _FLAGS} & set(update_fields))


@receiver(pre_save, sender=User, dispatch_uid="access.user_flags_before")
def user_flags_before(sender, instance, raw=False, update_fields=None, **kwargs) -> None:
    if raw or _flags_untouched(update_fields):
        return
    before = None
    if instance.pk is not None:
        before = User.objects.filter(pk=instance.pk).values(*(f for f, _, _ in _FLAGS)).first()
    instance._access_flags_before = before


@receiver(post_save, sender=User, dispatch_uid="access.user_flags_after")
def user_flags_after(sender, instance, created, raw=False, update_fields=None, **kwargs) -> None:
    if raw or _flags_untouched(update_fields):
        return
    before = getattr(instance, "_access_flags_before", None)
    for flag, on, off in _FLAGS:
        now = bool(getattr(instance, flag))
        if before is None:
            # A new account: a superuser or staff flag is a grant; being active is not news.
            if now and flag != "is_active":
                _record(event_type=on, subject_user=instance.get_username(), details={"userId": instance.pk})
            continue
        if bool(before[flag]) != now:
            _record(
                event_type=on if now else off,
                subject_user=instance.get_username(),
                details={"userId": instance.pk},
            )
    instance._access_flags_before = {f: bool(getattr(instance, f)) for f, _, _ in _FLAGS}


# --------------------------------------------------------------------------------------------------
# Second-factor devices
# --------------------------------------------------------------------------------------------------
@receiver(post_save, sender=TOTPDevice, dispatch_uid="access.otp_device_added")
def otp_device_added(sender, instance, created, raw=False, **kwargs) -> None:
    if created and not raw:
        _record(
            event_type=T.OTP_DEVICE_ADDED,
            subject_user=instance.user.get_username(),
            details={"deviceId": instance.pk, "kind": "totp", "confirmed": instance.confirmed},
        )


@receiver(post_delete, sender=TOTPDevice, dispatch_uid="access.otp_device_removed")
def otp_device_removed(sender, instance, **kwargs) -> None:
    _record(
        event_type=T.OTP_DEVICE_REMOVED,
        subject_user=User.objects.filter(pk=instance.user_id).values_list("username", flat=True).first()
        or "",
        details={"deviceId": instance.pk, "kind": "totp"},
    )


# --------------------------------------------------------------------------------------------------
# Lockouts
# --------------------------------------------------------------------------------------------------
@receiver(user_locked_out, dispatch_uid="access.locked_out")
def locked_out(sender, request=None, username=None, ip_address=None, **kwargs) -> None:
    # axes signals every failure at or over the limit (and, for refused attempts, none of ours are
    # counted); the event is the failure that reached the limit of its counter (access.lockout).
    limit = lockout.limit_for(username)
    if getattr(request, "axes_failures_since_start", None) != limit:
        return
    record_governance_event(
        event_type=T.LOCKED_OUT,
        actor="",
        subject_user=lockout.owner_of(username),
        details={
            "clientAddress": ip_address or "",
            "path": getattr(request, "axes_path_info", "")[:200],
            "failures": limit,
            "counter": lockout.counter_of(username),
        },
    )


@receiver(post_delete, sender=AccessAttempt, dispatch_uid="access.lockout_lifted")
def lockout_lifted(sender, instance, **kwargs) -> None:
    if instance.failures_since_start < lockout.limit_for(instance.username):
        return
    record_governance_event(
        event_type=T.LOCKOUT_LIFTED,
        actor=current_actor(),
        subject_user=lockout.owner_of(instance.username),
        details={
            "clientAddress": instance.ip_address or "",
            "failures": instance.failures_since_start,
            "counter": lockout.counter_of(instance.username),
        },
    )
