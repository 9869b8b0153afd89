"""Bounding and hashing of what the audit keeps.

Every payload that reaches a durable audit row passes through here: free text becomes a preview of at
most 500 characters plus its full length and sha256; JSON is pruned (strings, list lengths, depth, total
size) so that no record grows without bound. `canonical_json` is the one serialisation the hash chain uses.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

PREVIEW_CHARS = 500
MAX_ITEMS = 50
MAX_DEPTH = 5
MAX_JSON_CHARS = 8000
_isfinite = math.isfinite


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, UTF-8 characters kept as they are; anything JSON
    has no type for as its `str` (`json.dumps(value, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False, default=str)`, the text every digest and chain hash covers)."""
    return "".join(_canonical(value, 0))


def _dumps_canonical(value: Any, _level: int) -> list[str]:
    return [json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)]


# The C encoder `json.dumps` builds for exactly those options, made once instead of per call (the
# chain hashes and row digests call it dozens of times per decision). Without circular-reference
# markers: a circular value raises RecursionError instead of ValueError, an error either way (nothing
# the recorder writes is circular). Python's own encoder where the C one is missing.
_canonical = (
    json.encoder.c_make_encoder(None, str, json.encoder.encode_basestring, None, ":", ",", True, False, True)
    if json.encoder.c_make_encoder is not None
    else _dumps_canonical
)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class BoundedText:
    """A preview of at most `limit` characters, the full length in characters, and the full sha256."""

    preview: str
    length: int
    sha256: str
    truncated: bool


def bound_text(text: str | None, limit: int = PREVIEW_CHARS) -> BoundedText:
    if text is None:
        return BoundedText(preview="", length=0, sha256="", truncated=False)
    length = len(text)
    return BoundedText(preview=text[:limit], length=length, sha256=sha256_hex(text), truncated=length > limit)


def clip(text: str | None, limit: int) -> str:
    """At most `limit` characters, marked with an ellipsis when cut."""
    if not text:
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def bound_json(
    value: Any,
    *,
    max_string: int = PREVIEW_CHARS,
    max_items: int = MAX_ITEMS,
    max_depth: int = MAX_DEPTH,
    max_chars: int = MAX_JSON_CHARS,
) -> Any:
    """A JSON-safe copy of `value` whose strings, lists, nesting and total size are bounded.

    A string longer than `max_string` becomes `{"preview", "length", "sha256"}`; lists keep their first
    `max_items` entries followed by a `{"omittedItems": n}` marker; anything deeper than `max_depth` is
    summarised; if the result still serialises to more than `max_chars` characters the whole value is
    replaced by `{"truncated": true, "length", "sha256", "preview"}` of its canonical JSON.
    """
    return bound_json_text(
        value, max_string=max_string, max_items=max_items, max_depth=max_depth, max_chars=max_chars
    )[0]


def bound_json_text(
    value: Any,
    *,
    max_string: int = PREVIEW_CHARS,
    max_items: int = MAX_ITEMS,
    max_depth: int = MAX_DEPTH,
    max_chars: int = MAX_JSON_CHARS,
) -> tuple[Any, str]:
    """`bound_json(value)` and its canonical JSON text, computed once (the recorder stores and hashes
    that text instead of serialising the value again)."""
    pruned = _prune(value, max_string, max_items, max_depth)
    text = canonical_json(pruned)
    if len(text) <= max_chars:
        return pruned, text
    summary = {
        "truncated": True,
        "length": len(text),
        "sha256": sha256_hex(text),
        "preview": text[:max_string],
    }
    return summary, canonical_json(summary)


def _prune(value: Any, max_string: int, max_items: int, depth: int) -> Any:
    kind = type(value)
    if kind is str and len(value) <= max_string:  # the common case first; the same result as below
        return value
    if kind is dict and depth > 0 and len(value) <= max_items:
        # A small dict (every event's details): its short text, integers, booleans, finite floats and
        # nulls are kept here without a call each, exactly as the general case below keeps them.
        out: dict[str, Any] = {}
        for k, v in value.items():
            t = type(v)
            out[k if type(k) is str else str(k)] = (
                v
                if (t is str and len(v) <= max_string)
                or t is int
                or t is bool
                or v is None
                or (t is float and _isfinite(v))
                else _prune(v, max_string, max_items, depth - 1)
            )
        return out
    if kind is list and depth > 0 and len(value) <= max_items:
        # A short list (tool calls, attempts, messages): the same shortcut per item; no marker is due.
        return [
            v
            if ((t := type(v)) is str and len(v) <= max_string)
            or t is int
            or t is bool
            or v is None
            or (t is float and _isfinite(v))
            else _prune(v, max_string, max_items, depth - 1)
            for v in value
        ]
    if kind is int or value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        if len(value) <= max_string:
            return value
        return {"preview": value[:max_string], "length": len(value), "sha256": sha256_hex(value)}
    if depth <= 0:
        text = canonical_json(value)
        return {"preview": text[:max_string], "length": len(text), "sha256": sha256_hex(text)}
    if isinstance(value, dict):
        items = list(value.items())
        out = {str(k): _prune(v, max_string, max_items, depth - 1) for k, v in items[:max_items]}
        if len(items) > max_items:
            out["omittedKeys"] = len(items) - max_items
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        seq = list(value)
        out_list = [_prune(v, max_string, max_items, depth - 1) for v in seq[:max_items]]
        if len(seq) > max_items:
            out_list.append({"omittedItems": len(seq) - max_items})
        return out_list
    return _prune(str(value), max_string, max_items, depth)
