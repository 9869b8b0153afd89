"""The demo model's chat roles, computed from what they receive (nothing is canned per question):

* `route`: the router's decision by keyword heuristics (greetings, off-topic, how-to, symptom words);
* `answer_from_evidence` / `no_evidence_answer`: the agent's answer from the evidence text, the sentences
  and commands sharing the most terms with the question, each cited with its `[kb:<slug>#<n>]`;
* `check_claims`: the guard's verdict, each claim's words checked against the evidence it cites (and
  a sentence naming a failed action's object, unnegated, read as a claim that it happened).

`DEMO_QUESTIONS` are the questions `manage.py bootstrap_demo` asks on a fresh database.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agent.runtime.demo.text import CITATION_RE, CITED_ID_RE, SENTENCE_RE, content_tokens, has_cjk, units
from diagnosis.evidence import RUNBOOK_CHUNK

MAX_EVIDENCE_ITEMS = 3
SENTENCES_PER_ITEM = 2
SUPPORT_RATIO = 0.7
MIN_CLAIM_TOKENS = 3

GREETINGS = (
    "hi",
    "hello",
    "hey",
    "good morning",
    "good afternoon",
    "good evening",
    "thanks",
    "thank you",
    "thx",
    "who are you",
    "what can you do",
    "你好",
    "您好",
    "谢谢",
    "多谢",
    "你是谁",
    "早上好",
)
OFF_TOPIC = (
    "poem",
    "joke",
    "recipe",
    "weather",
    "football",
    "soccer",
    "movie",
    "song",
    "lyrics",
    "horoscope",
    "stock price",
    "写诗",
    "笑话",
    "菜谱",
    "天气",
    "股票",
    "电影",
)
HOW_TO = (
    "how do",
    "how to",
    "how can",
    "what is",
    "what are",
    "explain",
    "difference between",
    "如何",
    "什么是",
)
SYMPTOMS = (
    "error",
    "fail",
    "down",
    "slow",
    "high",
    "spike",
    "lag",
    "timeout",
    "timed out",
    "5xx",
    "502",
    "503",
    "504",
    "crash",
    "oom",
    "killed",
    "full",
    "notready",
    "not ready",
    "pending",
    "stuck",
    "refused",
    "unreachable",
    "latency",
    "alert",
    "exhaust",
    "backlog",
    "red",
    "expir",
    "报错",
    "失败",
    "超时",
    "慢",
    "延迟",
    "宕机",
    "满",
    "告警",
    "积压",
    "不可用",
    "异常",
    "丢包",
)


# Questions `manage.py bootstrap_demo` runs on a fresh database: two runbook questions (published), small
# talk, and a question the runbooks do not cover (blocked by the evidence guard).
DEMO_QUESTIONS = (
    "The disk is full on /var/log and services fail with 'No space left on device'. What should I check?",
    "Redis 连接超时怎么排查？",
    "Hello! What can you do?",
    "How do I configure SAML single sign-on for our Grafana dashboards?",
)


def route(query: str) -> dict[str, Any]:
    """Keyword heuristics standing in for a router model."""
    text = " ".join(query.lower().split())
    terms = content_tokens(text)
    if any(text.startswith(g) for g in GREETINGS) and len(terms) <= 6:
        return {"intent": "CHITCHAT", "confidence": 0.9, "reason": "greeting or question about the assistant"}
    if any(word in text for word in OFF_TOPIC):
        return {"intent": "OUT_OF_SCOPE", "confidence": 0.8, "reason": "subject unrelated to IT operations"}
    symptom = any(word in text for word in SYMPTOMS)
    if any(text.startswith(h) or f" {h}" in text for h in HOW_TO) and not symptom:
        return {"intent": "KNOWLEDGE", "confidence": 0.75, "reason": "how-to or conceptual question"}
    if symptom:
        return {"intent": "DIAGNOSIS", "confidence": 0.85, "reason": "describes a symptom to diagnose"}
    return {"intent": "DIAGNOSIS", "confidence": 0.55, "reason": "operations question, no clear symptom"}


def _slug(item: dict[str, Any]) -> str:
    parsed = RUNBOOK_CHUNK.parse(str(item.get("id", "")))
    return parsed["slug"] if parsed is not None else ""


def _pick(wanted: set[str], text: str) -> list[str]:
    """Up to `SENTENCES_PER_ITEM` prose sentences sharing the most terms with the question (the first
    sentence when none does), then the command sharing the most terms, in their order in the text."""
    prose, commands = [], []
    for order, (unit, is_command) in enumerate(units(text)):
        (commands if is_command else prose).append((len(wanted & content_tokens(unit)), -order, unit))
    picked = sorted((p for p in prose if p[0] > 0), reverse=True)[:SENTENCES_PER_ITEM] or prose[:1]
    best_command = sorted((c for c in commands if c[0] > 0), reverse=True)[:1]
    return [unit for _score, _order, unit in sorted(picked + best_command, key=lambda p: -p[1])]


def answer_from_evidence(question: str, items: Sequence[dict[str, Any]]) -> tuple[str, list[str]]:
    """A short answer of the evidence sentences most related to the question, each cited; returns the
    text and the ids used (empty when no evidence shares enough terms with the question).

    Items come best first; an item counts only when enough of its terms are the question's and, unless it
    is the retrieval's top item, its title or heading names one of them. The answer keeps to the best
    relevant item's runbook (up to two of its items) and adds another runbook's item only when it shares
    as many terms with the question."""
    wanted = content_tokens(question)
    need = 2 if len(wanted) >= 3 else 1
    scored = []
    for rank, item in enumerate(items):
        topic = content_tokens(f"{item.get('title', '')}\n{item.get('heading', '')}")
        overlap = len(wanted & (topic | content_tokens(str(item.get("text") or ""))))
        # Relevant: enough terms match, and the retrieval ranked it first or its title/section names a
        # term of the question (retrieval already weighed synonyms such as replica/replication).
        if (rank == 0 or wanted & topic) and overlap >= need:
            scored.append((overlap, item))
    if not scored:
        return "", []
    primary = _slug(scored[0][1])
    chosen = [item for _overlap, item in scored if _slug(item) == primary][:2]
    others = [(overlap, item) for overlap, item in scored if _slug(item) != primary]
    if others and others[0][0] >= scored[0][0]:
        chosen.append(others[0][1])
    lines: list[str] = []
    used: list[str] = []
    for item in chosen[:MAX_EVIDENCE_ITEMS]:
        picked = _pick(wanted, str(item.get("text") or ""))
        if picked:
            used.append(item["id"])
            lines.extend(f"- {unit} [{item['id']}]" for unit in picked)
    if not lines:
        return "", []
    header = "根据运行手册：" if has_cjk(question) else "From the runbooks:"
    return header + "\n" + "\n".join(lines), used


def no_evidence_answer(question: str) -> str:
    if has_cjk(question):
        return (
            "运行手册中没有找到与这个问题相关的内容，因此无法给出经过验证的答案。"
            "请补充服务名称和具体的错误信息后再试。"
        )
    return (
        "I could not find a runbook that covers this question, so I cannot give a verified answer. "
        "Try again with the service name and the exact error message."
    )


# A tool name's verb is not what a claim names (`create_silence` -> "silence").
_TOOL_VERBS = frozenset(
    {"create", "list", "query", "read", "lookup", "get", "run", "delete", "update", "set"}
)
_NEGATION_RE = re.compile(r"\b(not|no|never|failed|could not|cannot|unable)\b|未|没有|失败|不", re.IGNORECASE)


def _claimed_actions(answer: str, failed_calls: Sequence[dict[str, Any]]) -> list[str]:
    """Sentences that name the object of a failed action (`failedCalls` with `action`) without negating
    it: the demo guard reads them as claims that the action happened."""
    stems = {
        part[:6].lower()
        for call in failed_calls
        if isinstance(call, dict) and call.get("action")
        for part in str(call.get("tool") or "").split("_")
        if part and part.lower() not in _TOOL_VERBS
    }
    if not stems:
        return []
    claims = []
    for line in answer.splitlines():
        for sentence in SENTENCE_RE.split(line):
            lowered = sentence.lower()
            if any(stem in lowered for stem in stems) and not _NEGATION_RE.search(sentence):
                claims.append(" ".join(CITATION_RE.sub(" ", sentence).split()).strip(" -.。;；")[:200])
    return claims


def check_claims(
    answer: str, evidence: Sequence[dict[str, Any]], failed_calls: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """Word-overlap support check: each claim (a sentence of ≥ 3 content terms; a line ending with a colon
    and citing nothing introduces a list and is skipped) must share ≥ 70 % of its terms with the evidence
    it cites; a claim that a failed action happened is never supported (`_claimed_actions`)."""
    by_id = {
        str(item.get("id")): content_tokens(
            f"{item.get('title', '')}\n{item.get('heading', '')}\n{item.get('text', '')}"
        )
        for item in evidence
        if isinstance(item, dict)
    }
    unsupported: list[str] = []
    claims = 0
    for line in answer.splitlines():
        if line.rstrip().endswith((":", "：")) and not CITATION_RE.search(line):
            continue  # an introduction ("From the runbooks:") is not a claim
        line_ids = CITED_ID_RE.findall(" ".join(CITATION_RE.findall(line)))
        for sentence in SENTENCE_RE.split(line):
            ids = CITED_ID_RE.findall(" ".join(CITATION_RE.findall(sentence))) or line_ids
            terms = content_tokens(CITATION_RE.sub(" ", sentence))
            if len(terms) < MIN_CLAIM_TOKENS:
                continue
            claims += 1
            known: set[str] = set().union(*(by_id.get(i, set()) for i in ids)) if ids else set()
            if not known or len(terms & known) / len(terms) < SUPPORT_RATIO:
                claim = " ".join(CITATION_RE.sub(" ", sentence).split()).strip(" -.。;；")
                unsupported.append(claim[:200])
    actions = _claimed_actions(answer, failed_calls)
    if actions:
        unsupported += [a for a in actions if a not in unsupported]
        reason = f"{len(actions)} claim(s) say a failed action happened"
    elif unsupported:
        reason = f"{len(unsupported)} of {claims} claim(s) are not supported by the evidence they cite"
    else:
        reason = f"all {claims} claim(s) are supported by the cited evidence"
    return {"supported": not unsupported, "unsupportedClaims": unsupported, "reason": reason}
