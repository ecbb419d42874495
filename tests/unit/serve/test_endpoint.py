"""The endpoint driven by the official ``openai`` client against uvicorn on 127.0.0.1 (an ephemeral port),
serving the shipped tiny model through the built-in engine and the real LLM proxy.

One server per module (start-up is the slow part); each test names its own trajectories.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from serve_helpers import ScriptedEngine, Served, client, serve_in_thread

from asyncrl.config.engine import EngineConfig
from asyncrl.config.proxy import ProxyConfig
from asyncrl.config.serve import ServeConfig
from asyncrl.engine import make_engine
from asyncrl.models.loading import load_model_and_tokenizer, resolve_model_path
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.serve.service import CompletionService
from asyncrl.serve.toolcalls import render_tool_call

COPY = "copy {}:"


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer(resolve_model_path("tiny-copy"), "float32", "cpu")


@pytest.fixture(scope="module")
def served(tiny) -> Iterator[Served]:
    """The tiny model in the ``plain`` format it was trained on, ``in_flight`` weight updates."""
    model, tokenizer = tiny
    engine = make_engine(model, tokenizer, EngineConfig())
    proxy = LLMProxy([engine], ProxyConfig(update_policy="in_flight"))
    config = ServeConfig(
        port=0,
        chat_format="plain",
        api_key="sekrit",
        max_tokens_limit=128,
        max_messages=16,
        max_tools=2,
        max_body_bytes=20_000,
        max_content_chars=2_000,
    )
    yield from serve_in_thread(
        CompletionService(proxy=proxy, tokenizer=tokenizer, config=config), proxy, engine
    )


def test_binds_loopback_on_an_ephemeral_port(served: Served) -> None:
    host, port = served.address
    assert host == "127.0.0.1" and port > 0
    assert ServeConfig().host == "127.0.0.1"
    outward = _non_loopback_address()
    if outward is not None:  # the port is not reachable on this machine's other address
        with pytest.raises(OSError):
            socket.create_connection((outward, port), timeout=1).close()


def _non_loopback_address() -> str | None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outward interface
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


def test_models_and_completions(served: Served) -> None:
    c = client(served)
    assert [m.id for m in c.models.list().data] == ["asyncrl-policy"]
    completion = c.completions.create(
        model="asyncrl-policy", prompt=COPY.format("k q b"), max_tokens=12, temperature=0
    )
    assert completion.choices[0].text.split() == ["k", "q", "b"]
    assert completion.usage.completion_tokens > 0


def test_five_turn_conversation_has_no_tokenisation_drift(served: Served) -> None:
    """The stored tokens are exactly: each observation tokenised on its own, then the sampled tokens."""
    c = client(served, "drift")
    tokenizer = served.service.tokenizer
    messages: list[dict[str, Any]] = []
    expected: list[int] = []
    sampled_turns = []
    for turn, letters in enumerate(["a b", "x y z", "q", "m n o p", "c d"]):
        messages.append({"role": "user", "content": COPY.format(letters)})
        expected += tokenizer.encode(messages[-1]["content"], add_special_tokens=False)
        answer = c.chat.completions.create(
            model="asyncrl-policy", messages=messages, max_tokens=16, seed=turn
        )
        branch = served.service.store.get("drift").live_branch
        sampled = branch.token_ids[len(expected) :]
        content = answer.choices[0].message.content or ""
        assert content == tokenizer.decode(sampled, skip_special_tokens=True).strip()
        expected += sampled
        sampled_turns.append(sampled)
        messages.append(answer.choices[0].message.model_dump(exclude_none=True))
    trajectory = served.service.store.get("drift")
    assert len(trajectory.tokens.branches) == 1
    branch = trajectory.live_branch
    assert branch.token_ids == expected
    assert branch.num_turns == 5
    assert sum(branch.loss_mask) == sum(len(s) for s in sampled_turns)
    model_positions = [i for i, m in enumerate(branch.loss_mask) if m]
    assert all(branch.versions[i] == 0 and branch.logprobs[i] <= 0 for i in model_positions)
    assert all(branch.versions[i] == -1 for i, m in enumerate(branch.loss_mask) if not m)


def test_editing_the_history_starts_a_recorded_branch(served: Served) -> None:
    c = client(served, "edit")
    first = [{"role": "user", "content": COPY.format("a b")}]
    answer = c.chat.completions.create(model="asyncrl-policy", messages=first, max_tokens=8)
    sampled = list(served.service.store.get("edit").live_branch.token_ids)
    edited = first + [
        {"role": "assistant", "content": "something else"},
        {"role": "user", "content": COPY.format("c")},
    ]
    c.chat.completions.create(model="asyncrl-policy", messages=edited, max_tokens=8)
    trajectory = served.service.store.get("edit")
    assert len(trajectory.tokens.branches) == 2
    forked = trajectory.tokens.branches[1]
    assert forked.parent == 0 and "message 1 differs" in forked.reason
    prompt_len = len(served.service.tokenizer.encode(first[0]["content"], add_special_tokens=False))
    assert forked.token_ids[:prompt_len] == sampled[:prompt_len]  # the shared message is copied, not redone
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_tool_calls_round_trip_through_the_client(served: Served, tiny) -> None:
    """A scripted policy (the tiny model cannot call tools) answers with a tool-call span; the client sees a
    structured tool call, and the tool result it sends back extends the same trajectory."""
    _, tokenizer = tiny
    scripted = ScriptedEngine(tokenizer, [render_tool_call("add", {"a": 2, "b": 3}), "The sum is 5."])
    config = ServeConfig(port=0, chat_format="template", api_key="sekrit")
    proxy = LLMProxy([scripted])
    for tool_served in serve_in_thread(
        CompletionService(proxy=proxy, tokenizer=tokenizer, config=config), proxy, scripted
    ):
        c = client(tool_served, "tools")
        tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 3?"}]
        first = c.chat.completions.create(model="asyncrl-policy", messages=messages, tools=tools)
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].finish_reason == "tool_calls"
        assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 2, "b": 3})
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "5"},
        ]
        stream = c.chat.completions.create(
            model="asyncrl-policy", messages=messages, tools=tools, stream=True
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert text == "The sum is 5."
        trajectory = tool_served.service.store.get("tools")
        assert len(trajectory.tokens.branches) == 1
        context = tokenizer.decode(trajectory.live_branch.token_ids)
        assert "<tool_response>5</tool_response>" in context and "<tools>" in context
        assert context.count(render_tool_call("add", {"a": 2, "b": 3})) == 1


def test_an_empty_answer_is_an_empty_string_never_none(tiny) -> None:
    """An answer that stops at once (the tiny model often does on chat prompts) carries ``content == ""``, so
    a client's ``.content.strip()`` works; unstreamed and streamed alike."""
    _, tokenizer = tiny
    scripted = ScriptedEngine(tokenizer, ["", ""])
    config = ServeConfig(port=0, chat_format="template", api_key="sekrit")
    proxy = LLMProxy([scripted])
    for empty_served in serve_in_thread(
        CompletionService(proxy=proxy, tokenizer=tokenizer, config=config), proxy, scripted
    ):
        c = client(empty_served)
        asked = {"model": "asyncrl-policy", "messages": [{"role": "user", "content": "hi"}]}
        answer = c.chat.completions.create(**asked)
        assert answer.choices[0].message.content == ""
        assert answer.choices[0].message.tool_calls is None
        assert answer.choices[0].finish_reason == "stop"
        chunks = [ch for ch in c.chat.completions.create(**asked, stream=True) if ch.choices]
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == ""
        assert chunks[0].choices[0].delta.content == ""


