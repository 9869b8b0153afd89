"""The `demo` provider: a deterministic offline model behind the same `ModelClient` interface.

Used when no API key is configured (`LLM_PROVIDER=demo`), so the product works out of the box and every
layer (router, agent loop, tools, guards, release, audit) runs for real. Nothing here is canned per
question; each role computes its answer from the conversation it receives:

* `demo-router` classifies the message with keyword heuristics (greetings, off-topic subjects, how-to
  phrasing, symptom words) and answers the router's JSON.
* `demo-agent`, with tools offered and no tool result yet in this turn, calls `lookup_knowledge` with the
  question. Once results are in, it writes a short answer from the evidence text: the sentences and
  commands that share the most terms with the question, each followed by its `[kb:<slug>#<n>]`. Evidence
  sharing too few terms with the question is ignored; with none left it answers without a citation, which
  the evidence guard blocks. Small talk and off-topic requests get a short reply without tools.
* AI Ops analyses (`agent.runtime.aiops`, recognised by their system prompts, `prompts.role_of`):
  as the planner it writes a plan grounded on the alert text (the alert's name and expression, with the
  tools the prompt lists); as the executor it first calls `list_alerts` and `query_metrics` (the alert's
  expression, else `ALERTS{alertname=…}`) when they are offered, then `lookup_knowledge` with the alert
  text, revises the plan (a ```plan block) when a tool failed, and writes the report from what the tools
  returned: metric sentences cited with the `prom:` ids of the results it got, runbook sentences cited
  with their `kb:` ids (never an id no tool returned), and a stated `Confidence:` line.
* `demo-guard` splits the answer into sentences and checks that each claim's words occur in the evidence
  it cites (word overlap), then answers the guard's JSON.

Each call reports a short reasoning text (as a provider's `reasoning_content` would be) and a usage it
counts itself (latin words, CJK characters and punctuation marks are one token each). Visible text is
streamed in small pieces through the same `on_text` path as a real provider.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence
from typing import Any

from django.utils import timezone

from agent.runtime import prompts
from agent.runtime.llm import ModelResult, ModelRoles, StreamProgress, TextCallback, parse_json_object
from audit.recorder import DeclaredToolCall, Usage

DELTA_DELAY_SECONDS = 0.005
DELTA_WORDS = 3
MAX_EVIDENCE_ITEMS = 3
SENTENCES_PER_ITEM = 2
SUPPORT_RATIO = 0.7
MIN_CLAIM_TOKENS = 3

_TOKEN_RE = re.compile(r"[A-Za-z0-9_]+|[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\sA-Za-z0-9_]")
_WORD_RE = re.compile(r"[a-z0-9]+(?:[-_./][a-z0-9]+)*")
_CJK_RUN_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_CITATION_RE = re.compile(r"\[(?:(?:kb|prom):[^\[\]\s,;]+)(?:\s*[,;]\s*(?:kb|prom):[^\[\]\s,;]+)*\]")
_CITED_ID_RE = re.compile(r"(?:kb|prom):[^\[\]\s,;]+")
_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+(?!\[(?:kb|prom):)|(?<=[。！？])(?!\s*\[(?:kb|prom):)")
_STOP_WORDS = """
a an the and or but if of to in on at by for with from into about as is are was were be been being
it its this that these those there here i you we they he she my your our their me us them do does
did doing done have has had can could should would will shall may might must not no yes so than then
too very just also what which who whom whose when where why how all any some each more most other
such only own same again further once please help get got
的 了 是 在 和 与 及 或 把 被 就 都 也 还 吗 呢 吧 啊 我 你 他 她 它 这 那 一个 怎么 如何 什么 为什么
"""
_STOP = frozenset(_STOP_WORDS.split())

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


# ---------------------------------------------------------------------------------------------------
# Text helpers
# ---------------------------------------------------------------------------------------------------
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


def _has_cjk(text: str) -> bool:
    return bool(_CJK_RUN_RE.search(text or ""))


def _units(text: str) -> list[tuple[str, bool]]:
    """Sentences of evidence text, and commands from its code blocks: `(unit, is_command)`."""
    units: list[tuple[str, bool]] = []
    in_code = False
    prose: list[str] = []

    def flush() -> None:
        paragraph = " ".join(prose).strip()
        prose.clear()
        for sentence in _SENTENCE_RE.split(paragraph):
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


def _question(messages: Sequence[dict[str, Any]]) -> tuple[str, int]:
    """The current question (the last user message that is not a repair request) and its position."""
    for position in range(len(messages) - 1, -1, -1):
        message = messages[position]
        content = str(message.get("content") or "")
        if message.get("role") == "user" and not content.startswith(prompts.REPAIR_MARKER):
            return content, position
    return "", -1


def _evidence_in_turn(messages: Sequence[dict[str, Any]], start: int) -> tuple[int, list[dict[str, Any]]]:
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


# ---------------------------------------------------------------------------------------------------
# The three roles
# ---------------------------------------------------------------------------------------------------
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
    return str(item.get("id", "")).split("#", 1)[0].removeprefix("kb:")


def _pick(wanted: set[str], text: str) -> list[str]:
    """Up to `SENTENCES_PER_ITEM` prose sentences sharing the most terms with the question (the first
    sentence when none does), then the command sharing the most terms, in their order in the text."""
    prose, commands = [], []
    for order, (unit, is_command) in enumerate(_units(text)):
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
    header = "根据运行手册：" if _has_cjk(question) else "From the runbooks:"
    return header + "\n" + "\n".join(lines), used


def no_evidence_answer(question: str) -> str:
    if _has_cjk(question):
        return (
            "运行手册中没有找到与这个问题相关的内容，因此无法给出经过验证的答案。"
            "请补充服务名称和具体的错误信息后再试。"
        )
    return (
        "I could not find a runbook that covers this question, so I cannot give a verified answer. "
        "Try again with the service name and the exact error message."
    )


def check_claims(answer: str, evidence: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Word-overlap support check: each claim (a sentence of ≥ 3 content terms; a line ending with a colon
    and citing nothing introduces a list and is skipped) must share ≥ 70 % of its terms with the evidence
    it cites."""
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
        if line.rstrip().endswith((":", "：")) and not _CITATION_RE.search(line):
            continue  # an introduction ("From the runbooks:") is not a claim
        line_ids = _CITED_ID_RE.findall(" ".join(_CITATION_RE.findall(line)))
        for sentence in _SENTENCE_RE.split(line):
            ids = _CITED_ID_RE.findall(" ".join(_CITATION_RE.findall(sentence))) or line_ids
            terms = content_tokens(_CITATION_RE.sub(" ", sentence))
            if len(terms) < MIN_CLAIM_TOKENS:
                continue
            claims += 1
            known: set[str] = set().union(*(by_id.get(i, set()) for i in ids)) if ids else set()
            if not known or len(terms & known) / len(terms) < SUPPORT_RATIO:
                claim = " ".join(_CITATION_RE.sub(" ", sentence).split()).strip(" -.。;；")
                unsupported.append(claim[:200])
    if unsupported:
        reason = f"{len(unsupported)} of {claims} claim(s) are not supported by the evidence they cite"
    else:
        reason = f"all {claims} claim(s) are supported by the cited evidence"
    return {"supported": not unsupported, "unsupportedClaims": unsupported, "reason": reason}


