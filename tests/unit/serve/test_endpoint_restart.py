"""A training run's endpoint across a trainer restart (``TrainerDied``): the restarted attempt's producer binds
the port the first attempt bound, so the URL a harness holds stays right; and it refuses (409
``run_restarted``) to continue a trajectory, or fill a group, the first attempt admitted, rather than take the
episode's history, the model's own turns included, as an untrained prompt. Real uvicorn, ``openai`` client.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from serve_helpers import ScriptedEngine

from asyncrl.app.wiring import make_buffer
from asyncrl.config.buffer import BufferConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.config.serve import ServeConfig
from asyncrl.examples.agents import frozen_lake_harness
from asyncrl.models.loading import load_tokenizer
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.rollout import endpoint_record
from asyncrl.rollout.agentic_producer import make_env_seed_source
from asyncrl.rollout.external_producer import ExternalProducer
from asyncrl.serve.server import EndpointPortBusy, EndpointServer
from asyncrl.serve.service import CompletionService

START_TIMEOUT_S = 30.0
ASK = {"model": "asyncrl-policy", "max_tokens": 4}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("tiny-copy")


async def attempt(
    out: Path, serve: ServeConfig, tokenizer: Any, play: Callable[[ExternalProducer], Awaitable[None]]
) -> ExternalProducer:
    """One attempt of a run: its producer serves while ``play`` runs, then stops as a run's does (the buffer
    closes)."""
    rollout = RolloutConfig(rollout_batch_size=1, num_return_sequences=2)
    buffer = make_buffer(BufferConfig(async_ratio=1), rollout, producer="external", env_manager=None)
    producer = ExternalProducer(
        source=make_env_seed_source(16, 0),
        proxy=LLMProxy([ScriptedEngine(tokenizer, ["a"] * 8)]),
        buffer=buffer,
        tokenizer=tokenizer,
        config=serve,
        output_dir=str(out),
        seed=0,
    )
    running = asyncio.ensure_future(producer.run())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
    while not (out / endpoint_record.ENDPOINT_FILE).exists() or producer.server.address is None:
        assert not running.done(), running.result()
        assert loop.time() < deadline, f"the endpoint did not start within {START_TIMEOUT_S} s"
        await asyncio.sleep(0.01)
    try:
        await play(producer)
    finally:
        buffer.close("the attempt ends")
        await running
    return producer


def on(producer: ExternalProducer, group: str, trajectory: str) -> openai.AsyncOpenAI:
    base = f"{producer.server.url}/groups/{group}/trajectories/{trajectory}/v1"
    return openai.AsyncOpenAI(base_url=base, api_key="-", max_retries=0, timeout=30)


def test_a_restarted_attempt_keeps_the_url_and_refuses_what_the_first_admitted(
    tokenizer: Any, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    serve = ServeConfig(port=0, chat_format="plain")
    history = [{"role": "user", "content": "copy a:"}]
    urls: list[str] = []

    async def first(producer: ExternalProducer) -> None:
        urls.append(producer.server.url)
        answer = await on(producer, "g1", "t1").chat.completions.create(messages=history, **ASK)
        history.append(answer.choices[0].message.model_dump(exclude_none=True))
        history.append({"role": "user", "content": "copy b:"})

    async def second(producer: ExternalProducer) -> None:
        urls.append(producer.server.url)
        with pytest.raises(openai.ConflictError) as continued:  # t1's next turn, as its harness sends it
            await on(producer, "g1", "t1").chat.completions.create(messages=history, **ASK)
        assert continued.value.code == endpoint_record.RESTARTED
        assert "restarted" in continued.value.message and "start the episode over" in continued.value.message
        with pytest.raises(openai.ConflictError) as joined:  # a new member of the first attempt's group
            await on(producer, "g1", "t2").chat.completions.create(messages=history[:1], **ASK)
        assert joined.value.code == endpoint_record.RESTARTED and "start the whole group over" in str(
            joined.value
        )
        control = openai.AsyncOpenAI(base_url=producer.server.url, api_key="-", max_retries=0)
        with pytest.raises(openai.ConflictError) as finished:
            await control.post("/trajectories/t1/finish", body={"reward": 1.0}, cast_to=object)
        assert finished.value.code == endpoint_record.RESTARTED
        assert producer.service.store.all() == []  # nothing of them is held, not even a live shell
        answer = await on(producer, "g1-r1", "t1-r1").chat.completions.create(messages=history[:1], **ASK)
        assert answer.choices[0].message.content
        branch = producer.service.store.get("t1-r1").live_branch
        assert branch is not None and branch.num_turns == 1 and sum(branch.loss_mask) > 0

    async def run() -> None:
        endpoint_record.start_run(out, resuming=False)
        await attempt(out, serve, tokenizer, first)
        await attempt(out, endpoint_record.keep_port(serve, out), tokenizer, second)

    asyncio.run(run())
    assert urls[0] == urls[1]


def test_the_example_harness_meets_the_409_and_plays_its_group_over_under_a_new_name(
    tokenizer: Any, tmp_path: Path
) -> None:
    """Its group ``s-g0`` began in the first attempt: the second refuses it, and the harness plays the group
    again as ``s-g0-r1``, which the run takes in as one whole group."""
    out = tmp_path / "run"
    serve = ServeConfig(port=0, chat_format="plain")

    async def first(producer: ExternalProducer) -> None:
        ask = {"messages": [{"role": "user", "content": "F..."}], **ASK}
        await on(producer, "s-g0", "s-g0-0").chat.completions.create(**ask)

    async def second(producer: ExternalProducer) -> None:
        endpoint = frozen_lake_harness.Endpoint(out)
        await endpoint.connect(START_TIMEOUT_S)
        returns = await frozen_lake_harness.play_group(endpoint, "s", 0, 2, 4, 2, START_TIMEOUT_S)
        assert len(returns) == 2
        assert sorted(t.trajectory_id for t in producer.service.store.all()) == ["s-g0-r1-0", "s-g0-r1-1"]
        assert producer.buffer.accounting().num_buffered == 1  # the replayed group, whole

    async def run() -> None:
        endpoint_record.start_run(out, resuming=False)
        await attempt(out, serve, tokenizer, first)
        await attempt(out, endpoint_record.keep_port(serve, out), tokenizer, second)

    asyncio.run(run())


def test_a_fresh_run_forgets_the_earlier_trajectories_and_a_resume_keeps_them(tmp_path: Path) -> None:
    endpoint_record.publish(tmp_path, "http://127.0.0.1:1/v1")
    endpoint_record.TrajectoryLedger(tmp_path).record("t1", "g1")
    endpoint_record.start_run(tmp_path, resuming=True)
    assert not (tmp_path / endpoint_record.ENDPOINT_FILE).exists()  # a dead URL: harnesses wait for the new
    ledger = endpoint_record.TrajectoryLedger(tmp_path)
    assert (ledger.trajectories, ledger.groups) == ({"t1"}, {"g1"})
    endpoint_record.start_run(tmp_path, resuming=False)
    ledger = endpoint_record.TrajectoryLedger(tmp_path)
    assert (ledger.trajectories, ledger.groups) == (set(), set())
    ledger.check("t1", "g1")  # served as new


def test_the_next_attempt_binds_the_port_zero_bound_and_keeps_a_named_one(tmp_path: Path) -> None:
    any_port = ServeConfig(port=0)
    assert endpoint_record.keep_port(any_port, tmp_path) is any_port  # it never served: any port still
    endpoint_record.publish(tmp_path, "http://127.0.0.1:41234/v1")
    assert endpoint_record.keep_port(any_port, tmp_path).port == 41234
    named = ServeConfig(port=8000)
    assert endpoint_record.keep_port(named, tmp_path) is named


def test_a_port_in_use_is_retried_until_it_frees_and_fails_by_name_past_its_deadline(tokenizer: Any) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    service = CompletionService(
        proxy=LLMProxy([ScriptedEngine(tokenizer, [])]),
        tokenizer=tokenizer,
        config=ServeConfig(port=port, chat_format="plain"),
    )

    async def run() -> None:
        with pytest.raises(EndpointPortBusy, match=rf"127\.0\.0\.1:{port}: still in use .*bind_timeout_s"):
            await EndpointServer(service, bind_timeout_s=0.2).start()
        server = EndpointServer(service, bind_timeout_s=START_TIMEOUT_S)
        asyncio.get_running_loop().call_later(0.2, blocker.close)  # frees the port while start retries
        await server.start()
        try:
            assert server.address == ("127.0.0.1", port)
        finally:
            await server.stop()

    try:
        asyncio.run(run())
    finally:
        blocker.close()
