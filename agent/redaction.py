"""Secret redaction (and optional PII masking) of text that enters a run from outside: the question and the
previous turns, tool arguments and tool outputs, alert payloads (issue 33 items 1 and 2).

One `Redactor` per run: `redact(text)` (and `redact_value` for every string of a JSON value) replaces
each secret found (`detect-secrets`' plugins, the project's rules, `REDACTION_EXTRA_PATTERNS`, PII kinds
when `PII_MASKING` is on) with a typed placeholder `[REDACTED:<kind>#<n>]`, the same for the same
original across the run. It keeps only facts (`take()`: kinds, placeholders, a keyed HMAC of each
original), which an auditor holding the key can check (`verify_hmac`). Pure: no database, no logging.
Details: docs/security.md, *6. Secret redaction and PII masking*.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import re
import secrets
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

ENFORCE = "enforce"
OFF = "off"
MODES = (ENFORCE, OFF)
ALGORITHM = "HMAC-SHA256"
PLACEHOLDER = re.compile(r"\[REDACTED:[a-z0-9-]+#\d+\]")

# detect-secrets' secret types as placeholder kinds (any other type: its name in lowercase-hyphens).
_PLUGIN_KINDS = {
    "AWS Access Key": "aws-access-key",
    "Basic Auth Credentials": "url-password",
    "GitHub Token": "github-token",
    "GitLab Token": "gitlab-token",
    "Slack Token": "slack-token",
    "JSON Web Token": "jwt",
    "Secret Keyword": "secret-keyword",
    "Private Key": "private-key",
    "Base64 High Entropy String": "high-entropy-string",
    "Hex High Entropy String": "high-entropy-hex",
    "OpenAI Token": "openai-key",
    "Stripe Access Key": "stripe-key",
}
# Plugins left out: the public-IPv4 detector is PII (`PII_MASKING`'s `ipv4`), not a secret.
_SKIPPED_PLUGINS = {"IPPublicDetector"}

_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "private-key",
        re.compile(
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
            r"(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|[A-Za-z0-9+/=\s\\]*)",
            re.DOTALL,
        ),
    ),
    (
        "url-password",
        re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]{1,30}://[^\s:/@\[\]]{1,200}:([^\s@/\[\]]{1,200})@"),
    ),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{8,}")),
    ("gcp-private-key-id", re.compile(r"\"private_key_id\"\s*:\s*\"([0-9a-fA-F]{32,64})\"")),
    ("bearer-token", re.compile(r"(?i)\bbearer\s+([A-Za-z0-9._~+/-]{16,}=*)")),
    (
        "aws-secret-key",
        re.compile(r"(?i)aws_?secret_?access_?key[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9/+]{40})\b"),
    ),
)

# After detect-secrets' plugins: where a plugin names the same value more precisely (a GitHub token
# assigned to GITHUB_TOKEN), its kind wins (`find_secrets` keeps the first of equally long spans).
_LAST_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # An unquoted assignment to a secret-sounding name (`password=…`, `DB_PASSWORD = …`, `Pwd=…;`,
    # `api_key: …` when the value has a digit): detect-secrets' keyword detector needs quotes outside
    # config files, and ops pastes (env files, DSNs, command lines) rarely quote. Not a bare number
    # (`total_tokens=1234567`), a path (`PWD=/srv/app`), a quoted value (the detector's), a placeholder, nor
    # past an `@` (a URL's password is `url-password`'s) or a backslash (JSON-escaped text's next line).
    (
        "secret-keyword",
        re.compile(
            r"(?i)(?<![A-Za-z0-9])[A-Za-z0-9_.-]*"
            r"(?:passw(?:or)?d|passphrase|pwd|secret|token|api[_-]?key|access[_-]?key|auth[_-]?key|credentials?)"
            r"[A-Za-z0-9_.-]*\s*(?:=|:=|:(?=\s*[^\s'\"]*\d))\s*"
            r"(?![\"'\[/])(?!\d+(?:[\s,;&)]|$))([^\s'\",;&)@\\]{6,})"
        ),
    ),
)

_PII_RULES: dict[str, re.Pattern[str]] = {
    "email": re.compile(
        r"\b[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}\b"
    ),
    "phone": re.compile(
        r"(?<![\w.:/-])\+?\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}[ .-]\d{3,4}[ .-]?\d{0,4}(?![\w.:/-])"
    ),
    "ipv4": re.compile(
        r"(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)(?![\w.])"
    ),
    "ipv6": re.compile(
        r"(?<![\w:])(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}(?![\w:])"
        r"|(?<![\w:])(?:[0-9A-Fa-f]{1,4}:){1,6}:(?:[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4}){0,5})?(?![\w:])"
    ),
}


@dataclass(frozen=True, slots=True)
class Config:
    """The settings the redaction reads (`Config.from_settings()`)."""

    mode: str = ENFORCE
    allow_kinds: frozenset[str] = frozenset()
    extra_patterns: tuple[tuple[str, str], ...] = ()
    pii_kinds: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls) -> Config:
        mode = str(settings.REDACTION_MODE).strip().lower()
        allow = frozenset(str(k).strip().lower() for k in settings.REDACTION_ALLOW_KINDS or ())
        extra = tuple(parse_extra_patterns(settings.REDACTION_EXTRA_PATTERNS or ()))
        pii: tuple[str, ...] = ()
        if settings.PII_MASKING:
            kinds = settings.PII_MASKING_KINDS or ()
            pii = tuple(k for k in (str(x).strip().lower() for x in kinds) if k in _PII_RULES)
        return cls(mode=mode, allow_kinds=allow, extra_patterns=extra, pii_kinds=pii)


def parse_extra_patterns(entries: Iterable[str]) -> list[tuple[str, str]]:
    """`kind=regex` entries as (kind, regex); ValueError naming the entry's kind for a bad one."""
    out = []
    for entry in entries:
        kind, sep, regex = str(entry).partition("=")
        kind = kind.strip().lower()
        if not sep or not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,40}", kind) or not regex:
            raise ValueError("REDACTION_EXTRA_PATTERNS entries are kind=regex (kind: lowercase, digits, '-')")
        try:
            re.compile(regex)
        except re.error as exc:
            raise ValueError(f"REDACTION_EXTRA_PATTERNS {kind}: not a regular expression ({exc})") from None
        out.append((kind, regex))
    return out


