"""Evidence ids: the one declaration of what an answer may cite, read by every layer that mints, finds or
follows an id (`kb:` by the knowledge tools, `prom:` by the Prometheus tool, `mcp:` by MCP servers' tools;
all read by the evidence guard, the judge, the answer renderer and the demo model).

A kind is one `EvidenceKind` in `KINDS`; everything else derives from it: `parse` / `parse_citation`
(well-formed ids, the same answer for every reader), `kind.format`, and the guard's deliberately loose
`CITATION_RE` / `cited_ids`, so a malformed id counts as cited and is refused, never overlooked. A new
kind is one more declaration. Pure Python (no Django).
Details: docs/architecture.md, *Evidence ids (`diagnosis/evidence.py`)*.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from string import Formatter
from typing import Any

SLUG_PATTERN = r"[a-z0-9]+(?:[-_][a-z0-9]+)*"
ORDINAL_DIGITS = 6
ORDINAL_PATTERN = rf"[1-9][0-9]{{0,{ORDINAL_DIGITS - 1}}}"
METRIC_HEX_CHARS = 16
HEX_PATTERN = rf"[0-9a-f]{{{METRIC_HEX_CHARS}}}"
# What may follow an id inside a citation bracket: blanks, a separator or the closing bracket.
_ID_CHAR = r"[^\[\]\s,;]"


@dataclass(frozen=True, slots=True)
class Part:
    """One part of an id: its `name` (a `{name}` of the kind's layout), the `pattern` its text matches
    (no capturing groups) and `convert`, which turns that text into its value (`str`, `int`)."""

    name: str
    pattern: str
    convert: Callable[[str], Any] = str


@dataclass(frozen=True)
class EvidenceKind:
    """A kind of evidence id, `<prefix>:<layout>` (see the module docstring)."""

    prefix: str
    label: str  # one word for what the evidence is ("runbook", "metric"), as the judge is told
    noun: str  # what one id names, for people ("runbook chunk")
    parts: tuple[Part, ...]
    layout: str  # the parts after `<prefix>:`, e.g. "{slug}#{ordinal}"
    placeholder: str  # the layout as shown to people and models, e.g. "<slug>#<n>"
    loose: str  # what the evidence guard takes for an id of this kind after `<prefix>:`
    pattern: str = field(init=False)  # a well-formed id, no capturing groups
    regex: re.Pattern[str] = field(init=False)  # a well-formed id, each part a named group

    def __repr__(self) -> str:
        return f"EvidenceKind({self.prefix!r})"

    def __post_init__(self) -> None:
        names = [name for _, name, _, _ in Formatter().parse(self.layout) if name is not None]
        if sorted(names) != sorted(p.name for p in self.parts) or len(set(names)) != len(names):
            raise ValueError(f"the layout of {self.prefix!r} must name each part once")
        parts = {p.name: p for p in self.parts}

        def build(group: Callable[[Part], str]) -> str:
            out = [re.escape(f"{self.prefix}:")]
            for literal, name, _, _ in Formatter().parse(self.layout):
                out.append(re.escape(literal))
                if name is not None:
                    out.append(group(parts[name]))
            return "".join(out)

        object.__setattr__(self, "pattern", build(lambda p: f"(?:{p.pattern})"))
        object.__setattr__(self, "regex", re.compile(build(lambda p: f"(?P<{p.name}>{p.pattern})")))

    @property
    def form(self) -> str:
        """The id's form for people and prompts: `kb:<slug>#<n>`."""
        return f"{self.prefix}:{self.placeholder}"

    def owns(self, text: str) -> bool:
        """Whether `text` claims to be of this kind (its prefix), well formed or not."""
        return text.startswith(f"{self.prefix}:")

    def parse(self, text: str) -> EvidenceId | None:
        """`text` as an id of this kind, or None (exactly: no blanks around it)."""
        if not isinstance(text, str):
            return None
        match = self.regex.fullmatch(text)
        if match is None:
            return None
        values = tuple((p.name, p.convert(match[p.name])) for p in self.parts)
        return EvidenceId(kind=self, values=values, text=text)

    def format(self, **values: Any) -> str:
        """The id of `values`; ValueError when a part is missing, extra or not of its form."""
        if set(values) != {p.name for p in self.parts}:
            raise ValueError(f"{self.prefix} ids have the parts {', '.join(p.name for p in self.parts)}")
        text = f"{self.prefix}:{self.layout.format(**values)}"
        if self.regex.fullmatch(text) is None:
            raise ValueError(f"{text!r} is not an evidence id of the form {self.form}")
        return text


@dataclass(frozen=True)
class EvidenceId:
    """A well-formed id: its `kind`, its parts' values (`id["slug"]`, `id["ordinal"]`) and its `text`."""

    kind: EvidenceKind
    values: tuple[tuple[str, Any], ...]
    text: str

    def __getitem__(self, name: str) -> Any:
        return dict(self.values)[name]

    def as_dict(self) -> Mapping[str, Any]:
        return dict(self.values)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"EvidenceId({self.text!r})"


RUNBOOK_CHUNK = EvidenceKind(
    prefix="kb",
    label="runbook",
    noun="runbook chunk",
    parts=(Part("slug", SLUG_PATTERN), Part("ordinal", ORDINAL_PATTERN, int)),
    layout="{slug}#{ordinal}",
    placeholder="<slug>#<n>",
    loose=r"[^\[\]\s,;#]+#\d+",
)
METRIC_RESULT = EvidenceKind(
    prefix="prom",
    label="metric",
    noun="metric result",
    parts=(Part("digest", HEX_PATTERN),),
    layout="{digest}",
    placeholder="<hex>",
    loose=rf"{_ID_CHAR}+",
)

MCP_RESULT = EvidenceKind(
    prefix="mcp",
    label="tool",
    noun="MCP tool result",
    parts=(Part("server", SLUG_PATTERN), Part("digest", HEX_PATTERN)),
    layout="{server}/{digest}",
    placeholder="<server>/<hex>",
    loose=rf"{_ID_CHAR}+",
)

KINDS: tuple[EvidenceKind, ...] = (RUNBOOK_CHUNK, METRIC_RESULT, MCP_RESULT)
# The kinds the service's own tools mint: a run offered no MCP tool records the citation pattern of
# these only (`citation_pattern`), so its configuration fingerprint is what it was before `mcp:`.
NATIVE_KINDS: tuple[EvidenceKind, ...] = (RUNBOOK_CHUNK, METRIC_RESULT)

# Every kind's prefix, as one regex alternation: `(?:kb|prom|mcp)`.
PREFIXES = "(?:" + "|".join(re.escape(k.prefix) for k in KINDS) + ")"


def loose_id(kinds: tuple[EvidenceKind, ...] = KINDS) -> str:
    return "(?:" + "|".join(f"{re.escape(k.prefix)}:{k.loose}" for k in kinds) + ")"


def citation_pattern(kinds: tuple[EvidenceKind, ...] = KINDS) -> str:
    """The evidence guard's loose citation bracket over `kinds` (the configuration fingerprint hashes it)."""
    one = loose_id(kinds)
    return rf"\[\s*({one}(?:\s*[,;]\s*{one})*)\s*\]"


# The evidence guard's loose id and citation bracket.
LOOSE_ID = loose_id()
LOOSE_ID_RE = re.compile(LOOSE_ID)
CITATION_RE = re.compile(citation_pattern())
# Well-formed ids only.
ID_PATTERN = "|".join(f"(?:{k.pattern})" for k in KINDS)
ID_RE = re.compile(rf"(?:{ID_PATTERN})(?![\w#-])")
STRICT_CITATION_RE = re.compile(rf"\[\s*(?:{ID_PATTERN})(?:\s*[,;]\s*(?:{ID_PATTERN}))*\s*\]")


def kind_of(text: str) -> EvidenceKind | None:
    """The kind whose prefix `text` starts with, well formed or not."""
    return next((k for k in KINDS if k.owns(text)), None) if isinstance(text, str) else None


def parse(text: str) -> EvidenceId | None:
    """A bare id (exactly: no blanks, no brackets) as an `EvidenceId`, or None."""
    kind = kind_of(text)
    return kind.parse(text) if kind is not None else None


def parse_citation(text: str) -> list[EvidenceId] | None:
    """The ids of one citation bracket (`[kb:a#1]`, `[kb:a#1, prom:…]`, blanks allowed around ids and
    separators), or None when `text` is not exactly one bracket of well-formed ids."""
    if not isinstance(text, str) or STRICT_CITATION_RE.fullmatch(text) is None:
        return None
    return [parse(m[0]) for m in ID_RE.finditer(text)]  # type: ignore[misc]


def cited_ids(text: str | None) -> list[str]:
    """The ids an answer cites (the guard's loose reading), in order of first appearance, without repeats."""
    ids: list[str] = []
    for bracket in CITATION_RE.findall(text or ""):
        ids.extend(LOOSE_ID_RE.findall(bracket))
    return list(dict.fromkeys(ids))
