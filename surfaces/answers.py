"""A released answer as safe HTML: the one place where answer text (Markdown written by a model) becomes
markup, for the chat page (the `outcome` frame's `contentHtml`), the admin run page and the runbook view.

`render_answer(content) -> str` (a `SafeString`) parses with markdown-it-py with raw HTML and linkify off,
turns well-formed evidence citations in text (ids read by `diagnosis.evidence`) into runbook links or
metric chips, and sanitizes the result with nh3 against an allowlist, so nothing a model writes can
become script, an unsafe link or an attribute outside the list. Renders are cached (`CACHE_SIZE`).
Details: docs/chat.md, *Rendering answers (`surfaces/answers.py`)*.
"""

from __future__ import annotations

import functools

import nh3
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.token import Token

from audit import failed_calls
from diagnosis.evidence import ID_RE, RUNBOOK_CHUNK, STRICT_CITATION_RE, parse

CACHE_SIZE = 512
CITATION_CLASS = "citation"
METRIC_CITATION_CLASS = "citation citation-metric"

ALLOWED_TAGS = frozenset(
    {
        "p",
        "ul",
        "ol",
        "li",
        "code",
        "pre",
        "strong",
        "em",
        "a",
        "blockquote",
        "h1",
        "h2",
        "h3",
        "h4",
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
        "br",
        "hr",
    }
)
ALLOWED_ATTRIBUTES = {"a": {"href", "class"}, "code": {"class"}}
URL_SCHEMES = frozenset({"http", "https"})
LINK_REL = "noopener noreferrer"

# A bracket of well-formed evidence ids: `[` id (`,`|`;` id)* `]` (`diagnosis.evidence`).
_ID_RE = ID_RE
_BRACKET_RE = STRICT_CITATION_RE


def chunk_url(*, slug: str, ordinal: int | str) -> str:
    """The runbook view of document `slug` with chunk `ordinal` highlighted and scrolled to."""
    return f"{reverse('knowledge-document', kwargs={'slug': slug})}?chunk={ordinal}#chunk-{ordinal}"


def _text_token(content: str) -> Token:
    token = Token("text", "", 0)
    token.content = content
    return token


def _citation_tokens(text: str) -> list[Token] | None:
    """`text` as text and citation-link tokens, or None when it holds no citation bracket."""
    out: list[Token] = []
    position = 0
    for bracket in _BRACKET_RE.finditer(text):
        if bracket.start() > position:
            out.append(_text_token(text[position : bracket.start()]))
        inner_start = bracket.start() + 1
        inner = text[inner_start : bracket.end() - 1]
        cursor = 0
        for evidence in _ID_RE.finditer(inner):
            separator = inner[cursor : evidence.start()].strip()
            if separator:  # `,` or `;` between two ids, kept as the model wrote it
                out.append(_text_token(separator + " "))
            cited = parse(evidence[0])
            if cited is not None and cited.kind is RUNBOOK_CHUNK:
                link = Token("link_open", "a", 1)
                link.attrs = {
                    "class": CITATION_CLASS,
                    "href": chunk_url(slug=cited["slug"], ordinal=cited["ordinal"]),
                }
                out.extend([link, _text_token(evidence[0]), Token("link_close", "a", -1)])
            else:  # a metric result: a chip, not a link (markdown-it escapes the content)
                chip = Token("code_inline", "code", 0)
                chip.attrs = {"class": METRIC_CITATION_CLASS}
                chip.content = evidence[0]
                out.append(chip)
            cursor = evidence.end()
        position = bracket.end()
    if not out:
        return None
    if position < len(text):
        out.append(_text_token(text[position:]))
    return out


def _link_citations(state: StateCore) -> None:
    """Core rule: citation brackets in inline text tokens (outside links) become citation links."""
    for block in state.tokens:
        if block.type != "inline" or not block.children:
            continue
        children: list[Token] = []
        in_link = 0
        for token in block.children:
            if token.type == "link_open":
                in_link += 1
            elif token.type == "link_close":
                in_link -= 1
            replaced = _citation_tokens(token.content) if token.type == "text" and not in_link else None
            children.extend(replaced if replaced is not None else [token])
        block.children = children


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable("table")
    md.core.ruler.after("text_join", "citations", _link_citations)
    return md


_MARKDOWN = _parser()


@functools.lru_cache(maxsize=CACHE_SIZE)
def render_answer(content: str) -> SafeString:
    """`content` (Markdown) as sanitized HTML with citation links; "" for empty content. The service's
    failed-calls section (`audit.failed_calls`) is rendered apart, in `<aside class="failed-calls">`."""
    if not content:
        return mark_safe("")
    body, section = failed_calls.split(content)
    html = _clean(body)
    if section:
        label = "Failed tool calls"
        aside = f'<aside class="failed-calls" role="note" aria-label="{label}">{_clean(section)}</aside>'
        html = f"{html}\n{aside}" if html else aside
    # Safe by construction: markdown-it with raw HTML off, then nh3 with the allowlist above; the aside
    # is fixed markup around sanitized HTML.
    return mark_safe(html)  # noqa: S308


def _clean(content: str) -> str:
    html = _MARKDOWN.render(content)
    return nh3.clean(
        html,
        tags=set(ALLOWED_TAGS),
        attributes={tag: set(names) for tag, names in ALLOWED_ATTRIBUTES.items()},
        url_schemes=set(URL_SCHEMES),
        link_rel=LINK_REL,
        strip_comments=True,
    ).strip()