# ---------------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------------
def _validate_key(value: str) -> None:
    if len(value.strip()) < 32:
        raise ValueError("too short")


def hmac_key() -> bytes:
    """`REDACTION_HMAC_KEY`, or in DEBUG the development key of `REDACTION_DEV_KEY_FILE`.
    ImproperlyConfigured without either (check `agent.E001` names it at start)."""
    key = str(settings.REDACTION_HMAC_KEY or "").strip()
    if key:
        return key.encode()
    dev_file = settings.REDACTION_DEV_KEY_FILE
    if dev_file:
        from core.devkeys import read_or_create

        return read_or_create(
            dev_file,
            generate=lambda: secrets.token_hex(32),
            validate=_validate_key,
            what="a redaction HMAC key",
        ).encode()
    raise ImproperlyConfigured("REDACTION_HMAC_KEY is required (DEBUG is off)")


def key_id(key: bytes) -> str:
    """A short public name of an HMAC key (the first 16 hex digits of sha256 of a derivation)."""
    return hashlib.sha256(b"redaction-key-id:" + key).hexdigest()[:16]


def keyed_digest(key: bytes, original: str) -> str:
    return hmac.new(key, original.encode("utf-8"), hashlib.sha256).hexdigest()


def verify_hmac(key: bytes, original: str, digest: str) -> bool:
    """Whether `original` is the value recorded under `digest` (constant-time)."""
    return hmac.compare_digest(keyed_digest(key, original), str(digest))


# ---------------------------------------------------------------------------------------------------
# Detection
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Detectors:
    """detect-secrets' plugins as a scan uses them, sorted once: each regex plugin's patterns with its
    kind; the plugins analysed per line where a keyword is (the keyword detector), where a quote is
    (the high-entropy strings) and on every line (any other)."""

    patterns: tuple[tuple[str, re.Pattern[str]], ...]
    on_keyword: tuple[Any, ...]
    on_quote: tuple[Any, ...]
    on_every_line: tuple[Any, ...]
    keyword: re.Pattern[str]
    quote: re.Pattern[str]


