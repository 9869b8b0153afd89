"""Text of the knowledge base: the one tokeniser the index and the queries share (NFKC, lower case;
jieba's search segmentation for CJK runs; latin words and the parts of dotted, hyphenated or underscored
words; the stop words of `data/`), and the phrase form tag matching compares.
Details: docs/architecture.md, *Knowledge (`agent/knowledge/`)*.
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("data")


def _stopwords(name: str) -> frozenset[str]:
    """The words of a stop-word file in `data/` (one a line; blank lines ignored), read once at import."""
    text = (DATA / name).read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip())


STOPWORDS_EN = _stopwords("stopwords_en.txt")
STOPWORDS_ZH = _stopwords("stopwords_zh.txt")

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_RUN_RE = re.compile(rf"[{_CJK}]+|[a-z0-9]+(?:[._\-][a-z0-9]+)*")
CJK_RE = re.compile(rf"[{_CJK}]")
_PART_SPLIT_RE = re.compile(r"[._\-]")
_PHRASE_SEP_RE = re.compile(r"[\s_\-]+")


_jieba_lock = threading.Lock()
_jieba_tokenizer: Any = None


def segmenter() -> Any:
    """jieba's tokenizer, imported and initialised on first use (loading its dictionary takes ~1 s)."""
    global _jieba_tokenizer
    if _jieba_tokenizer is None:
        with _jieba_lock:
            if _jieba_tokenizer is None:
                import jieba

                jieba.setLogLevel(logging.WARNING)
                tokenizer = jieba.Tokenizer()
                tokenizer.initialize()
                _jieba_tokenizer = tokenizer
    return _jieba_tokenizer


def normalize(text: str) -> str:
    return unicodedata.normalize("NFKC", text).lower()


def tokenize(text: str) -> list[str]:
    """Index/query tokens of `text` in order (see the module docstring); duplicates are kept."""
    tokens: list[str] = []
    for match in _RUN_RE.finditer(normalize(text)):
        run = match.group()
        if CJK_RE.match(run):
            words = segmenter().lcut_for_search(run)
            tokens.extend(word for word in words if word.strip() and word not in STOPWORDS_ZH)
            continue
        if run in STOPWORDS_EN:
            continue
        tokens.append(run)
        if _PART_SPLIT_RE.search(run):
            tokens.extend(
                part for part in _PART_SPLIT_RE.split(run) if len(part) > 1 and part not in STOPWORDS_EN
            )
    return tokens


def phrase(text: str) -> str:
    return _PHRASE_SEP_RE.sub(" ", normalize(text)).strip()
