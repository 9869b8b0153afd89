"""The diagnosis app's admin, for staff and auditors. Importing the package registers every ModelAdmin.

- `runs`: the run list, the one-page run view, the reasoning panel, trace download and export; feedback.
- `run_page`, `ledger` and `waterfall`: shape the trace read model into what the run page draws (pure, no
  query).
- `display`: how a status, a duration or an instant is written, shared by the list and the page.
- `sessions`: sessions with their runs inline.
- `knowledge`: runbook documents and their chunks.
- `aiops`: AI Ops analyses (their alert and run), filtered by alert name and severity.
"""

from surfaces.admin import aiops, knowledge, runs, sessions

__all__ = ["aiops", "knowledge", "runs", "sessions"]