@lru_cache(maxsize=1)
def _detectors() -> _Detectors:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import RegexBasedDetector
    from detect_secrets.plugins.high_entropy_strings import HighEntropyStringsPlugin
    from detect_secrets.plugins.keyword import DENYLIST

    patterns, on_keyword, on_quote, on_every_line = [], [], [], []
    for cls in get_mapping_from_secret_type_to_class().values():
        if cls.__name__ in _SKIPPED_PLUGINS:
            continue
        if cls.__name__ == "Base64HighEntropyString":
            plugin = cls(limit=4.5)
        elif cls.__name__ == "HexHighEntropyString":
            plugin = cls(limit=3.0)
        else:
            plugin = cls()
        if isinstance(plugin, RegexBasedDetector):
            patterns += [(_kind(plugin.secret_type), pattern) for pattern in plugin.denylist]
        elif cls.__name__ == "KeywordDetector":
            on_keyword.append(plugin)
        elif isinstance(plugin, HighEntropyStringsPlugin):
            on_quote.append(plugin)
        else:
            on_every_line.append(plugin)
    return _Detectors(
        patterns=tuple(patterns),
        on_keyword=tuple(on_keyword),
        on_quote=tuple(on_quote),
        on_every_line=tuple(on_every_line),
        keyword=re.compile("|".join(DENYLIST), re.IGNORECASE),
        quote=re.compile("['\"]"),
    )


@lru_cache(maxsize=64)
def _kind(secret_type: str) -> str:
    kind = _PLUGIN_KINDS.get(secret_type)
    return kind or re.sub(r"[^a-z0-9]+", "-", secret_type.lower()).strip("-")[:40]


_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+/=")


def _widen(text: str, start: int, end: int) -> tuple[int, int]:
    """A plugin's match widened to the whole token around it (a regex that stops early, e.g. at an
    upper-case letter, must not leave the secret's tail behind)."""
    while start > 0 and text[start - 1] in _TOKEN_CHARS and text[start - 1] != "=":
        start -= 1
    while end < len(text) and text[end] in _TOKEN_CHARS:
        end += 1
    return start, end


def _plugin_spans(text: str) -> list[tuple[int, int, str]]:
    """The spans detect-secrets' plugins find: a regex plugin's patterns directly (its secret group
    when that is a real value, else the whole match, widened to the token), the others (keywords,
    high-entropy strings) through `analyze_line` per line, each value wherever it occurs on its line."""
    detectors = _detectors()
    spans = []
    for kind, pattern in detectors.patterns:
        for m in pattern.finditer(text):
            group = 1 if pattern.groups and len(m.group(1) or "") >= 8 else 0
            start, end = m.span(group)
            while start < end and text[start] in " \t\r\n\"'=:":
                start += 1
            while end > start and text[end - 1] in " \t\r\n\"'":
                end -= 1
            if end - start >= 8:
                spans.append((*_widen(text, start, end), kind))
    # Cheap checks first: the keyword detector's regexes only where a keyword is, the high-entropy ones
    # (quoted strings) only where a quote is. No `detect_secrets.settings.default_settings()` around
    # them: these plugins are configured here, and of its settings `analyze_line` reads only whether to
    # verify a secret over the network (never configured here), while entering it clears the package's
    # caches (about 0.8 ms of CPU per scan: most of a short text's scan).
    offset = 0
    for line in text.splitlines(keepends=True):
        plugins = detectors.on_every_line
        if detectors.on_keyword and detectors.keyword.search(line):
            plugins += detectors.on_keyword
        if detectors.on_quote and detectors.quote.search(line):
            plugins += detectors.on_quote
        for plugin in plugins:
            try:
                found = plugin.analyze_line(filename="redaction", line=line, line_number=0)
            except Exception:  # noqa: S112 - one plugin's failure must not stop the others (no content logged)
                continue
            for secret in found:
                value = secret.secret_value or ""
                if len(value) < 6:
                    continue
                start = line.find(value)
                while start >= 0:
                    spans.append((offset + start, offset + start + len(value), _kind(secret.type)))
                    start = line.find(value, start + len(value))
        offset += len(line)
    return spans


def _regex_spans(text: str, rules: Iterable[tuple[str, re.Pattern[str]]]) -> list[tuple[int, int, str]]:
    spans = []
    for kind, pattern in rules:
        for m in pattern.finditer(text):
            group = 1 if pattern.groups else 0
            start, end = m.span(group)
            if end > start:
                spans.append((start, end, kind))
    return spans


@lru_cache(maxsize=32)
def _compiled(extra: tuple[tuple[str, str], ...]) -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple((kind, re.compile(regex)) for kind, regex in extra)


# What was found in the texts scanned recently, by the SHA-256 of the text (never the text itself) and the
# configuration: runbook sections, tool outputs and questions recur across runs, and a scan costs about
# 0.1 ms of CPU for a short string and 8 ms per 5 KB of JSON (detect-secrets' plugins), so a repeated
# text is scanned once.
_FOUND_CACHE_SIZE = 4096
_found_cache: collections.OrderedDict[tuple[bytes, Config], tuple[tuple[int, int, str], ...]] = (
    collections.OrderedDict()
)
_found_lock = threading.Lock()


