"""``producer: external`` under the load bound: first calls waiting for buffer capacity (a new group's admission
ticket) never take the places of ``serve.max_concurrent_calls`` that admitted trajectories need. Before, a call
was counted from arrival, so once that many first calls waited every other call was answered 429, the later
turns and joins of groups already admitted included, which are the only ones whose completion (a trained
batch) frees capacity: the run hung until ``buffer.get_batch_timeout_s``, or admitted episodes failed once the
harness's client gave up retrying."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from serve_helpers import ScriptedEngine, Served, serve_in_thread

from asyncrl.app.wiring import make_buffer
from asyncrl.config.buffer import BufferConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.config.serve import ServeConfig
from asyncrl.models.loading import load_tokenizer
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.rollout.agentic_producer import make_env_seed_source
from asyncrl.rollout.external_producer import ExternalProducer

ASK = {"model": "asyncrl-policy", "messages": [{"role": "user", "content": "copy a:"}], "max_tokens": 4}
WAIT_S = 30.0
"""Deadline of every wait for the server's state (each is met at once unless the server is broken)."""


@pytest.fixture
def external(tmp_path: Path):
    """An external producer served over HTTP: a sync buffer with capacity for one group of two, and at most two
    calls served at once."""
    tokenizer = load_tokenizer("tiny-copy")
    engine = ScriptedEngine(tokenizer, ["a"] * 16)
    proxy = LLMProxy([engine])
    rollout = RolloutConfig(rollout_batch_size=1, num_return_sequences=2)
    producer = ExternalProducer(
        source=make_env_seed_source(64, 0),
        proxy=proxy,
        buffer=make_buffer(BufferConfig(async_ratio=0), rollout, producer="external", env_manager=None),
        tokenizer=tokenizer,
        config=ServeConfig(
            port=0, chat_format="plain", api_key="sekrit", max_concurrent_calls=2, retry_after_s=1
        ),
        output_dir=str(tmp_path),
        seed=0,
    )
    for served in serve_in_thread(producer.service, proxy, engine):
        try:
            yield served, producer
        finally:
            close_buffer(served, producer)  # a waiting call ends (503) before the server stops


def in_group(served: Served, group: str, trajectory: str) -> openai.OpenAI:
    base = f"{served.url}/groups/{group}/trajectories/{trajectory}/v1"
    return openai.OpenAI(base_url=base, api_key="sekrit", max_retries=0, timeout=WAIT_S)


def call_in_thread(served: Served, group: str, trajectory: str, results: dict) -> threading.Thread:
    """A first call of ``trajectory`` in ``group`` on a thread of its own; its answer (or error) lands in
    ``results``."""

    def call() -> None:
        try:
            answer = in_group(served, group, trajectory).chat.completions.create(**ASK)
            results[trajectory] = answer.choices[0].message.content
        except openai.APIError as error:
            results[trajectory] = error

    thread = threading.Thread(target=call)
    thread.start()
    return thread


def entering_admission(producer: ExternalProducer, count: int) -> threading.Event:
    """Set once ``count`` calls are inside the producer's ``admit`` (the test's hook on the sink)."""
    entered: list[str] = []
    done = threading.Event()
    admit = producer.admit

    async def counted(trajectory) -> None:
        entered.append(trajectory.trajectory_id)
        if len(entered) == count:
            done.set()
        await admit(trajectory)

    producer.admit = counted
    return done


def close_buffer(served: Served, producer: ExternalProducer) -> None:
    async def close() -> None:
        producer.buffer.close("the test ends")

    served.run(close())


def test_an_admitted_groups_call_is_served_while_first_calls_fill_the_bound_waiting(external) -> None:
    """a0 opens group a; b0 and c0 (groups b, c) wait for capacity, two calls at a bound of two; a1 joins group
    a and is served (before: 429). b0 and c0 get the run's 503 once the buffer closes."""
    served, producer = external
    assert in_group(served, "a", "a0").chat.completions.create(**ASK).choices[0].message.content == "a"
    entered = entering_admission(producer, 2)
    waiting: dict = {}
    threads = [call_in_thread(served, g, f"{g}0", waiting) for g in ("b", "c")]
    assert entered.wait(WAIT_S) and not waiting  # both inside admit: one on the buffer, one behind it
    answer = in_group(served, "a", "a1").chat.completions.create(**ASK)
    assert answer.choices[0].message.content == "a" and producer.counts["groups"] == 1
    close_buffer(served, producer)
    for thread in threads:
        thread.join(WAIT_S)
    assert [getattr(waiting[t], "status_code", None) for t in ("b0", "c0")] == [503, 503]


def wait_for_admitting(served: Served, count: int) -> None:
    """Return once ``count`` calls wait for admission (a call waiting on its trajectory's lock has no hook)."""
    deadline = time.monotonic() + WAIT_S
    while served.service.calls["admitting"] != count:
        assert time.monotonic() < deadline, served.service.calls
        time.sleep(0.01)


def test_a_retry_waits_outside_the_bound_and_waiting_calls_have_a_bound_of_their_own(external) -> None:
    """b0 waits for capacity and a second call of b0 (a client's retry) waits behind it: two calls waiting, the
    bound. A first call of a new group c is then refused (429), a1 joining admitted group a is served."""
    served, producer = external
    in_group(served, "a", "a0").chat.completions.create(**ASK)
    first: dict = {}
    retry: dict = {}
    threads = [call_in_thread(served, "b", "b0", first)]
    wait_for_admitting(served, 1)
    threads.append(call_in_thread(served, "b", "b0", retry))
    wait_for_admitting(served, 2)
    with pytest.raises(openai.RateLimitError) as refused:
        in_group(served, "c", "c0").chat.completions.create(**ASK)
    assert refused.value.response.headers["retry-after"] == "1"
    assert "max_concurrent_calls=2 calls already wait for admission" in refused.value.message
    assert in_group(served, "a", "a1").chat.completions.create(**ASK).choices[0].message.content == "a"
    health = httpx.get(served.url + "/health").json()
    assert health["calls"] == {"in_flight": 2, "admitting": 2, "refused": 1}
    close_buffer(served, producer)
    for thread in threads:
        thread.join(WAIT_S)
    assert [getattr(r["b0"], "status_code", None) for r in (first, retry)] == [503, 503]
