"""`{% review_queue_counts %}`: the review queue's capped counts for the admin index (one query per
reason, over the stored flag's index; `diagnosis.review_queue.queue_counts`). Shown to staff who may view
runs."""

from django import template
from django.urls import reverse

from diagnosis.review_queue import queue_counts

register = template.Library()


@register.inclusion_tag("admin/diagnosis/review_queue_counts.html", takes_context=True)
def review_queue_counts(context):
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.has_perm("diagnosis.view_diagnosisrun"):
        return {"show": False}
    total, counts = queue_counts()
    return {
        "show": True,
        "total": total,
        "counts": counts,
        "queue_url": reverse("admin:diagnosis_diagnosisrun_queue"),
    }