# ---------------------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------------------
class DemoModelClient:
    """`ModelClient` of the offline demo model (see the module docstring)."""

    provider = "demo"
    roles = ModelRoles(router="demo-router", agent="demo-agent", guard="demo-guard")

    def __init__(self, *, delta_delay: float = DELTA_DELAY_SECONDS) -> None:
        self.delta_delay = delta_delay

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        tool_choice: str | None = None,
        on_text: TextCallback | None = None,
        progress: StreamProgress | None = None,
    ) -> ModelResult:
        progress = progress if progress is not None else StreamProgress()
        progress.started_at = timezone.now()
        progress.started_monotonic = time.monotonic()
        entry: dict[str, Any] = {"attempt": 1}
        progress.attempts.append(entry)
        began = time.monotonic()
        if model.endswith("router"):
            text, reasoning, calls = self._router(messages)
        elif model.endswith("guard"):
            text, reasoning, calls = self._guard(messages)
        else:
            text, reasoning, calls = self._agent(messages, tools, tool_choice)
        if reasoning:
            progress.reasoning.append(reasoning)
            progress.reasoning_key = "reasoning_content"
        words = re.findall(r"\S+\s*|\s+", text)
        for start in range(0, len(words), DELTA_WORDS):
            piece = "".join(words[start : start + DELTA_WORDS])
            progress.text.append(piece)
            if on_text is not None:
                await on_text(piece)
            if self.delta_delay:
                await asyncio.sleep(self.delta_delay)
        prompt = sum(count_tokens(str(m.get("content") or "")) + 4 for m in messages)
        prompt += count_tokens(json.dumps(list(tools))) if tools else 0
        reasoning_tokens = count_tokens(reasoning)
        completion = count_tokens(text) + reasoning_tokens + sum(count_tokens(c.arguments) + 3 for c in calls)
        entry.update(status=200, durationMs=int((time.monotonic() - began) * 1000))
        return ModelResult(
            model=model,
            text=text,
            reasoning=reasoning or None,
            reasoning_key="reasoning_content" if reasoning else None,
            tool_calls=tuple(calls),
            finish_reason="tool_calls" if calls else "stop",
            usage=Usage(
                available=True,
                prompt_tokens=prompt,
                completion_tokens=completion,
                total_tokens=prompt + completion,
                reasoning_tokens=reasoning_tokens,
                cached_tokens=0,
            ),
            attempts=tuple(progress.attempts),
            started_at=progress.started_at,
            finished_at=timezone.now(),
            duration_ms=progress.duration_ms() or 0,
        )

    def _router(self, messages: Sequence[dict[str, Any]]) -> tuple[str, str, list[DeclaredToolCall]]:
        query = str(messages[-1].get("content") or "") if messages else ""
        marker = "Message to classify:\n"
        if marker in query:
            query = query.split(marker, 1)[1]
        decision = route(query)
        return json.dumps(decision, ensure_ascii=False), "", []

    def _guard(self, messages: Sequence[dict[str, Any]]) -> tuple[str, str, list[DeclaredToolCall]]:
        data = parse_json_object(str(messages[-1].get("content") or "")) if messages else None
        if not data or not isinstance(data.get("answer"), str):
            verdict = {"supported": False, "unsupportedClaims": [], "reason": "guard input unreadable"}
        else:
            verdict = check_claims(data["answer"], data.get("evidence") or [])
        count = len((data or {}).get("evidence") or [])
        reasoning = f"Checked the answer's claims against {count} evidence item(s)."
        return json.dumps(verdict, ensure_ascii=False), reasoning, []

    def _agent(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        tool_choice: str | None,
    ) -> tuple[str, str, list[DeclaredToolCall]]:
        role = prompts.role_of(messages)
        if role == "planner":
            return aiops_plan(messages)
        if role == "executor":
            return aiops_execute(messages, tools, tool_choice)
        intent = prompts.intent_of(messages) or "DIAGNOSIS"
        question, position = _question(messages)
        cjk = _has_cjk(question)
        if intent == "CHITCHAT":
            text = (
                "你好！我是运维诊断助手（离线演示模型）。请描述你遇到的告警、错误信息或变慢的服务，"
                "我会在运行手册中查找并注明出处。"
                if cjk
                else "Hello! I am the operations diagnosis assistant (offline demo model). Describe an "
                "alert, an error message or a slow service, and I will look it up in the runbooks and "
                "cite what I find."
            )
            return text, "Small talk: reply briefly, no tools needed.", []
        if intent == "OUT_OF_SCOPE":
            text = (
                "抱歉，我只能根据运行手册帮助诊断基础设施和服务问题，这个请求不在我的范围内。"
                if cjk
                else "Sorry, I can only help diagnose infrastructure and service problems from the team's "
                "runbooks; that request is outside what I can answer."
            )
            return text, "The request is unrelated to operations: decline politely.", []
        results, items = _evidence_in_turn(messages, position)
        tool_names = {str((t.get("function") or {}).get("name")) for t in tools or []}
        if results == 0 and "lookup_knowledge" in tool_names and tool_choice != "none":
            arguments = json.dumps({"query": question[:500], "top_k": 5}, ensure_ascii=False)
            reasoning = (
                f"The question looks like a {intent} request. I must answer from the runbooks, "
                "so I will search them with lookup_knowledge first."
            )
            count = sum(1 for m in messages if m.get("role") == "tool")
            call = DeclaredToolCall(
                tool_call_id=f"call_demo_{count + 1}", name="lookup_knowledge", arguments=arguments
            )
            return "", reasoning, [call]
        text, used = answer_from_evidence(question, items)
        if not text:
            reasoning = (
                f"lookup_knowledge returned {len(items)} evidence item(s) but none shares enough terms with "
                "the question; I will say that the runbooks do not cover it."
            )
            return no_evidence_answer(question), reasoning, []
        reasoning = (
            f"lookup_knowledge returned {len(items)} evidence item(s); {', '.join(used)} match the question. "
            "I will answer with their most relevant sentences and cite each one."
        )
        return text, reasoning, []


