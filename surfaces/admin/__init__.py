"""The diagnosis app's admin, for staff and auditors. Importing the package registers every ModelAdmin.

- `runs`: the run list, the one-page run view, the reasoning panel, trace download and export; feedback.
- `run_page`, `ledger` and `waterfall`: shape the trace read model into what the run page draws (pure, no
  query).
- `display`: how a status, a duration or an instant is written, shared by the list and the page.
- `sessions`: sessions with their runs inline.
- `knowledge`: runbook documents and their chunks.
- `aiops`: AI Ops analyses (their alert and run), filtered by alert name and severity.
- `audit_records`, `reasoning_records`: the record's append-only tables, read-only for everyone.
- `access_users`: users, groups, API tokens, single sign-on identities; the login form.
- `prices`: price overrides; `export_outbox`: the trace export's outbox.
"""

from surfaces.admin import (
    access_users,
    aiops,
    audit_records,
    export_outbox,
    knowledge,
    prices,
    reasoning_records,
    runs,
    sessions,
)

__all__ = [
    "access_users",
    "aiops",
    "audit_records",
    "export_outbox",
    "knowledge",
    "prices",
    "reasoning_records",
    "runs",
    "sessions",
]
