"""The canonical JSON and the pruning every audit payload passes through (audit/payloads.py): their
shortcuts give exactly what the plain definitions give."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from audit.payloads import _prune, canonical_json, sha256_hex


def _reference(value):
    """The definition the chain hashes and row digests were built on."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _outcome(fn, value):
    try:
        return fn(value)
    except Exception as exc:  # the same error class either way (e.g. keys that cannot be sorted)
        return type(exc)


def _general_prune(value, max_string, max_items, depth):
    """`_prune` without its shortcuts (the rule as documented by `bound_json`)."""
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        if len(value) <= max_string:
            return value
        return {"preview": value[:max_string], "length": len(value), "sha256": sha256_hex(value)}
    if depth <= 0:
        text = _reference(value)
        return {"preview": text[:max_string], "length": len(text), "sha256": sha256_hex(text)}
    if isinstance(value, dict):
        items = list(value.items())
        out = {str(k): _general_prune(v, max_string, max_items, depth - 1) for k, v in items[:max_items]}
        if len(items) > max_items:
            out["omittedKeys"] = len(items) - max_items
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        seq = list(value)
        out_list = [_general_prune(v, max_string, max_items, depth - 1) for v in seq[:max_items]]
        if len(seq) > max_items:
            out_list.append({"omittedItems": len(seq) - max_items})
        return out_list
    return _general_prune(str(value), max_string, max_items, depth)


_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.text(min_size=8, max_size=20).map(lambda s: s * 3),  # over a short bound
    st.sampled_from([dt.date(2026, 1, 2), decimal.Decimal("1.10"), uuid.UUID(int=7)]),
)
_keys = st.one_of(st.text(max_size=6), st.integers(min_value=0, max_value=5))
_values = st.recursive(
    _leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=7),
        st.tuples(children, children),
        st.dictionaries(_keys, children, max_size=7),
    ),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(_values)
def test_canonical_json_is_json_dumps_with_the_canonical_options(value):
    assert _outcome(canonical_json, value) == _outcome(_reference, value)


def test_canonical_json_of_edge_values():
    for value in [
        'é\u2028\ud800\x00"\\',
        -0.0,
        float("nan"),
        10**30,
        {"b": 1, "a": [1, 2, {"z": None, "é": "ü"}]},
        {1: "int key"},
        {"k": {1, 2}},
        dt.datetime(2026, 12, 2, tzinfo=dt.UTC),
    ]:
        assert canonical_json(value) == _reference(value), value


@settings(max_examples=400, deadline=None)
@given(_values, st.sampled_from([0, 1, 2, 5]), st.sampled_from([3, 50]), st.sampled_from([5, 500]))
def test_prune_shortcuts_keep_the_general_rule(value, depth, max_items, max_string):
    def shortcut(v):
        return _reference(_prune(v, max_string, max_items, depth))

    def general(v):
        return _reference(_general_prune(v, max_string, max_items, depth))

    assert _outcome(shortcut, value) == _outcome(general, value)
