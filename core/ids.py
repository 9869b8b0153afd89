"""The contract's ids (`sessionId`, `runId`): opaque strings of 1..`MAX_ID_CHARS` characters.

The one home of the limit. Everything that states it uses this: the visibility selectors (an id outside
it finds nothing, so a path id is 404 like any unknown one), the API's query and body fields
(`core.api.IdField`: 400), the chat service (400) and the hand-written chat schema (`maxLength`). The
tables' `max_length=64` columns are the storage of the same ids and stay as their migrations made them.
"""

from __future__ import annotations

MAX_ID_CHARS = 64


def valid_id(value: object) -> bool:
    """Whether `value` is an id of the contract's shape: a string of 1..`MAX_ID_CHARS` characters."""
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS
