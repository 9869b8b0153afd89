"""The governed reasoning store (seed 000) and the log of who read it.

`AgentReasoningAudit` keeps, per diagnosis-agent model step, the provider's reasoning text and the step's
visible assistant text, physically apart from the trace. Its columns, types and the two named indexes are
exactly seed 000's; `purged_at` is our addition for retention (content erased, row kept). It references the
run and session by their string ids only, with no foreign key. Reading its content requires the
permission `reasoning.view_reasoning_content`; every read is written to `ReasoningAccessLog`.
"""

from django.conf import settings
from django.db import models

from reasoning.fields import EncryptedTextField

# The one permission that reads reasoning content (API, admin), held by the "Reasoning Auditors" group.
REASONING_PERMISSION = "reasoning.view_reasoning_content"


class ContentSource(models.TextChoices):
    REASONING_AND_ASSISTANT = "PROVIDER_REASONING+ASSISTANT_TEXT"
    REASONING = "PROVIDER_REASONING"
    ASSISTANT_TEXT = "ASSISTANT_TEXT"
    TOOL_CALL_PLAN = "TOOL_CALL_PLAN"
    NONE = "NONE"


class AgentReasoningAudit(models.Model):
    """Reasoning and assistant text of one agent model step (`agent_reasoning_audit`).

    `reasoning_available` is true only when the provider actually returned non-empty reasoning; otherwise
    `reasoning_content` is NULL and nothing is synthesised in its place. Each text is cut at 32000
    characters; `content_bytes` is the UTF-8 byte count of both after the cut. Tool *results* never enter
    this table. Both texts are encrypted at rest (`reasoning.fields.EncryptedTextField`); purging sets them
    to NULL and `purged_at` to the time, keeping `reasoning_available` and the byte count as they were.
    """

    id = models.BigAutoField(primary_key=True)
    session_id = models.CharField(max_length=64)
    run_id = models.CharField(max_length=64)
    step_index = models.IntegerField()
    agent_name = models.CharField(max_length=64)
    reasoning_available = models.BooleanField()
    reasoning_content = EncryptedTextField(null=True, blank=True)
    assistant_text = EncryptedTextField(null=True, blank=True)
    content_source = models.CharField(max_length=64, null=True, blank=True)
    content_bytes = models.IntegerField()
    created_at = models.DateTimeField()
    purged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "agent_reasoning_audit"
        ordering = ["run_id", "step_index"]
        indexes = [
            models.Index(fields=["run_id", "step_index"], name="idx_reasoning_run_step"),
            models.Index(fields=["session_id", "created_at"], name="idx_reasoning_session_created"),
            # The admin list: newest first, and each filter followed by that order.
            models.Index(fields=["created_at"], name="idx_reasoning_created"),
            models.Index(fields=["reasoning_available", "created_at"], name="idx_reasoning_avail_created"),
            models.Index(fields=["content_source", "created_at"], name="idx_reasoning_source_created"),
        ]
        permissions = [("view_reasoning_content", "Can read provider reasoning and assistant text")]

    def __str__(self) -> str:
        return f"{self.run_id} step {self.step_index}"


class AccessChannel(models.TextChoices):
    API = "API"
    ADMIN = "ADMIN"


class ReasoningAccessLog(models.Model):
    """One successful read of reasoning content: who, which session and run, how many records, from where.

    Append-only; written by the reasoning read paths (API and admin panel) in the same request that
    returns the content. `username` is a snapshot so the row stays meaningful if the account is removed.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    username = models.CharField(max_length=150)
    session_id = models.CharField(max_length=64)
    run_id = models.CharField(max_length=64)
    records_returned = models.IntegerField()
    channel = models.CharField(max_length=8, choices=AccessChannel.choices, default=AccessChannel.API)
    client_address = models.GenericIPAddressField(null=True, blank=True)
    user_agent = models.CharField(max_length=512, blank=True, default="")
    accessed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "reasoning_access_log"
        ordering = ["-accessed_at"]
        indexes = [
            models.Index(fields=["run_id", "accessed_at"], name="idx_access_run_time"),
            models.Index(fields=["user", "accessed_at"], name="idx_access_user_time"),
            models.Index(fields=["accessed_at"], name="idx_access_time"),
            models.Index(fields=["channel", "accessed_at"], name="idx_access_channel_time"),
            models.Index(fields=["username", "accessed_at"], name="idx_access_username_time"),
        ]

    def __str__(self) -> str:
        return f"{self.username} read {self.run_id}"
