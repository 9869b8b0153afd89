"""`{% approvals_link %}`: on the admin index, the link to the tool calls waiting for approval with how
many wait (capped at `CAP`, shown as "100+"), for users who may decide
(`agent.runtime.approvals.may_approve`); nothing for anyone else."""

from django import template
from django.urls import reverse

from agent.runtime.approval_queue import waiting_approvals
from agent.runtime.approvals import may_approve

register = template.Library()
CAP = 100


@register.inclusion_tag("admin/diagnosis/approvals_link.html", takes_context=True)
def approvals_link(context):
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not may_approve(user):
        return {"show": False}
    count = len(waiting_approvals(user=user, limit=CAP + 1))
    return {
        "show": True,
        "url": reverse("admin:diagnosis_diagnosisrun_approvals"),
        "count": count,
        "shown": f"{CAP}+" if count > CAP else str(count),
    }
