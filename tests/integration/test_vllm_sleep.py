"""vLLM's sleep mode behind the engine's sleep / wake: where the installed vLLM and platform offer it, a slept
and woken worker serves the same greedy tokens (level 1); where they do not (vLLM's CPU build), the worker
with sleep mode asked for does not start, naming why, and a plain worker refuses sleep and wake by name and
keeps serving."""

from __future__ import annotations

import asyncio

import pytest
from test_vllm_engine import greedy

from asyncrl.config.engine import VLLMConfig
from asyncrl.engine.vllm import VLLMEngineClient, vllm_python
from asyncrl.engine.vllm.worker_main import sleep_refusal
from asyncrl.models.loading import DEFAULT_MODEL_DIR

PROMPT = [3, 5, 7, 11]


def test_an_engine_without_sleep_calls_is_refused_by_name():
    assert "has no sleep mode" in sleep_refusal(object())


def start(**engine_args) -> VLLMEngineClient:
    return VLLMEngineClient.start(DEFAULT_MODEL_DIR, VLLMConfig(engine_args=engine_args), max_model_len=256)


async def round_trip(client: VLLMEngineClient, refusal: str | None) -> None:
    """Greedy tokens before and after sleep + wake are the same; with ``refusal``, both calls are refused
    naming it and the worker keeps serving."""
    before = await client.generate(greedy("before", PROMPT))
    if refusal is None:
        await client.sleep(1)
        await client.wake()
    else:
        for call in (client.sleep(1), client.wake()):
            with pytest.raises(RuntimeError, match=refusal):
                await call
    after = await client.generate(greedy("after", PROMPT))
    assert list(after.token_ids) == list(before.token_ids)


@pytest.mark.slow  # a vLLM worker start is ~12 s
@pytest.mark.vllm
@pytest.mark.skipif(vllm_python() is None, reason="no vLLM environment (run `asyncrl backends install vllm`)")
def test_sleep_and_wake_through_vllms_sleep_mode_or_a_named_refusal():
    plain = start()
    try:
        try:
            asyncio.run(round_trip(plain, "no sleep mode on this platform"))
            return  # vLLM's CPU build: refused by name, nothing more to try
        except AssertionError as other:
            if "without sleep mode" not in str(other):
                raise
    finally:
        plain.shutdown()
    slept = start(enable_sleep_mode=True)  # a platform with sleep mode: the real round trip
    try:
        asyncio.run(round_trip(slept, None))
    finally:
        slept.shutdown()
