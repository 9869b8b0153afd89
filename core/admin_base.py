"""Admin base for append-only records: visible, never added, changed or deleted — superusers included.
Their lists count at most 10 000 rows and break ties in index order (`core.admin_lists`)."""

from django.contrib import admin

from core.admin_lists import ScalableListAdmin


class ReadOnlyAdmin(ScalableListAdmin, admin.ModelAdmin):
    """Every field read-only and no add/change/delete for anyone (django-auditlog's rule for audit rows).

    `has_change_permission` stays False, so Django renders the change form as a read-only view for users
    holding the model's `view` permission.
    """

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions
