"""The documented tool-call text format, both ways: rendered spans parse back, malformed spans stay text."""

from __future__ import annotations

import json

from asyncrl.serve.chat_format import harness_message, message_text
from asyncrl.serve.toolcalls import parse_tool_calls, render_tool_call, render_tool_result


def test_rendered_calls_parse_back_with_the_text_around_them() -> None:
    text = "Let me add. " + render_tool_call("add", {"a": 2, "b": 3}) + render_tool_call("noop", {})
    content, calls = parse_tool_calls(text)
    assert content == "Let me add."
    assert calls == [{"name": "add", "arguments": '{"a": 2, "b": 3}'}, {"name": "noop", "arguments": "{}"}]


def test_malformed_spans_are_left_as_text() -> None:
    text = '<tool_call>{"name": 3}</tool_call> and <tool_call>not json</tool_call>'
    content, calls = parse_tool_calls(text)
    assert calls == []
    assert content == text


def test_a_harness_tool_call_and_its_result_render_into_the_context() -> None:
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"b": 3, "a": 2}'}}
        ],
    }
    assert message_text(harness_message(call)) == render_tool_call("add", {"a": 2, "b": 3})
    result = message_text(harness_message({"role": "tool", "content": "5", "tool_call_id": "c1"}))
    assert result == render_tool_result("5") == "<tool_response>5</tool_response>"
    assert json.loads(parse_tool_calls(message_text(harness_message(call)))[1][0]["arguments"]) == {
        "a": 2,
        "b": 3,
    }
