"""The transparency log's keys page (`/admin/diagnosis/diagnosisrun/keys/`): every public key this
deployment's checkpoints verify under — id, algorithm, the key itself, whether it signs now — with the
newest checkpoint and the commands an auditor runs with them. What `GET /api/audit/checkpoints/` publishes
as `publicKeys`, for a person in the browser. Staff who may view runs, like every page hung off the run
admin (docs/contributing.md, *A new admin page*)."""

from __future__ import annotations

from django.template.response import TemplateResponse

from audit.models import Checkpoint
from audit.transparency.keys import published_keys


def keys_view(model_admin, request):
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": "Transparency log keys",
        "keys": published_keys(),
        "latest": Checkpoint.objects.order_by("-tree_size").only("tree_size", "key_id", "signed_at").first(),
    }
    return TemplateResponse(request, "admin/diagnosis/diagnosisrun/keys.html", context)
