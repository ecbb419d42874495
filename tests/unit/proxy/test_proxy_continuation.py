"""Pure helpers of the proxy: continuation requests, the engine's stitching contract, weight snapshots."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy import EngineFailure, LLMProxy
from asyncrl.proxy.continuation import check_continued, continuation_request, empty_abort, needs_continuation
from asyncrl.proxy.worker import snapshot_named_tensors
from asyncrl.sim.clock import run_shuffled
from asyncrl.testing.fake_engine import FakeEngine, make_request
from asyncrl.types import FinishReason, Generation, Request


def generation(tokens: list[int], reason: FinishReason, versions: list[int] | None = None) -> Generation:
    return Generation(
        request_id="r",
        prompt_token_ids=[1],
        token_ids=tokens,
        logprobs=[-float(t) for t in tokens],
        versions=versions if versions is not None else [0] * len(tokens),
        finish_reason=reason,
    )


def test_continuation_request_carries_the_output_so_far_and_keeps_the_token_limit():
    request = make_request("r", max_new_tokens=8, affinity_key="p")
    assert continuation_request(request, None) is request
    follow_up = continuation_request(request, generation([4, 5], FinishReason.ABORT, versions=[0, 1]))
    assert (follow_up.prefix_token_ids, follow_up.prefix_logprobs, follow_up.prefix_versions) == (
        [4, 5],
        [-4.0, -5.0],
        [0, 1],
    )
    assert follow_up.sampling.max_new_tokens == 8 and follow_up.affinity_key == "p"
    assert request.prefix_token_ids == []


def test_needs_continuation_only_for_aborts_with_room_left():
    request = make_request("r", max_new_tokens=3)
    assert needs_continuation(generation([1, 2], FinishReason.ABORT), request)
    assert not needs_continuation(generation([1, 2, 3], FinishReason.ABORT), request)
    assert not needs_continuation(generation([1], FinishReason.STOP), request)


def test_check_continued_rejects_output_that_drops_the_prefix():
    request = Request(
        request_id="r",
        prompt_token_ids=[1],
        prefix_token_ids=[4],
        prefix_logprobs=[-4.0],
        prefix_versions=[0],
    )
    check_continued(generation([4, 6], FinishReason.STOP), request)
    with pytest.raises(ValueError, match="request r: .* 1-token prefix"):
        check_continued(generation([6], FinishReason.STOP), request)


def test_empty_abort_keeps_a_callers_own_prefix():
    request = Request(
        request_id="r",
        prompt_token_ids=[1],
        prefix_token_ids=[4],
        prefix_logprobs=[-4.0],
        prefix_versions=[2],
    )
    aborted = empty_abort(request)
    assert (aborted.token_ids, aborted.versions, aborted.finish_reason) == ([4], [2], FinishReason.ABORT)


def test_snapshot_copies_tensors_and_arrays_and_keeps_immutable_values():
    weight, blob = torch.ones(2), b"ref"
    snapshot = snapshot_named_tensors([("w", weight), ("ref", blob)])
    weight.add_(1)
    assert snapshot["w"].tolist() == [1.0, 1.0] and snapshot["ref"] is blob


class PrefixDroppingEngine(FakeEngine):
    """Breaks the stitching contract: a continued request comes back without its prefix."""

    async def generate(self, request: Request) -> Generation:
        result = await super().generate(request)
        num_prefix = len(request.prefix_token_ids)
        result.token_ids, result.logprobs = result.token_ids[num_prefix:], result.logprobs[num_prefix:]
        result.versions = result.versions[num_prefix:]
        return result


def test_an_engine_breaking_the_prefix_contract_is_an_engine_failure():
    async def main() -> None:
        engine = PrefixDroppingEngine(lengths=6, abort_on_pause=True)
        proxy = LLMProxy([engine], ProxyConfig(update_policy="in_flight"))
        task = asyncio.create_task(proxy.generate(make_request("r0")))
        await asyncio.sleep(2.5)
        await proxy.suspend()
        await proxy.model_update({"w": 1}, 1)
        await proxy.resume()
        with pytest.raises(EngineFailure) as caught:
            await task
        assert isinstance(caught.value.__cause__, ValueError)

    run_shuffled(main, None, virtual_time=True)