LETTERS = " ".join("abcdefghijkl")


def test_streaming_chat_sends_tokens_as_they_come_and_the_same_text(served: Served) -> None:
    """Several content chunks for a many-token answer, and together the text the same call gives unstreamed."""
    asked = {
        "model": "asyncrl-policy",
        "messages": [{"role": "user", "content": COPY.format(LETTERS)}],
        "max_tokens": 40,
        "seed": 7,
    }
    whole = client(served, "whole-chat").chat.completions.create(**asked)
    stream = client(served, "stream-chat").chat.completions.create(
        **asked, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    pieces = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert len(pieces) > 1
    assert "".join(pieces) == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    streamed = served.service.store.get("stream-chat").live_branch
    assert streamed.token_ids == served.service.store.get("whole-chat").live_branch.token_ids


def test_streaming_completions_sends_tokens_as_they_come_and_the_same_text(served: Served) -> None:
    asked = {"model": "asyncrl-policy", "prompt": COPY.format(LETTERS), "max_tokens": 40, "seed": 3}
    whole = client(served).completions.create(**asked)
    chunks = list(client(served).completions.create(**asked, stream=True))
    pieces = [ch.choices[0].text for ch in chunks if ch.choices[0].text]
    assert len(pieces) > 1
    assert "".join(pieces) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_a_weight_update_during_a_call_is_invisible_to_the_client(served: Served, tiny) -> None:
    model, _ = tiny
    weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    letters = " ".join("abcdefghijklmnopqrstuvwxyz")
    c = client(served, "update")
    result: dict[str, Any] = {}

    def call() -> None:
        result["answer"] = c.chat.completions.create(
            model="asyncrl-policy",
            messages=[{"role": "user", "content": COPY.format(letters)}],
            max_tokens=100,
        )

    before = served.engine.stats()["num_generated_tokens"]
    thread = threading.Thread(target=call)
    thread.start()
    while served.engine.stats()["num_generated_tokens"] == before and thread.is_alive():
        pass  # until the call's first tokens exist

    async def update() -> None:
        await served.proxy.suspend()
        await served.proxy.model_update(weights, 1)
        await served.proxy.resume()

    served.run(update())
    thread.join(30)
    answer = result["answer"]
    assert answer.choices[0].finish_reason in ("stop", "length")
    branch = served.service.store.get("update").live_branch
    versions = [v for v, m in zip(branch.versions, branch.loss_mask, strict=True) if m]
    assert (
        versions == sorted(versions) and versions[0] == 0 and versions[-1] == 1
    )  # continued under the new weights, tagged
    assert answer.model_extra["asyncrl"]["versions"][0] == versions


HOLD_AFTER = 4
"""Sampled tokens after which the engine is held, so the update lands before the streamed answer can end."""


def test_a_weight_update_landing_mid_stream_is_invisible_to_the_streaming_client(
    served: Served, tiny, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order is forced, not timed: a hook in the engine's own thread pauses it right after the step that
    sampled the answer's HOLD_AFTER-th token; the client reads streamed text of those tokens; only then is the
    update published (suspend, new weights, resume), which resumes the engine. The stream ends without an error,
    its pieces join to the answer the same call gives with no update (the new weights hold the same values, so
    any break in the continuation would show), and every token sampled after the update carries the new version."""
    model, tokenizer = tiny
    weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    asked = {
        "model": "asyncrl-policy",
        "messages": [{"role": "user", "content": COPY.format(" ".join("abcdefghijklmnopqrstuvwxyz"))}],
        "max_tokens": 100,
        "temperature": 0,
    }
    reference = client(served, "mid-stream-reference").chat.completions.create(**asked)
    core, step = served.engine.core, served.engine.core.step
    held: list[int] = []

    def step_then_hold() -> Any:  # runs in the engine thread, between two steps
        generations = step()
        output = core.output_so_far("mid-stream/b0/t0")
        if not held and output is not None and len(output) >= HOLD_AFTER:
            core.pause()
            held.append(len(output))
        return generations

    monkeypatch.setattr(core, "step", step_then_hold)
    old_version = max(served.proxy.versions())
    new_version = old_version + 1

    async def publish() -> None:
        await served.proxy.suspend()
        await served.proxy.model_update(weights, new_version)
        await served.proxy.resume()

    chunks = iter(client(served, "mid-stream").chat.completions.create(**asked, stream=True))
    pieces: list[str | None] = []
    # streamed text of the tokens sampled before the hold; the first text can stream before the hold (a token
    # per step), so read on until the engine holds: the chunk of the step that held comes after it held
    while not held or not any(pieces):
        chunk = next(chunks)
        pieces.append(chunk.choices[0].delta.content if chunk.choices else None)
    assert held and served.proxy.versions() == [old_version]  # held, not finished, before the update
    served.run(publish())
    rest = list(chunks)
    pieces += [chunk.choices[0].delta.content for chunk in rest if chunk.choices]
    assert "".join(p for p in pieces if p) == reference.choices[0].message.content
    assert [chunk.choices[0].finish_reason for chunk in rest if chunk.choices][-1] == "stop"
    branch = served.service.store.get("mid-stream").live_branch
    versions = [v for v, m in zip(branch.versions, branch.loss_mask, strict=True) if m]
    num_before = held[0]
    assert num_before < len(versions)
    assert versions == [old_version] * num_before + [new_version] * (len(versions) - num_before)
    assert branch.token_ids == served.service.store.get("mid-stream-reference").live_branch.token_ids


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),  # named trajectory: n must be 1
        ({"messages": [{"role": "user", "content": "hi"}] * 17}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"1": 5}}, "logit_bias"),
        (
            {
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": f"t{i}"}} for i in range(3)],
            },
            "tools",
        ),
    ],
)
def test_malformed_requests_get_4xx_with_a_json_body(
    served: Served, body: dict[str, Any], field: str
) -> None:
    response = httpx.post(
        served.url + "/trajectories/bad/v1/chat/completions",
        json=body,
        headers={"Authorization": "Bearer sekrit"},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field or field in error["message"]


def test_refusals_auth_size_garbage_and_unknown_routes(served: Served) -> None:
    url = served.url + "/v1/chat/completions"
    good = {"messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(url, json=good, headers={"Authorization": "Bearer wrong"}).status_code == 401
    huge = {"messages": [{"role": "user", "content": "x" * 30_000}]}
    response = httpx.post(url, json=huge, headers={"Authorization": "Bearer sekrit"})
    assert response.status_code == 413 and "max_body_bytes" in response.json()["error"]["message"]
    response = httpx.post(
        url,
        content=b"{not json",
        headers={"Authorization": "Bearer sekrit", "Content-Type": "application/json"},
    )
    assert response.status_code == 400 and "error" in response.json()
    assert httpx.get(served.url + "/v2/nothing").json()["error"]["type"] == "not_found_error"
    with pytest.raises(openai.BadRequestError):
        client(served).chat.completions.create(
            model="asyncrl-policy", messages=[{"role": "user", "content": "y" * 2_001}]
        )
    with pytest.raises(openai.NotFoundError):
        client(served).chat.completions.create(model="gpt-9", messages=good["messages"])
    assert httpx.get(served.url + "/health").json()["status"] == "ok"  # still serving


def test_finish_posts_the_reward_and_exports_the_trajectory(served: Served) -> None:
    c = client(served, "episode")
    c.chat.completions.create(
        model="asyncrl-policy", messages=[{"role": "user", "content": COPY.format("u v")}], max_tokens=8
    )
    headers = {"Authorization": "Bearer sekrit"}
    response = httpx.post(served.url + "/trajectories/episode/finish", json={"reward": 1.0}, headers=headers)
    assert response.json() == {"trajectory_id": "episode", "state": "finished", "reward": 1.0}
    again = httpx.post(served.url + "/trajectories/episode/finish", json={"reward": 1.0}, headers=headers)
    assert again.status_code == 409
    with pytest.raises(openai.ConflictError):
        c.chat.completions.create(
            model="asyncrl-policy", messages=[{"role": "user", "content": "more"}], max_tokens=4
        )
    [record] = httpx.get(served.url + "/trajectories/episode", headers=headers).json()["branches"]
    assert record["reward"] == 1.0 and record["state"] == "finished"
    assert (
        len(record["token_ids"])
        == len(record["loss_mask"])
        == len(record["logprobs"])
        == len(record["versions"])
    )
