"""The demo model's reading of text: its token count, the terms two texts share, sentences and commands
of evidence text, and where the current question and this turn's evidence are in a conversation.

Pure functions over strings and message lists (no model, no I/O); every role of the demo model
(`agent.runtime.demo.answers`, `.aiops`, `.client`) reads text through them, so they all count and
compare words the same way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agent.runtime import prompts
from agent.runtime.llm import parse_json_object
from diagnosis.evidence import PREFIXES

_TOKEN_RE = re.compile(r"[A-Za-z0-9_]+|[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\sA-Za-z0-9_]")
_WORD_RE = re.compile(r"[a-z0-9]+(?:[-_./][a-z0-9]+)*")
_CJK_RUN_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
# Any id of a declared kind, well formed or not (`diagnosis.evidence.PREFIXES`: `(?:kb|prom)`).
_CITED_ID = rf"{PREFIXES}:[^\[\]\s,;]+"
CITATION_RE = re.compile(rf"\[(?:{_CITED_ID})(?:\s*[,;]\s*{_CITED_ID})*\]")
CITED_ID_RE = re.compile(_CITED_ID)
SENTENCE_RE = re.compile(rf"(?<=[.!?])\s+(?!\[{PREFIXES}:)|(?<=[。！？])(?!\s*\[{PREFIXES}:)")
_STOP_WORDS = """
a an the and or but if of to in on at by for with from into about as is are was were be been being
it its this that these those there here i you we they he she my your our their me us them do does
did doing done have has had can could should would will shall may might must not no yes so than then
too very just also what which who whom whose when where why how all any some each more most other
such only own same again further once please help get got
的 了 是 在 和 与 及 或 把 被 就 都 也 还 吗 呢 吧 啊 我 你 他 她 它 这 那 一个 怎么 如何 什么 为什么
"""
_STOP = frozenset(_STOP_WORDS.split())


def count_tokens(text: str | None) -> int:
    """The demo's token count: latin words, CJK characters and punctuation marks count one each."""
    return len(_TOKEN_RE.findall(text or ""))


def content_tokens(text: str | None) -> set[str]:
    """Terms for overlap: latin words (lower case, stop words dropped) and CJK character bigrams."""
    lowered = (text or "").lower()
    terms = {w for w in _WORD_RE.findall(lowered) if len(w) > 1 and w not in _STOP}
    for word in list(terms):
        terms.update(p for p in re.split(r"[-_./]", word) if len(p) > 1 and p not in _STOP)
    for run in _CJK_RUN_RE.findall(lowered):
        if len(run) == 1 and run not in _STOP:
            terms.add(run)
        terms.update(run[i : i + 2] for i in range(len(run) - 1))
    return terms


def has_cjk(text: str) -> bool:
    return bool(_CJK_RUN_RE.search(text or ""))


def units(text: str) -> list[tuple[str, bool]]:
    """Sentences of evidence text, and commands from its code blocks: `(unit, is_command)`."""
    units: list[tuple[str, bool]] = []
    in_code = False
    prose: list[str] = []

    def flush() -> None:
        paragraph = " ".join(prose).strip()
        prose.clear()
        for sentence in SENTENCE_RE.split(paragraph):
            sentence = re.sub(r"^\s*(?:[-*+]|\d+[.)])\s+", "", sentence).replace("**", "").strip()
            # A sentence ending with a colon introduces a list or a code block: not a claim on its own.
            if 15 <= len(sentence) <= 320 and not sentence.endswith((":", "：")):
                units.append((sentence, False))

    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```") or stripped.startswith("~~~"):
            flush()
            in_code = not in_code
            continue
        if in_code:
            if stripped and not stripped.startswith("#") and len(stripped) <= 160:
                units.append((f"`{stripped}`", True))
            continue
        if not stripped or stripped.startswith("#"):
            flush()
            continue
        prose.append(stripped)
    flush()
    return units


def question_of(messages: Sequence[dict[str, Any]]) -> tuple[str, int]:
    """The current question (the last user message that is not a repair request) and its position."""
    for position in range(len(messages) - 1, -1, -1):
        message = messages[position]
        content = str(message.get("content") or "")
        if message.get("role") == "user" and not content.startswith(prompts.REPAIR_MARKER):
            return content, position
    return "", -1


def evidence_in_turn(messages: Sequence[dict[str, Any]], start: int) -> tuple[int, list[dict[str, Any]]]:
    """How many tool results this turn holds and the evidence items they carried, best first."""
    results, items, seen = 0, [], set()
    for message in messages[start + 1 :]:
        if message.get("role") != "tool":
            continue
        results += 1
        data = parse_json_object(str(message.get("content") or "")) or {}
        for item in data.get("evidence") or []:
            if isinstance(item, dict) and item.get("id") and item["id"] not in seen:
                seen.add(item["id"])
                items.append(item)
    items.sort(key=lambda item: -float(item.get("score") or 0))
    return results, items
