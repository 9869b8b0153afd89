"""The MCP servers page (`/admin/diagnosis/diagnosisrun/mcp/`), read-only: each configured server as this
process sees it — where, status, last error and its last stderr lines (redacted) — and its tools, which
are offered and which wait for a person's approval (docs/mcp.md). Staff who may view runs."""

from __future__ import annotations

from django.template.response import TemplateResponse

from agent.mcp.toolset import overview


def mcp_view(model_admin, request):
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": "MCP servers",
        "servers": overview(),
    }
    return TemplateResponse(request, "admin/diagnosis/diagnosisrun/mcp.html", context)