# ---------------------------------------------------------------------------------------------------
# AI Ops: the planner and the executor
# ---------------------------------------------------------------------------------------------------
_ALERT_NAME_RES = (
    re.compile(r"\balertname\s*[=:]\s*\"?([A-Za-z_][A-Za-z0-9_:]*)"),
    re.compile(r"^\s*-\s+([A-Za-z_][A-Za-z0-9_:]*)(?=\s*(?:\[severity|since\b|$))", re.M),
    re.compile(r"\bAlert\s+([A-Z][A-Za-z0-9_:]*)"),
)
_EXPR_RE = re.compile(r"^\s*(?:expression|expr|query)\s*:\s*(.+?)\s*$", re.I | re.M)
_TOOLS_LINE_RE = re.compile(r"can use these tools:\s*([^.\n]*)")
_STOP_NAMES = frozenset({"firing", "resolved", "group", "is", "the", "a"})


def alert_facts(text: str) -> tuple[str | None, str | None]:
    """The alert's name and PromQL expression as the alert text states them (None when it does not)."""
    names = (m for pattern in _ALERT_NAME_RES for m in pattern.findall(text or ""))
    name = next((m for m in names if m.lower() not in _STOP_NAMES), None)
    expr = _EXPR_RE.search(text or "")
    return name, (expr.group(1)[:500] if expr else None)


