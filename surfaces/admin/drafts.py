"""What a person typed into a console form that was refused, kept for the one page they are sent back to
(the run page's review and approval forms redirect after a POST): `keep` stores the fields in the user's
session under a key naming the form, `take` reads them once and forgets them. Only the form's own
fields, bounded; nothing is kept once the form succeeds or the page has shown it.
"""

from __future__ import annotations

PREFIX = "dc-draft:"
MAX_CHARS = 4000


def keep(request, form: str, values: dict[str, str]) -> None:
    request.session[PREFIX + form] = {str(k): str(v)[:MAX_CHARS] for k, v in values.items()}


def take(request, form: str) -> dict[str, str]:
    kept = request.session.pop(PREFIX + form, None)
    return kept if isinstance(kept, dict) else {}
