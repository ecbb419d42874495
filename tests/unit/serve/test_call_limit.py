"""Overload: beyond ``serve.max_concurrent_calls`` the endpoint answers 429 with ``Retry-After`` at once (never
an unbounded queue), the ``openai`` client's own retries honour it, and the server serves again as load drops."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from serve_helpers import ScriptedEngine, client, serve_in_thread

from asyncrl.config.serve import ServeConfig
from asyncrl.models.loading import load_tokenizer
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.serve.service import CompletionService
from asyncrl.types import Request

ASK = {"model": "asyncrl-policy", "messages": [{"role": "user", "content": "copy a:"}], "max_tokens": 4}


class GatedEngine(ScriptedEngine):
    """Answers only once the test opens the gate, so calls pile up in the server for as long as it likes."""

    def __init__(self, tokenizer: Any, num_answers: int) -> None:
        super().__init__(tokenizer, ["a"] * num_answers)
        self.gate = threading.Event()

    async def generate(self, request: Request):
        while not self.gate.is_set():
            await asyncio.sleep(0.01)
        return await super().generate(request)


@pytest.fixture
def gated():
    tokenizer = load_tokenizer("tiny-copy")
    engine = GatedEngine(tokenizer, 16)
    proxy = LLMProxy([engine])
    config = ServeConfig(
        port=0, chat_format="plain", api_key="sekrit", max_concurrent_calls=2, retry_after_s=1
    )
    for served in serve_in_thread(
        CompletionService(proxy=proxy, tokenizer=tokenizer, config=config), proxy, engine
    ):
        yield served, engine


def call_in_thread(served, results: list, retries: int = 0) -> threading.Thread:
    def call() -> None:
        c = openai.OpenAI(base_url=served.url + "/v1", api_key="sekrit", max_retries=retries, timeout=30)
        try:
            results.append(c.chat.completions.create(**ASK).choices[0].message.content)
        except openai.APIError as error:
            results.append(error)

    thread = threading.Thread(target=call)
    thread.start()
    return thread


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_over_the_bound_is_429_with_retry_after_and_load_dropping_recovers(gated) -> None:
    served, engine = gated
    results: list = []
    threads = [call_in_thread(served, results) for _ in range(2)]
    wait_for(lambda: served.service.calls["in_flight"] == 2)
    with pytest.raises(openai.RateLimitError) as refused:
        client(served).chat.completions.create(**ASK)
    assert refused.value.response.headers["retry-after"] == "1"
    assert (
        refused.value.body["type"] == "rate_limit_error" and "max_concurrent_calls=2" in refused.value.message
    )
    health = httpx.get(served.url + "/health").json()
    # other routes are never refused for load
    assert health["calls"] == {"in_flight": 2, "admitting": 0, "refused": 1}
    engine.gate.set()
    for thread in threads:
        thread.join(30)
    assert results == ["a", "a"]  # the calls admitted were served, not failed by the overload
    assert client(served).chat.completions.create(**ASK).choices[0].message.content == "a"  # recovered
    assert httpx.get(served.url + "/health").json()["calls"] == {"in_flight": 0, "admitting": 0, "refused": 1}


def test_the_openai_client_backs_off_on_retry_after_and_gets_through(gated) -> None:
    served, engine = gated
    held: list = []
    threads = [call_in_thread(served, held) for _ in range(2)]
    wait_for(lambda: served.service.calls["in_flight"] == 2)
    patient: list = []
    retrying = call_in_thread(served, patient, retries=3)  # refused now, retries after Retry-After
    wait_for(lambda: served.service.calls["refused"] >= 1)
    engine.gate.set()
    for thread in [*threads, retrying]:
        thread.join(30)
    assert held == ["a", "a"] and patient == ["a"]
