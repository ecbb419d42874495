"""``producer: external``: a trajectory joining a group already admitted never waits behind a new group's first
call that waits for buffer capacity. Before, one lock covered both, so with the buffer full (``sync``: the batch's
groups admitted, or async at its α bound) a member of an admitted group that made its first call after another
group's first call queued behind it: that group could not complete, so no batch was trained and no capacity ever
freed (the run failed with ``BatchTimeoutError``, naming the admitted groups that never reported)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from asyncrl.app.wiring import make_buffer
from asyncrl.config.buffer import BufferConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.config.serve import ServeConfig
from asyncrl.models.loading import load_tokenizer
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.rollout.agentic_producer import make_env_seed_source
from asyncrl.rollout.external_producer import ExternalProducer
from asyncrl.serve.schemas import ServeError
from asyncrl.sim.clock import run_seeds
from asyncrl.testing.fake_engine import FakeEngine

SEEDS = range(8)
WAIT_S = 60.0
"""(Virtual) seconds a join may take: any wait behind capacity outlasts it, which never frees here."""


def producer_for(out: Path, groups_per_batch: int, group_size: int) -> ExternalProducer:
    """An external producer over a sync buffer (α = 0: capacity is one batch of groups); never served over
    HTTP: the test calls its sink (``admit``) as the endpoint does on a trajectory's first call."""
    rollout = RolloutConfig(rollout_batch_size=groups_per_batch, num_return_sequences=group_size)
    buffer = make_buffer(BufferConfig(async_ratio=0), rollout, producer="external", env_manager=None)
    return ExternalProducer(
        source=make_env_seed_source(64, 0),
        proxy=LLMProxy([FakeEngine()]),
        buffer=buffer,
        tokenizer=load_tokenizer("tiny-copy"),
        config=ServeConfig(port=0, chat_format="plain"),
        output_dir=str(out),
        seed=0,
    )


def first_call(trajectory: str, group: str | None) -> SimpleNamespace:
    """What ``admit`` reads of a served trajectory on its first call."""
    return SimpleNamespace(trajectory_id=trajectory, group_id=group)


async def waiting_for_capacity(producer: ExternalProducer) -> None:
    """Return once a first call waits for the buffer's capacity (whichever the schedule ran first)."""
    while producer.buffer.accounting().num_waiting_producers == 0:
        await asyncio.sleep(0)


def test_a_member_of_an_admitted_group_joins_while_a_new_group_waits_for_capacity(tmp_path: Path) -> None:
    """Capacity for one group of two: a0 opens group a, b0's first call waits for capacity, then a1 joins a at
    once; b0 and an anonymous first call go on waiting (no batch is trained here), and get the run's 503 once
    the buffer closes. Before the fix a1 waited behind them for good (here: past ``WAIT_S``)."""

    async def scenario(seed: int) -> None:
        producer = producer_for(tmp_path / f"seed{seed}", groups_per_batch=1, group_size=2)
        await producer.admit(first_call("a0", "a"))
        waiting = asyncio.ensure_future(producer.admit(first_call("b0", "b")))
        anonymous = asyncio.ensure_future(producer.admit(first_call("x0", None)))
        await asyncio.wait_for(waiting_for_capacity(producer), WAIT_S)  # one of them; the other queued too
        await asyncio.wait_for(producer.admit(first_call("a1", "a")), WAIT_S)
        assert producer._group_of["a1"] is producer._group_of["a0"]
        assert producer.counts["groups"] == 1 and not waiting.done() and not anonymous.done()
        producer.buffer.close("the test ends")  # the waiting first calls get the run's 503
        for call in (waiting, anonymous):
            (refused,) = await asyncio.gather(call, return_exceptions=True)
            assert isinstance(refused, ServeError) and refused.status == 503, refused
        assert producer.counts["groups"] == 1

    assert run_seeds(scenario, SEEDS) == len(SEEDS)


def test_two_first_calls_of_one_named_group_open_it_once(tmp_path: Path) -> None:
    """The lock's own job, kept: concurrent first calls naming one new group join one group, not two."""

    async def scenario(seed: int) -> None:
        producer = producer_for(tmp_path / f"seed{seed}", groups_per_batch=2, group_size=2)
        await asyncio.gather(producer.admit(first_call("c0", "c")), producer.admit(first_call("c1", "c")))
        assert producer._group_of["c0"] is producer._group_of["c1"] and producer.counts["groups"] == 1

    assert run_seeds(scenario, SEEDS) == len(SEEDS)