def _metric_query(name: str | None, expr: str | None) -> str:
    """The PromQL the demo executor runs: the alert's expression, else its ALERTS series, else `up`."""
    return expr or (f'ALERTS{{alertname="{name}"}}' if name else "up")


def _planner_tools(messages: Sequence[dict[str, Any]]) -> list[str]:
    system = str(messages[0].get("content") or "") if messages else ""
    found = _TOOLS_LINE_RE.search(system)
    return (
        [t.strip() for t in found.group(1).split(",") if t.strip() and t.strip() != "none"] if found else []
    )


def _alert_text(messages: Sequence[dict[str, Any]]) -> tuple[str, int]:
    """The alert the executor was given (without the plan) and the position of its message."""
    question, position = _question(messages)
    alert = question.split("\n\nPlan:\n", 1)[0].removeprefix("Alert:\n")
    return alert, position


def aiops_plan(messages: Sequence[dict[str, Any]]) -> tuple[str, str, list[DeclaredToolCall]]:
    """The planner's answer: a plan grounded on the alert text, with the tools the prompt lists."""
    alert = str(messages[-1].get("content") or "") if messages else ""
    name, expr = alert_facts(alert)
    tools = set(_planner_tools(messages))
    subject = name or "the alert"
    steps = []
    if "list_alerts" in tools:
        steps.append(
            {
                "check": f"Which alerts fire with {subject}, on which instances, and since when",
                "why": "the scope of the incident: one instance or many",
                "tool": "list_alerts",
            }
        )
    if "query_metrics" in tools:
        steps.append(
            {
                "check": f"The metric behind {subject}: {_metric_query(name, expr)}"[:200],
                "why": "confirm the symptom from the metric itself and see its current value",
                "tool": "query_metrics",
            }
        )
    steps.append(
        {
            "check": f"The runbook for {subject}",
            "why": "the documented causes, how to confirm them and how to fix them",
            "tool": "lookup_knowledge" if "lookup_knowledge" in tools else None,
        }
    )
    reasoning = (
        f"The alert names {subject}; I plan {len(steps)} step(s) with the tools offered "
        f"({', '.join(sorted(tools)) or 'none'})."
    )
    return json.dumps({"steps": steps}, ensure_ascii=False), reasoning, []