def find_secrets(text: str, config: Config) -> list[tuple[int, int, str]]:
    """Non-overlapping spans (start, end, kind) of what `config` redacts in `text`, in text order. Of
    overlapping spans the longest wins (a PEM block over the pieces a plugin saw in it). A text scanned
    recently under the same configuration is answered from `_found_cache`."""
    if config.mode == OFF or not text:
        return []
    key = (hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest(), config)
    with _found_lock:
        found = _found_cache.get(key)
        if found is not None:
            _found_cache.move_to_end(key)
            return list(found)
    chosen = _scan(text, config)
    with _found_lock:
        _found_cache[key] = tuple(chosen)
        if len(_found_cache) > _FOUND_CACHE_SIZE:
            _found_cache.popitem(last=False)
    return chosen


def _scan(text: str, config: Config) -> list[tuple[int, int, str]]:
    spans = (
        _regex_spans(text, _RULES)
        + _plugin_spans(text)
        + _regex_spans(text, _LAST_RULES)
        + _regex_spans(text, _compiled(config.extra_patterns))
    )
    spans += _regex_spans(text, ((k, _PII_RULES[k]) for k in config.pii_kinds))
    protected = [m.span() for m in PLACEHOLDER.finditer(text)]
    chosen: list[tuple[int, int, str]] = []
    for start, end, kind in sorted(spans, key=lambda s: (-(s[1] - s[0]), s[0])):
        if kind in config.allow_kinds:
            continue
        if any(start < e and s < end for s, e, _k in chosen) or any(
            start < e and s < end for s, e in protected
        ):
            continue
        chosen.append((start, end, kind))
    return sorted(chosen)


# ---------------------------------------------------------------------------------------------------
# The run's redactor
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Redaction:
    """One distinct original a run met: its kind, placeholder and keyed HMAC (never the original)."""

    kind: str
    placeholder: str
    hmac: str

    def as_json(self) -> dict[str, str]:
        return {"kind": self.kind, "placeholder": self.placeholder, "hmac": self.hmac}


