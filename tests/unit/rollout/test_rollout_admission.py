"""The pieces every producer shares: prompt admission, the rollout's sampling settings and response text."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.buffer.records import DropKind
from asyncrl.buffer.sample_buffer import BufferClosedError, SampleBuffer
from asyncrl.config.buffer import BufferConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.data.base import TaskSample
from asyncrl.rollout.admission import admit, admit_batch, try_admit
from asyncrl.rollout.prompt_source import PromptSource
from asyncrl.rollout.rlvr_producer import response_text, sampling_params
from asyncrl.types import FinishReason, Generation, SamplingParams


def make_source() -> PromptSource:
    return PromptSource([TaskSample(uid=f"p{i}", prompt=f"q{i}", answer="0") for i in range(5)], seed=0)


def make_buffer(groups_per_batch: int) -> SampleBuffer:
    return SampleBuffer(BufferConfig(async_ratio=0.0), groups_per_batch=groups_per_batch, group_size=1)


def order(count: int) -> list[str]:
    twin = make_source()
    return [twin.next().key for _ in range(count)]


def test_a_batch_admits_what_capacity_allows_and_gives_the_refused_prompt_back() -> None:
    source, buffer = make_source(), make_buffer(groups_per_batch=2)
    admitted = asyncio.run(admit_batch(source, buffer, "rlvr", limit=3))
    assert [prompt.key for _, prompt in admitted] == order(2)
    assert [admission.key for admission, _ in admitted] == order(2)
    assert try_admit(source, buffer, "rlvr") is None
    assert source.state_dict()["redo"] == [order(3)[2], *order(2)]  # refused first, then the two in flight
    buffer.release(admitted[0][0], DropKind.FILTERED, "test")
    admission, prompt = try_admit(source, buffer, "rlvr") or pytest.fail("capacity was freed")
    assert prompt.key == admission.key == order(3)[2]


def test_a_batch_stops_at_its_limit() -> None:
    source, buffer = make_source(), make_buffer(groups_per_batch=4)
    assert [
        prompt.key for _, prompt in asyncio.run(admit_batch(source, buffer, "agentic", limit=2))
    ] == order(2)


def test_a_prompt_drawn_while_the_buffer_closes_stays_outstanding() -> None:
    source, buffer = make_source(), make_buffer(groups_per_batch=1)
    buffer.close("test")
    with pytest.raises(BufferClosedError):
        asyncio.run(admit(source, buffer, "rlvr"))
    assert source.state_dict()["redo"] == order(1)


def test_sampling_params_take_the_rollout_settings_and_the_request_seed() -> None:
    rollout = RolloutConfig(max_new_tokens=32, temperature=0.7, top_p=0.9, top_k=20, stop_strings=("</a>",))
    assert sampling_params(rollout, seed=11) == SamplingParams(
        max_new_tokens=32, temperature=0.7, top_p=0.9, top_k=20, stop_strings=("</a>",), seed=11
    )


class _Tokenizer:
    def decode(self, token_ids: list[int], *, skip_special_tokens: bool) -> str:
        return f"decoded {token_ids} skip={skip_special_tokens}"


def test_response_text_prefers_the_engine_text() -> None:
    generation = Generation(
        request_id="r",
        prompt_token_ids=[1],
        token_ids=[5, 6],
        logprobs=[0.0, 0.0],
        versions=[0, 0],
        finish_reason=FinishReason.STOP,
    )
    assert response_text(generation, _Tokenizer()) == "decoded [5, 6] skip=True"
    generation.text = "from the engine"
    assert response_text(generation, _Tokenizer()) == "from the engine"


class _BytesTokenizer:
    def encode(self, text: str) -> list[int]:
        return list(text.encode())


class _HeldProxy:
    """A proxy that records requests and never answers them: what a producer has started, frozen."""

    def __init__(self) -> None:
        self.requests: list[str] = []

    async def generate(self, request):  # noqa: ANN001, ANN201 - the GenerateClient seam
        self.requests.append(request.request_id)
        await asyncio.Event().wait()

    async def abort(self, request_id: str) -> None:
        return None


@pytest.mark.parametrize("redundant", [0, 2])
def test_a_batch_round_over_samples_by_the_redundant_prompts(redundant: int) -> None:
    """``generation: batch`` starts the batch plus ``max_additional_running_prompts`` in one round, so a round
    whose groups are partly filtered can still fill the batch (over-sampling)."""
    from asyncrl.rollout.rlvr_producer import RLVRProducer

    async def first_round() -> set[str]:
        buffer = SampleBuffer(
            BufferConfig(async_ratio=0.0), groups_per_batch=2, group_size=2, max_redundant_groups=redundant
        )
        proxy = _HeldProxy()
        config = RolloutConfig(
            rollout_batch_size=2,
            num_return_sequences=2,
            generation="batch",
            max_additional_running_prompts=redundant,
        )
        producer = RLVRProducer(
            source=make_source(),
            proxy=proxy,
            rewards=None,
            buffer=buffer,
            tokenizer=_BytesTokenizer(),
            config=config,
            seed=0,
        )
        task = asyncio.create_task(producer.run())
        for _ in range(10):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return {request_id.split("#")[0] for request_id in proxy.requests}

    assert asyncio.run(first_round()) == set(order(2 + redundant))