def _tool_results(messages: Sequence[dict[str, Any]], start: int) -> list[tuple[str, dict[str, Any]]]:
    """The tool results after `start`: (tool name, parsed content), the name found from the call id."""
    names = {}
    for message in messages[start + 1 :]:
        for call in message.get("tool_calls") or []:
            names[call.get("id")] = (call.get("function") or {}).get("name")
    out = []
    for message in messages[start + 1 :]:
        if message.get("role") == "tool":
            data = parse_json_object(str(message.get("content") or "")) or {}
            out.append((str(names.get(message.get("tool_call_id")) or ""), data))
    return out


def _metric_items(results: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The metric results the tools returned, `{"id": "prom:…", "text"}`: an evidence item of the
    result (`query_metrics`' shape, as `lookup_knowledge`'s) or a bare `evidenceId` beside its text."""
    items = []
    for _name, data in results:
        candidates = [i for i in data.get("evidence") or [] if isinstance(i, dict)]
        if isinstance(data.get("evidenceId"), str):
            candidates.append({"id": data["evidenceId"], "text": data.get("text")})
        items.extend(
            {"id": i["id"], "text": i["text"]}
            for i in candidates
            if str(i.get("id", "")).startswith("prom:") and isinstance(i.get("text"), str)
        )
    return items


def _metric_lines(items: Sequence[dict[str, Any]]) -> list[str]:
    """Lines of each metric result's readable text (its first three), cited with the id it came with."""
    lines = []
    for item in items:
        text_lines = [" ".join(line.split()) for line in item["text"].splitlines() if line.strip()]
        lines.extend(f"- {line.rstrip(':')} [{item['id']}]" for line in text_lines[:3])
    return lines


def aiops_execute(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    tool_choice: str | None,
) -> tuple[str, str, list[DeclaredToolCall]]:
    """The executor's next step: metrics and alerts first, then the runbooks, then the report."""
    alert, position = _alert_text(messages)
    name, expr = alert_facts(alert)
    offered = {str((t.get("function") or {}).get("name")) for t in tools or []}
    results = _tool_results(messages, position)
    called = {tool for tool, _data in results}
    count = sum(1 for m in messages if m.get("role") == "tool")
    may_call = tool_choice != "none" and bool(offered)

    if may_call and not results:
        calls = []
        if "list_alerts" in offered:
            arguments = {"filter": [f'alertname="{name}"']} if name else {}
            calls.append(("list_alerts", arguments))
        if "query_metrics" in offered:
            query = _metric_query(name, expr)
            calls.append(("query_metrics", {"query": query, "range_minutes": 30}))
        if not calls and "lookup_knowledge" in offered:
            calls.append(("lookup_knowledge", {"query": alert[:500], "top_k": 5}))
        if calls:
            declared = [
                DeclaredToolCall(
                    tool_call_id=f"call_demo_{count + n}",
                    name=tool,
                    arguments=json.dumps(arguments, ensure_ascii=False),
                )
                for n, (tool, arguments) in enumerate(calls, start=1)
            ]
            reasoning = f"Following the plan: {', '.join(tool for tool, _a in calls)} first."
            return "", reasoning, declared

    if may_call and "create_silence" in offered and "create_silence" not in called:
        minutes = silence_minutes(alert)
        if minutes is not None:
            arguments = {
                "matchers": [{"name": "alertname", "value": name or "unknown", "isRegex": False}],
                "duration_minutes": minutes,
                "comment": f"Silence {name or 'the alert'} for {minutes} min while it is investigated",
            }
            call = DeclaredToolCall(
                tool_call_id=f"call_demo_{count + 1}",
                name="create_silence",
                arguments=json.dumps(arguments, ensure_ascii=False),
            )
            return "", f"The alert asks for a silence: I propose one for {minutes} minutes.", [call]

    if may_call and "lookup_knowledge" in offered and "lookup_knowledge" not in called:
        failed = [tool for tool, data in results if isinstance(data.get("error"), dict)]
        text = ""
        if failed:
            plan = {
                "steps": [
                    {
                        "check": f"The runbook for {name or 'the alert'}",
                        "why": f"{', '.join(failed)} failed: the runbooks are what is left to check",
                        "tool": "lookup_knowledge",
                    }
                ]
            }
            text = f"```{prompts.PLAN_FENCE}\n{json.dumps(plan, ensure_ascii=False)}\n```"
        call = DeclaredToolCall(
            tool_call_id=f"call_demo_{count + 1}",
            name="lookup_knowledge",
            arguments=json.dumps({"query": alert[:500], "top_k": 5}, ensure_ascii=False),
        )
        reasoning = "Metrics and alerts are in" + (f" ({', '.join(failed)} failed)" if failed else "")
        return text, reasoning + "; now the runbooks for this alert.", [call]

    return _report(alert, results)


_SILENCE_RE = re.compile(r"\bsilence\b(?:[^.\n]*?\bfor\s+(\d{1,4})\s*(?:min|minutes?)\b)?", re.IGNORECASE)


def silence_minutes(alert: str) -> int | None:
    """How long the alert text asks a silence for (`… silence it for 30 minutes …`; 60 when it names
    no duration), or None when it asks for none: the demo executor then proposes `create_silence`."""
    found = _SILENCE_RE.search(alert or "")
    if found is None:
        return None
    return int(found.group(1)) if found.group(1) else 60


def _report(
    alert: str, results: Sequence[tuple[str, dict[str, Any]]]
) -> tuple[str, str, list[DeclaredToolCall]]:
    """The report from what the tools returned (sentences of the evidence, each cited)."""
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _tool, data in results:
        for item in data.get("evidence") or []:
            if (
                isinstance(item, dict)
                and str(item.get("id", "")).startswith("kb:")
                and item["id"] not in seen
            ):
                seen.add(item["id"])
                items.append(item)
    items.sort(key=lambda item: -float(item.get("score") or 0))
    kb_text, used = answer_from_evidence(alert, items)
    kb_lines = [line for line in kb_text.splitlines()[1:] if line.startswith("- ")]
    metrics = _metric_items(results)
    metric_lines = _metric_lines(metrics)
    # A metric result that matched no series confirms nothing about the alert.
    confirmed = [m for m in metrics if not re.search(r"\b0 series\b|no series matched", m["text"])]
    failed = [tool for tool, data in results if isinstance(data.get("error"), dict)]
    if not kb_lines and not metric_lines:
        text = (
            "## Summary\nThe tools returned no evidence that explains this alert.\n\n"
            "## Evidence\nNone.\n\n## Likely cause\nUnknown.\n\n## Next steps\n"
            "Check the alert's source directly.\n\nConfidence: low"
        )
        return text, "No tool result explains the alert; I say so.", []
    commands = [line for line in kb_lines if "`" in line]
    cause = [line for line in kb_lines if "`" not in line][:1] or kb_lines[:1] or metric_lines[:1]
    steps = commands[:2] or kb_lines[-1:] or metric_lines[-1:]
    summary = (metric_lines or kb_lines)[:1]
    confidence = "high" if kb_lines and confirmed else ("medium" if kb_lines or confirmed else "low")
    sections = [
        "## Summary",
        *summary,
        "",
        "## Evidence",
        *metric_lines,
        *kb_lines,
        "",
        "## Likely cause",
        *cause,
        "",
        "## Next steps",
        *steps,
        "",
        f"Confidence: {confidence}",
    ]
    reasoning = (
        f"{len(metric_lines)} metric sentence(s) and {len(kb_lines)} runbook sentence(s) "
        f"({', '.join(used) or 'no runbook'}) support the report"
        + (f"; {', '.join(failed)} failed" if failed else "")
        + "."
    )
    return "\n".join(sections), reasoning, []