class Redactor:
    """One run's redaction (see the module docstring). Not thread-safe across runs; one per run."""

    def __init__(
        self,
        *,
        config: Config | None = None,
        key: bytes | None = None,
        known: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        self.config = config if config is not None else Config.from_settings()
        self._key = key
        self._by_hmac: dict[str, Redaction] = {}
        self._counts: dict[str, int] = {}
        self._new: list[Redaction] = []
        self._occurrences: dict[str, int] = {}
        # Originals met by this redactor, in memory only (never stored, never logged): a repeat of one
        # is replaced even where no detector would see it.
        self._seen: dict[str, str] = {}
        # Tools of one step redact their outputs on pool threads at once: one redaction at a time, and
        # `locked` keeps a redaction and its `take` together.
        self.lock = threading.RLock()
        for fact in known:
            self._remember(Redaction(str(fact["kind"]), str(fact["placeholder"]), str(fact["hmac"])))

    @property
    def enabled(self) -> bool:
        return self.config.mode != OFF

    @property
    def key(self) -> bytes:
        if self._key is None:
            self._key = hmac_key()
        return self._key

    @property
    def key_id(self) -> str:
        return key_id(self.key)

    def _remember(self, r: Redaction) -> None:
        self._by_hmac[r.hmac] = r
        m = re.fullmatch(r"\[REDACTED:[a-z0-9-]+#(\d+)\]", r.placeholder)
        if m:
            self._counts[r.kind] = max(self._counts.get(r.kind, 0), int(m.group(1)))

    def _placeholder(self, kind: str, original: str, count: bool = True) -> str:
        digest = keyed_digest(self.key, original)
        known = self._by_hmac.get(digest)
        if known is None:
            n = self._counts.get(kind, 0) + 1
            self._counts[kind] = n
            known = Redaction(kind, f"[REDACTED:{kind}#{n}]", digest)
            self._by_hmac[digest] = known
            self._new.append(known)
        if count:
            self._occurrences[known.kind] = self._occurrences.get(known.kind, 0) + 1
        return known.placeholder

    def redact(self, text: str, *, count: bool = True) -> str:
        """`text` with every secret replaced by its placeholder (unchanged when nothing is found).
        `count=False`: the same text is redacted again elsewhere and counted there (a new original is
        still remembered and reported)."""
        if not self.enabled or not isinstance(text, str) or not text:
            return text
        with self.lock:
            return self._redact(text, count)

    def _redact(self, text: str, count: bool) -> str:
        spans = self._spans(text)
        if not spans:
            return text
        parts, last = [], 0
        for start, end, kind, original in spans:
            parts.append(text[last:start])
            parts.append(self._placeholder(kind, original, count))
            last = end
        parts.append(text[last:])
        return "".join(parts)

    def _spans(self, text: str) -> list[tuple[int, int, str, str]]:
        """The detected spans of `text` (start, end, kind, original), plus every other occurrence of an
        original this redactor has met (detected here or earlier in the run, e.g. a password seen in a
        URL and repeated bare, or in JSON-escaped form), replaced by the same placeholder."""
        found = [(s, e, k, _decoded(text[s:e])) for s, e, k in find_secrets(text, self.config)]
        for _s, _e, kind, original in found:
            self._seen.setdefault(original, kind)
        taken = [(s, e) for s, e, _k, _o in found] + [m.span() for m in PLACEHOLDER.finditer(text)]
        for original, kind in self._seen.items():
            if len(original) < 8:
                continue
            forms = {original, json.dumps(original, ensure_ascii=False)[1:-1]}
            for form in forms:
                at = text.find(form)
                while at >= 0:
                    end = at + len(form)
                    if not any(at < e and s < end for s, e in taken):
                        found.append((at, end, kind, original))
                        taken.append((at, end))
                    at = text.find(form, end)
        return sorted(found)

    def redact_value(self, value: Any) -> Any:
        """Every string of a JSON-like value (keys included) redacted; other values unchanged."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, Mapping):
            return {
                self.redact(k) if isinstance(k, str) else k: self.redact_value(v) for k, v in value.items()
            }
        if isinstance(value, (list, tuple)):
            if len(value) > 1 and all(isinstance(v, str) for v in value):
                return self._redact_lines(value)
            return [self.redact_value(v) for v in value]
        return value

    def _redact_lines(self, items: list[str] | tuple[str, ...]) -> list[str]:
        """A list of strings (a log's lines) redacted as the text they make together, so that a secret
        spread over several items (a PEM block) is found: the item where it starts gets its
        placeholder, the rest of it is removed from the items it continues into."""
        joined = "\n".join(items)
        with self.lock:
            return self._redact_joined(items, joined)

    def _redact_joined(self, items: list[str] | tuple[str, ...], joined: str) -> list[str]:
        spans = self._spans(joined) if self.enabled else []
        if not spans:
            return list(items)
        placeholders = [self._placeholder(kind, original) for _s, _e, kind, original in spans]
        out, begin = [], 0
        for item in items:
            end_of_item = begin + len(item)
            parts, cursor = [], begin
            for (start, end, _kind, _original), placeholder in zip(spans, placeholders, strict=True):
                if end <= begin or start >= end_of_item:
                    continue
                parts.append(joined[cursor : max(start, begin)])
                if start >= begin:
                    parts.append(placeholder)
                cursor = min(end, end_of_item)
            parts.append(joined[cursor:end_of_item])
            out.append("".join(parts))
            begin = end_of_item + 1
        return out

    def take(self) -> dict[str, Any] | None:
        """The facts of what was redacted since the last `take` (None when nothing was): `counts` (per
        kind, occurrences replaced), `items` (each new distinct original: kind, placeholder, HMAC),
        `algorithm`, `keyId`. Never an original."""
        with self.lock:
            return self._take()

    def _take(self) -> dict[str, Any] | None:
        if not self._occurrences:
            return None
        facts = {
            "counts": dict(sorted(self._occurrences.items())),
            "items": [r.as_json() for r in self._new],
            "algorithm": ALGORITHM,
            "keyId": self.key_id,
        }
        self._occurrences, self._new = {}, []
        return facts

    def known(self) -> list[dict[str, str]]:
        """Every distinct original met so far, as facts (to rebuild the redactor: `known=`)."""
        return [r.as_json() for r in self._by_hmac.values()]


def _decoded(found: str) -> str:
    """A secret found inside JSON text (a PEM block with `\\n` escapes) as the value it stands for, so
    that its HMAC is the one of the real key and its placeholder the one of its raw form."""
    if "\\" not in found:
        return found
    try:
        value = json.loads(f'"{found}"')
    except ValueError:
        return found
    return value if isinstance(value, str) else found


def summary(facts: Mapping[str, Any] | None) -> dict[str, int]:
    """Kinds and counts only (what a live frame may carry)."""
    return {str(k): int(v) for k, v in ((facts or {}).get("counts") or {}).items()}
