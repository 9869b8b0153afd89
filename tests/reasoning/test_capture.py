"""Seed 000 capture rules: source priority, the 32000-character cut, content_source, content_bytes."""

import pytest
from openai.types.chat import ChatCompletionMessage
from openai.types.chat.chat_completion_chunk import ChoiceDelta

from reasoning.capture import (
    MAX_FIELD_CHARS,
    REASONING_KEYS,
    ToolCallPlan,
    build_capture,
    capture_message,
    extract_reasoning,
)


def test_dedicated_attribute_wins_over_every_extra_key():
    # The SDK keeps unknown provider fields: DeepSeek's reasoning_content becomes an attribute.
    msg = ChatCompletionMessage.model_validate(
        {
            "role": "assistant",
            "content": "answer",
            "reasoning_content": "from attribute",
            "reasoning": "from extra",
            "thinking": "from thinking",
        }
    )
    assert extract_reasoning(msg) == ("from attribute", "attribute")


class _Msg:
    """A message object whose provider fields live in a metadata mapping (no attribute)."""

    def __init__(self, metadata, content=""):
        self.metadata = metadata
        self.content = content


@pytest.mark.parametrize("index", range(len(REASONING_KEYS)))
def test_extra_keys_in_priority_order(index):
    key = REASONING_KEYS[index]
    # Every key of lower priority is present too; the one at `index` must win.
    metadata = {k: f"value of {k}" for k in REASONING_KEYS[index:]}
    assert extract_reasoning(metadata) == (f"value of {key}", key)
    assert extract_reasoning(_Msg(metadata)) == (f"value of {key}", key)


def test_empty_and_blank_sources_are_skipped():
    metadata = {"reasoning_content": "", "reasoningContent": "   ", "reasoning": "real"}
    assert extract_reasoning(metadata) == ("real", "reasoning")


def test_streamed_delta_attribute():
    delta = ChoiceDelta.model_validate({"reasoning_content": "step one"})
    assert extract_reasoning(delta) == ("step one", "attribute")


def test_structured_reasoning_blocks_are_read_as_text():
    metadata = {"thinking": [{"type": "thinking", "thinking": "a"}, {"type": "thinking", "text": "b"}]}
    assert extract_reasoning(metadata) == ("ab", "thinking")


def test_40000_cjk_and_emoji_characters_cut_to_exactly_32000():
    text = ("诊断日志🚀🔥" * 7000)[:40000]
    assert len(text) == 40000
    cap = build_capture(reasoning=text, text=text)
    assert len(cap.reasoning_content) == MAX_FIELD_CHARS == 32000
    assert len(cap.assistant_text) == 32000
    assert cap.reasoning_content == text[:32000]
    assert cap.reasoning_bytes == len(text[:32000].encode("utf-8"))
    assert cap.content_bytes == 2 * len(text[:32000].encode("utf-8"))


@pytest.mark.parametrize(
    "reasoning,text,calls,source",
    [
        ("r", "visible", [], "PROVIDER_REASONING+ASSISTANT_TEXT"),
        ("r", "", [ToolCallPlan("lookup_knowledge", '{"query":"x"}')], "PROVIDER_REASONING+ASSISTANT_TEXT"),
        ("r", "", [], "PROVIDER_REASONING"),
        (None, "visible", [], "ASSISTANT_TEXT"),
        (None, "visible", [ToolCallPlan("lookup_knowledge", "{}")], "ASSISTANT_TEXT"),
        (None, "", [ToolCallPlan("lookup_knowledge", "{}")], "TOOL_CALL_PLAN"),
        (None, None, [], "NONE"),
        ("   ", "  ", [], "NONE"),
    ],
)
def test_every_content_source_combination(reasoning, text, calls, source):
    cap = build_capture(reasoning=reasoning, text=text, tool_calls=calls)
    assert cap.content_source == source
    stored_r = cap.reasoning_content or ""
    stored_a = cap.assistant_text or ""
    assert cap.content_bytes == len(stored_r.encode()) + len(stored_a.encode())


def test_provider_without_reasoning_is_unavailable_and_null():
    cap = capture_message({"role": "assistant", "content": "plain answer"})
    assert cap.reasoning_available is False
    assert cap.reasoning_content is None
    assert cap.assistant_text == "plain answer"


def test_tool_plan_preview_is_bounded_and_has_no_results():
    long_args = '{"query": "' + "x" * 2000 + '"}'
    cap = build_capture(
        reasoning=None, text="", tool_calls=[ToolCallPlan("lookup_knowledge", long_args)] * 30
    )
    assert cap.assistant_text.startswith("tool_calls:\n- lookup_knowledge(")
    assert "… (2013 chars)" in cap.assistant_text
    assert "… 10 more" in cap.assistant_text
    assert len(cap.assistant_text) < 20 * 600


def test_nothing_is_synthesised_from_the_answer():
    cap = build_capture(reasoning=None, text="The answer is 42.")
    assert cap.reasoning_content is None and not cap.reasoning_available
