"""The diagnosis app's admin, for staff and auditors. Importing the package registers every ModelAdmin.

One module per page or table: `runs` (the run list and page, reasoning panel, downloads; feedback),
`run_page`, `ledger` and `waterfall` (pure shaping of the trace read model), `display`, `sessions`,
`knowledge`, `aiops`, `audit_records` and `reasoning_records` (read-only for everyone), `access_users`,
`prices` and `export_outbox`.
Details: docs/admin.md, *Implementation*.
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
