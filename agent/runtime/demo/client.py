"""`DemoModelClient`: the demo model behind the same `ModelClient` interface as a real provider.

`complete` dispatches on the model name (`demo-router`, `demo-guard`, `demo-agent`) and, for the agent,
on the prompt's role (`prompts.role_of`: the AI Ops planner and executor, else the chat agent); it
streams the visible text in small pieces through the same `on_text` path as a real provider, reports a
short reasoning text (as a provider's `reasoning_content`) and a usage it counts itself
(`text.count_tokens`).
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
from agent.runtime.demo.aiops import aiops_execute, aiops_plan
from agent.runtime.demo.answers import answer_from_evidence, check_claims, no_evidence_answer, route
from agent.runtime.demo.text import count_tokens, evidence_in_turn, has_cjk, question_of
from agent.runtime.llm import ModelResult, ModelRoles, StreamProgress, TextCallback, parse_json_object
from audit.write import DeclaredToolCall, Usage

DELTA_DELAY_SECONDS = 0.005
DELTA_WORDS = 3


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
            verdict = check_claims(data["answer"], data.get("evidence") or [], data.get("failedCalls") or [])
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
        question, position = question_of(messages)
        cjk = has_cjk(question)
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
        results, items = evidence_in_turn(messages, position)
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
