"""The review queue's reason this layer adds (`diagnosis.review_queue.register_reason`, at app start):
a run with a FAILED tool call, an approved action that could not run among them, needs a human.
Details: docs/admin.md, *The review queue*.
"""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Q

from audit.models import ToolInvocation, ToolStatus
from diagnosis.review_queue import Reason, register_reason

KEY = "action_failed"


def reason() -> Reason:
    failed = ToolInvocation.objects.filter(run_id=OuterRef("run_id"), status=ToolStatus.FAILED)
    return Reason(KEY, "action or tool call failed", Q(Exists(failed)))


def register() -> None:
    register_reason(reason())
