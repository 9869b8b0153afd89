"""The canonical form of every audited row and its digest: how a durable row is bound into the run's chain.

A row's digest is `sha256(canonical JSON of {"form": <form>, "row": {column: value, …}})` over an explicit
column list per form, defined only here, with values normalised as they round-trip the database, so the
digest of the values the recorder writes equals the one recomputed from the stored row. It never reads
reasoning plaintext (the stored ciphertext is hashed). Changing a form's columns changes every older
row's digest: add a new form version instead.
Details: docs/audit-integrity.md, *Row digests (`audit/verify/row_digests.py`)*.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.db import models
from django.db.models.functions import Cast

from audit.models import AgentStep, RunReview, ToolInvocation
from audit.payloads import canonical_json, sha256_hex
from audit.verify.hash_chain import timestamp
from audit.write.table import RawJSON
from core.compiled import CompiledQuery
from diagnosis.models import ChatSession, DiagnosisRun
from reasoning.fields import Ciphertext, EncryptedTextField
from reasoning.models import AgentReasoningAudit, ReasoningAccessLog

STEP_COLUMNS = (
    "run_id",
    "session_id",
    "step_index",
    "agent_name",
    "model",
    "model_input",
    "model_output",
    "tool_call_ids",
    "has_tool_call",
    "finish_reason",
    "attempts",
    "started_at",
    "finished_at",
    "duration_ms",
    "usage_available",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cached_tokens",
    "total_tokens",
    "reasoning_available",
    "reasoning_bytes",
    "assistant_bytes",
    "content_source",
    "created_at",
)
TOOL_COLUMNS = (
    "run_id",
    "session_id",
    "step_id",
    "step_index",
    "tool_call_id",
    "provider_tool_call_id",
    "tool_name",
    "status",
    "input_params",
    "output_preview",
    "output_length",
    "output_sha256",
    "is_truncated",
    "retrieval_layer",
    "l0_match_count",
    "l1_match_count",
    "retrieval_details",
    "started_at",
    "finished_at",
    "duration_ms",
    "error_code",
    "error_message",
    "created_at",
    "updated_at",
)
REASONING_COLUMNS = (
    "session_id",
    "run_id",
    "step_index",
    "agent_name",
    "reasoning_available",
    "reasoning_content",
    "assistant_text",
    "content_source",
    "content_bytes",
    "created_at",
    "purged_at",
)
RUN_COLUMNS = (
    "status",
    "release_decision",
    "error_code",
    "content",  # as its sha256
    "tokens_router",
    "tokens_agent",
    "tokens_guard",
    "tokens_total",
    "tokens_reasoning",
    "tokens_cached_input",
    "model_calls",
    "usage_unavailable_calls",
    "tokens_reconciled",
    "expected_events",
    "expected_steps",
    "expected_tools",
)
REVIEW_COLUMNS = (
    "review_id",
    "run_id",
    "session_id",
    "verdict",
    "note",
    "reviewer_username",
    "sequence_no",
    "created_at",
)
RUN_DELIVERY_COLUMNS = ("release_mode", "draft_chars", "last_token_at", "release_latency_ms")
RUN_EVALUATION_COLUMNS = ("self_evaluation",)
RUN_OUTCOME_COLUMNS = ("intent", "error_message", "provider", "finished_at")
RUN_START_COLUMNS = ("run_id", "session_id", "query", "agent_flow", "created_at")
SESSION_COLUMNS = ("session_id", "owner_id", "created_at")


def _normaliser(f: models.Field, *, stored: bool) -> Callable[[Any], Any]:
    """The normalisation of one column's values (chosen once per column, not per value).

    `stored`: the value is what the database gave back. A JSON column's value is then already the result
    of `json.loads` of the stored text, for which the `json.dumps` / `json.loads` round trip is the
    identity, so it is taken as it is (written values still go through the round trip)."""
    if isinstance(f, models.ForeignKey):
        return _normaliser(f.target_field, stored=stored)
    if isinstance(f, EncryptedTextField):
        return lambda v: None if v is None else v.token if isinstance(v, Ciphertext) else str(v)
    if isinstance(f, models.JSONField):
        if stored and f.decoder is None:
            return lambda v: v
        encoder = f.encoder
        return lambda v: (
            None
            if v is None
            else json.loads(v.text)
            if type(v) is RawJSON  # the column's text as the recorder writes it (`json.dumps` once)
            else json.loads(json.dumps(v, cls=encoder))
        )
    if isinstance(f, models.DateTimeField):
        return _datetime
    if isinstance(f, models.BooleanField):
        return lambda v: None if v is None else bool(v)
    if isinstance(f, models.IntegerField | models.BigIntegerField):
        return lambda v: None if v is None else int(v)
    return lambda v: None if v is None else str(v)


class _Any:
    """Marks a normaliser that is the identity for every stored value (a stored JSON column's)."""


def _canonical_type(f: models.Field, *, stored: bool) -> type | None:
    """The type whose values (exactly that class) a column's normaliser returns unchanged, so that they
    need not pass through it (`_Any`: every value; None: no shortcut). Only a shortcut: the normalised
    value is the same either way."""
    if isinstance(f, models.ForeignKey):
        return _canonical_type(f.target_field, stored=stored)
    if isinstance(f, EncryptedTextField):
        return str
    if isinstance(f, models.JSONField):
        return _Any if stored and f.decoder is None else None
    if isinstance(f, models.DateTimeField):
        return None
    if isinstance(f, models.BooleanField):
        return bool
    if isinstance(f, models.IntegerField | models.BigIntegerField):
        return int
    return str


def _canonical(columns: tuple, get: Callable[[str], Any], key: int) -> dict[str, Any]:
    """A row's canonical form: `columns` are `(column, attribute name, normaliser, the type it leaves
    unchanged)`; a value of exactly that type (or None) is taken as it is, without a call (a shortcut
    only: the normalised value is the same either way)."""
    row = {}
    for names in columns:
        value = get(names[key])
        kind = names[3]
        row[names[0]] = value if value is None or kind is _Any or value.__class__ is kind else names[2](value)
    return row


# `json.dumps(value, ensure_ascii=False)` of a string: the function `canonical_json`'s encoder calls.
_text = json.encoder.encode_basestring


def _value_text(value: Any, normalise: Callable[[Any], Any] | None) -> str:
    """One value's JSON text as `canonical_json` writes it (after `normalise`, unless None): a string,
    an integer and a boolean as its encoder writes them (the same C string encoder), anything else (a
    JSON column's value, a float) by `canonical_json` itself."""
    if normalise is not None:
        value = normalise(value)
    cls = value.__class__
    if cls is str:
        return _text(value)
    if cls is int:
        return int.__repr__(value)
    if cls is bool:
        return "true" if value else "false"
    if value is None:
        return "null"
    return canonical_json(value)


_FAST = {str: "_text(v)", int: "_int(v)", bool: '("true" if v else "false")'}


def _generated_text(form: Form, *, attributes: bool) -> Callable[[Any], str]:
    """`form`'s document text for stored values as one function written for the form's columns (no
    loop, no tuple lookups per column): of a row object by attribute name (`attributes`) or of a mapping
    by column, in the key order `canonical_json` sorts them (`Form._stored_text`). Each column is written
    as `canonical_json` writes it (the type the normaliser leaves unchanged directly, anything else
    through `_value_text`); `tests/audit/test_row_digest_text.py` holds it to
    `canonical_json(form.document(…, stored=True))`."""
    lines = ["def text(o):"]
    env: dict[str, Any] = {
        "_text": _text,
        "_int": int.__repr__,
        "_value_text": _value_text,
        "_json": canonical_json,
        "_dt": dt.datetime,
        "_UTC": dt.UTC,
        "_stamp": timestamp,
    }
    parts = []
    for j, (column, attname, normalise, kind, key) in enumerate(form._stored_text):
        lines.append(f"    v = o.{attname}" if attributes else f"    v = o[{column!r}]")
        lines.append(f"    if v is None: p{j} = 'null'")
        if kind is _Any:
            lines.append(f"    elif v.__class__ is dict or v.__class__ is list: p{j} = _json(v)")
            lines.append(f"    else: p{j} = _value_text(v, None)")
        else:
            if normalise is _datetime:  # a time read back in UTC: `timestamp`'s text, which needs no escape
                lines.append(
                    f"    elif v.__class__ is _dt and v.tzinfo is _UTC: "
                    f"p{j} = '\"' + (v.isoformat() if v.microsecond else _stamp(v)) + '\"'"
                )
            env[f"n{j}"] = normalise
            if kind in _FAST:
                lines.append(f"    elif v.__class__ is {kind.__name__}: p{j} = {_FAST[kind]}")
            lines.append(f"    else: p{j} = _value_text(v, n{j})")
        parts.append(key.replace("{", "{{").replace("}", "}}") + f"{{p{j}}}")
    head = form._document_head.replace("{", "{{").replace("}", "}}")
    lines.append("    return f" + repr(head + "{{" + ",".join(parts) + "}}}}"))
    exec("\n".join(lines), env)  # noqa: S102 — code built from the form's own column names only
    return env["text"]


def _datetime(value: Any) -> Any:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return timestamp(value)


class Form:
    """One canonical form: its name, model and columns, and the normalisation of each column."""

    def __init__(self, name: str, model: type[models.Model], columns: tuple[str, ...]) -> None:
        self.name = name
        self.model = model
        self.columns = columns
        self.fields = {c: model._meta.get_field(c) for c in columns}
        self._attnames = tuple((c, self.fields[c].attname) for c in columns)
        # Per column, for stored values (as the database gave them back) and for written ones (the
        # recorder takes a digest of every row it binds): (column, attribute name, normaliser, the
        # type it leaves unchanged).
        self._stored_fast = self._normalisers(stored=True)
        self._written_fast = self._normalisers(stored=False)
        # The stored columns in the order `canonical_json` sorts their keys, each with its key's text
        # (`_generated_text`), and the document's text around the row.
        self._stored_text = tuple(
            (*names, _text(names[0]) + ":") for names in sorted(self._stored_fast, key=lambda n: n[0])
        )
        self._document_head = '{"form":' + _text(name) + ',"row":'
        if self._generated:
            self._text_of_row = _generated_text(self, attributes=True)
            self._text_of_values = _generated_text(self, attributes=False)

    # Whether the stored document's text is written by functions generated for the form's columns (the
    # run forms hash their content into the row first and go through the canonical form instead).
    _generated = True

    def _normalisers(self, *, stored: bool) -> tuple:
        return tuple(
            (c, f.attname, _normaliser(f, stored=stored), _canonical_type(f, stored=stored))
            for c, f in self.fields.items()
        )

    def canonical(self, values: Mapping[str, Any], *, stored: bool = False) -> dict[str, Any]:
        """The row's canonical form from column values (written, or `stored`: as the database gave them
        back); every column is required."""
        return _canonical(self._stored_fast if stored else self._written_fast, values.__getitem__, 0)

    def _canonical_stored(self, get: Callable[[str], Any], key: int) -> dict[str, Any]:
        """The canonical form of stored values, `get(name)` reading each by column (key 0) or attribute
        name (key 1)."""
        return _canonical(self._stored_fast, get, key)

    def document(self, values: Mapping[str, Any], *, stored: bool = False) -> dict[str, Any]:
        """What the digest is taken of: `{"form": <name>, "row": <canonical form>}` (evidence bundles
        carry it, so that anyone can recompute the digest without the database)."""
        return {"form": self.name, "row": self.canonical(values, stored=stored)}

    def digest(self, values: Mapping[str, Any], *, stored: bool = False) -> str:
        if stored:
            return self._stored_digest(values, by_attribute=False)
        return sha256_hex(canonical_json(self.document(values, stored=stored)))

    def _stored_digest(self, source: Any, *, by_attribute: bool) -> str:
        """The digest of stored values, of a mapping by column or of a row object by attribute name: the
        text of `document(…, stored=True)` written by the functions generated for the form's columns
        (`_generated_text`), hashed."""
        return sha256_hex((self._text_of_row if by_attribute else self._text_of_values)(source))

    def values_of(self, instance: Any) -> dict[str, Any]:
        """Column values of a row object (a model instance, or any object with the columns' attribute
        names)."""
        return {c: getattr(instance, attname) for c, attname in self._attnames}

    def digest_of(self, instance: Any) -> str:
        """The digest of a row read from the database."""
        return self._stored_digest(instance, by_attribute=True)


class _RunForm(Form):
    _generated = False  # its content is hashed into the row first: through the canonical form

    def canonical(self, values: Mapping[str, Any], *, stored: bool = False) -> dict[str, Any]:
        return self._finish(super().canonical(values, stored=stored))

    def _stored_digest(self, source: Any, *, by_attribute: bool) -> str:
        # The content is hashed into the row first: through the canonical form (one row per run).
        get, key = (source.__getattribute__, 1) if by_attribute else (source.__getitem__, 0)
        row = self._finish(self._canonical_stored(get, key))
        return sha256_hex(canonical_json({"form": self.name, "row": row}))

    def _finish(self, row: dict[str, Any]) -> dict[str, Any]:
        """What the run form adds to the canonical row: its content as a digest."""
        row["content"] = sha256_hex(row["content"] or "")
        return row


STEP = Form("step", AgentStep, STEP_COLUMNS)
TOOL_V1 = Form("tool", ToolInvocation, TOOL_COLUMNS)
TOOL = Form("tool/2", ToolInvocation, (*TOOL_COLUMNS, "agent_name"))
_TOOL_FORMS = {f.name: f for f in (TOOL_V1, TOOL)}
REASONING = Form("reasoning", AgentReasoningAudit, REASONING_COLUMNS)
RUN_V1 = _RunForm("run", DiagnosisRun, RUN_COLUMNS)
RUN_V2 = _RunForm("run/2", DiagnosisRun, RUN_COLUMNS + RUN_DELIVERY_COLUMNS)
RUN_V3 = _RunForm("run/3", DiagnosisRun, RUN_COLUMNS + RUN_DELIVERY_COLUMNS + RUN_EVALUATION_COLUMNS)
RUN = _RunForm(
    "run/4", DiagnosisRun, RUN_COLUMNS + RUN_DELIVERY_COLUMNS + RUN_EVALUATION_COLUMNS + RUN_OUTCOME_COLUMNS
)
_RUN_FORMS = {f.name: f for f in (RUN_V1, RUN_V2, RUN_V3, RUN)}
RUN_START = Form("run-start", DiagnosisRun, RUN_START_COLUMNS)
SESSION = Form("session", ChatSession, SESSION_COLUMNS)
_START_FORMS = {RUN_START.name: RUN_START}
_SESSION_FORMS = {SESSION.name: SESSION}


def run_form(name: str | None) -> Form | None:
    """The run form a RUN_FINISHED event names (`runForm`; absent: the first form), None if unknown."""
    return _RUN_FORMS.get(name or RUN_V1.name)


def start_form(name: str | None) -> Form | None:
    """The run-start form a RUN_STARTED event names (`startForm`), None if unknown or absent."""
    return _START_FORMS.get(name) if name else None


def session_form(name: str | None) -> Form | None:
    """The session form a RUN_STARTED event names (`sessionForm`), None if unknown or absent."""
    return _SESSION_FORMS.get(name) if name else None


def tool_form(name: str | None) -> Form | None:
    """The tool form a TOOL_INVOCATION event names (`rowForm`; absent: the first form), None if unknown."""
    return _TOOL_FORMS.get(name or TOOL_V1.name)


REVIEW = Form("review", RunReview, REVIEW_COLUMNS)
_BY_MODEL = {f.model: f for f in (STEP, TOOL, REASONING, REVIEW)}
# A read of reasoning content (`reasoning_access_log`), bound by the REASONING_READ governance event
# written with it (`readDigest`): every column but the surrogate key and the reader's user id (the
# username snapshot is bound instead).
READ_COLUMNS = (
    "username",
    "session_id",
    "run_id",
    "records_returned",
    "channel",
    "client_address",
    "user_agent",
    "accessed_at",
)
READ = Form("reasoning-read", ReasoningAccessLog, READ_COLUMNS)


def form_of(model: type[models.Model]) -> Form | None:
    """The form of a row of `model` bound at insert (step, tool, reasoning, review, or a registered
    one), or None."""
    return _BY_MODEL.get(model)


def register_form(form: Form) -> Form:
    """Register the form of a higher layer's row bound at insert by an appended event (an evaluation
    score: `audit.verify.appended_rows`), so that `append_to_finished_run` can bind it; returns `form`."""
    existing = _BY_MODEL.get(form.model)
    if existing is not None and existing.name != form.name:
        raise ValueError(f"{form.model.__name__} already has the form {existing.name}")
    _BY_MODEL[form.model] = form
    return form


# --------------------------------------------------------------------------------------------------
# Stored reasoning rows, as stored
# --------------------------------------------------------------------------------------------------
_ENCRYPTED = tuple(c for c in REASONING_COLUMNS if isinstance(REASONING.fields[c], EncryptedTextField))
_PLAIN = tuple(c for c in REASONING_COLUMNS if c not in _ENCRYPTED)


def stored_reasoning_rows(**filters: Any) -> list[dict[str, Any]]:
    """The reasoning rows matching `filters` with their stored column values and `id` (one query).

    The encrypted columns are read as stored (cast to plain text, so nothing is decrypted); the values
    serve only to recompute digests and never leave the caller.
    """
    if filters.keys() == {"run_id"}:  # one run's rows (the trace): the query compiled once
        names = _REASONING_OF_RUN.names()
        return [
            dict(zip(names, row, strict=True)) for row in _REASONING_OF_RUN.rows(run_id=filters["run_id"])
        ]
    out = []
    for row in _reasoning_rows(AgentReasoningAudit.objects.filter(**filters)):
        for c in _ENCRYPTED:
            row[c] = row.pop(f"stored_{c}")
        out.append(row)
    return out


def _reasoning_rows(rows: models.QuerySet) -> models.QuerySet:
    stored = {f"stored_{c}": Cast(c, output_field=models.TextField()) for c in _ENCRYPTED}
    return rows.annotate(**stored).order_by("run_id", "step_index", "id").values("id", *_PLAIN, *stored)


class _ReasoningOfRun:
    """`stored_reasoning_rows(run_id=…)`'s query, compiled once; column names without `stored_`."""

    def __init__(self) -> None:
        self._query = CompiledQuery(
            lambda run_id: _reasoning_rows(AgentReasoningAudit.objects.filter(run_id=run_id)), run_id=str
        )

    def names(self) -> tuple[str, ...]:
        return tuple(n.removeprefix("stored_") for n in self._query.names())

    def rows(self, run_id: str) -> list:
        return self._query.rows(run_id=run_id)


_REASONING_OF_RUN = _ReasoningOfRun()


def reasoning_bindings(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What a governance event (purge, key rotation) carries per changed reasoning row: its id, its
    step index and agent name, and the digest of what is now stored."""
    return [
        {
            "id": row["id"],
            "stepIndex": row["step_index"],
            "agentName": row["agent_name"],
            "digest": REASONING.digest(row, stored=True),
        }
        for row in rows
    ]
