"""Native chat and tool templates through the official ``openai`` client: tools rendered by the tokenizer's own
template, tool calls parsed per family (Hermes/Qwen spans, Llama 3 JSON), a template that rewrites earlier
turns (Qwen3 drops old ``<think>`` blocks) extended token-exactly. The templates are written here, after those
families' published templates (``asyncrl.testing.chat_templates``), on the tiny tokenizer; a scripted engine
plays the model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from serve_helpers import ScriptedEngine, client, serve_in_thread

from asyncrl.config.serve import ServeConfig
from asyncrl.models.loading import load_tokenizer
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.serve.chat_format import TemplateFormat
from asyncrl.serve.service import CompletionService
from asyncrl.serve.toolcalls import make_tool_parser, parse_llama3_tool_calls
from asyncrl.testing.chat_templates import LLAMA3_LIKE, QWEN3_LIKE, with_template

ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


def serve(tokenizer: Any, texts: list[str]):
    scripted = ScriptedEngine(tokenizer, texts)
    proxy = LLMProxy([scripted])
    config = ServeConfig(port=0, chat_format="template", api_key="sekrit", max_tokens_limit=64)
    return serve_in_thread(
        CompletionService(proxy=proxy, tokenizer=tokenizer, config=config), proxy, scripted
    )


def ask(c, messages: list[dict], **kwargs: Any):
    answer = c.chat.completions.create(model="asyncrl-policy", messages=messages, **kwargs)
    messages.append(answer.choices[0].message.model_dump(exclude_none=True))
    return answer.choices[0]


def test_a_template_that_rewrites_earlier_turns_is_extended_token_exactly() -> None:
    """Qwen3 drops turn 1's reasoning once a new question comes: re-rendering would change what the model saw.
    The trajectory keeps turn 1 as sampled and adds only what the template puts after it."""
    tokenizer = with_template(QWEN3_LIKE)
    first_answer = "<think>\ncount the letters\n</think>\n\na b"
    for served in serve(tokenizer, [first_answer, "<think>\nagain\n</think>\n\nc"]):
        c = client(served, "qwen3")
        messages: list[dict] = [
            {"role": "system", "content": "Copy."},
            {"role": "user", "content": "copy a b:"},
        ]
        first = ask(c, messages)
        assert first.message.content == first_answer and first.finish_reason == "stop"
        branch = served.service.store.get("qwen3").live_branch
        after_first = list(branch.token_ids)
        messages.append({"role": "user", "content": "copy c:"})
        ask(c, messages)
        trajectory = served.service.store.get("qwen3")
        assert len(trajectory.tokens.branches) == 1  # recognised as the same conversation, extended
        tokens = trajectory.live_branch.token_ids
        assert tokens[: len(after_first)] == after_first  # turn 1 exactly as the model saw and wrote it
        text = tokenizer.decode(tokens)
        assert text.count("count the letters") == 1  # kept, though a fresh render would drop it
        rerendered = tokenizer.apply_chat_template(messages[:-1], tokenize=False)
        assert "count the letters" not in rerendered  # what the template itself would have shown
        expected_tail = "<|im_start|>user\ncopy c:<|im_end|>\n<|im_start|>assistant\n"
        assert tokenizer.decode(tokens[len(after_first) :]).startswith(expected_tail)


def test_tools_are_rendered_by_the_template_and_parallel_calls_round_trip() -> None:
    tokenizer = with_template(QWEN3_LIKE)
    calls = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>'
    for served in serve(tokenizer, [calls, "5 and 2"]):
        c = client(served, "tools")
        messages: list[dict] = [{"role": "user", "content": "2+3 and 1+1?"}]
        first = ask(c, messages, tools=[ADD])
        assert first.finish_reason == "tool_calls" and first.message.content is None
        assert [json.loads(t.function.arguments) for t in first.message.tool_calls] == [
            {"a": 2, "b": 3},
            {"a": 1, "b": 1},
        ]
        messages += [
            {"role": "tool", "tool_call_id": t.id, "content": r}
            for t, r in zip(first.message.tool_calls, "52", strict=True)
        ]
        second = ask(c, messages, tools=[ADD])
        assert second.message.content == "5 and 2" and second.message.tool_calls is None
        trajectory = served.service.store.get("tools")
        assert len(trajectory.tokens.branches) == 1
        context = tokenizer.decode(trajectory.live_branch.token_ids)
        assert '<tools>\n{"type": "function", "function": {"name": "add"' in context  # the template's tools
        assert "You may call the tools listed below" not in context  # not the fallback system message
        grouped = "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>\n"
        assert grouped in context  # both results in one user block, as the template groups them
        assert context.count('<tool_call>\n{"name": "add"') == 2  # the calls as sampled, once each


def test_llama3_json_tool_calls_are_parsed_and_results_rendered_as_ipython() -> None:
    tokenizer = with_template(LLAMA3_LIKE)
    call = '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}'
    for served in serve(tokenizer, [call, call, "It is 5."]):
        streamed = list(
            client(served).chat.completions.create(
                model="asyncrl-policy",
                messages=[{"role": "user", "content": "2+3?"}],
                tools=[ADD],
                stream=True,
            )
        )
        assert (
            "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices) == ""
        )  # no JSON leaks
        [delta] = [
            ch.choices[0].delta.tool_calls[0]
            for ch in streamed
            if ch.choices and ch.choices[0].delta.tool_calls
        ]
        assert delta.function.name == "add"
        assert [ch.choices[0].finish_reason for ch in streamed if ch.choices][-1] == "tool_calls"
        c = client(served, "llama")
        messages: list[dict] = [{"role": "user", "content": "2+3?"}]
        first = ask(c, messages, tools=[ADD])
        [tool_call] = first.message.tool_calls
        assert (tool_call.function.name, json.loads(tool_call.function.arguments)) == (
            "add",
            {"a": 2, "b": 3},
        )
        messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": "5"})
        assert ask(c, messages, tools=[ADD]).message.content == "It is 5."
        trajectory = served.service.store.get("llama")
        context = tokenizer.decode(trajectory.live_branch.token_ids)
        assert len(trajectory.tokens.branches) == 1 and "Environment: ipython" in context
        assert "<|start_header_id|>ipython<|end_header_id|>\n\n5<|eot_id|>" in context


@pytest.mark.parametrize(
    ("text", "calls", "content"),
    [
        ('{"name": "f", "parameters": {"x": 1}}', [("f", {"x": 1})], ""),
        (
            '<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "arguments": {"y": 2}}',
            [("f", {}), ("g", {"y": 2})],
            "",
        ),
        ("The answer is {not json}.", [], "The answer is {not json}."),
        (
            '{"name": "f", "parameters": {"x": 1}} and then text',
            [],
            '{"name": "f", "parameters": {"x": 1}} and then text',
        ),
        ('{"title": "no name"}', [], '{"title": "no name"}'),
    ],
)
def test_llama3_tool_calls_parse_only_whole_json_calls(text: str, calls: list, content: str) -> None:
    parsed_content, parsed = parse_llama3_tool_calls(text)
    assert [(c["name"], json.loads(c["arguments"])) for c in parsed] == calls and parsed_content == content


def test_the_parser_follows_the_template_family() -> None:
    assert make_tool_parser("auto", LLAMA3_LIKE) is parse_llama3_tool_calls
    assert make_tool_parser("auto", QWEN3_LIKE)('<tool_call>{"name": "f"}</tool_call>')[1][0]["name"] == "f"
    assert make_tool_parser("none", QWEN3_LIKE)('<tool_call>{"name": "f"}</tool_call>')[1] == []
    with pytest.raises(ValueError, match="serve.tool_parser"):
        make_tool_parser("mistral", None)
    assert TemplateFormat(with_template(QWEN3_LIKE)).renders_tools
    assert not TemplateFormat(
        load_tokenizer("tiny-copy")
    ).renders_tools  # tools then come as a system message
