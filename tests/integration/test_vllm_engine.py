"""The vLLM backend against HF and the built-in engine, on the shipped tiny model, through the real worker.

Skipped (with the reason) where vLLM's environment is absent: ``asyncrl backends install vllm`` makes it, and
``scripts/test-vllm.sh`` runs these tests plus a short RL run with ``engine.backend=vllm``.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm_digests import served_digest

from asyncrl.config.engine import EngineConfig, VLLMConfig
from asyncrl.engine import make_engine
from asyncrl.engine.vllm import VLLMEngineClient, vllm_python
from asyncrl.models.loading import DEFAULT_MODEL_DIR, state_dict_for_sync
from asyncrl.types import FinishReason, Generation, Request, SamplingParams
from asyncrl.weight_sync.delta import DeltaSync
from asyncrl.weight_sync.protocol import WeightSyncError

pytestmark = [
    pytest.mark.slow,  # a vLLM worker start is ~12 s
    pytest.mark.vllm,  # scripts/test-vllm.sh runs these in vLLM's environment; CI has none
    pytest.mark.skipif(
        vllm_python() is None, reason="no vLLM environment (run `asyncrl backends install vllm`)"
    ),
]
N = 200
PROMPTS = ["copy 3 a: x y z", "copy 5 b: one two three four five", "copy 1 c: q"]


@pytest.fixture(scope="module")
def hf():
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True).eval()
    return model, tokenizer


@pytest.fixture(scope="module")
def engine():
    client = VLLMEngineClient.start(DEFAULT_MODEL_DIR, VLLMConfig(), max_model_len=256)
    yield client
    client.shutdown()


def request(rid: str, prompt: list[int], **sampling) -> Request:
    return Request(request_id=rid, prompt_token_ids=prompt, sampling=SamplingParams(**sampling))


def greedy(rid: str, prompt: list[int], n: int = 12) -> Request:
    return request(rid, prompt, temperature=0.0, max_new_tokens=n, ignore_eos=True)


@torch.inference_mode()
def hf_greedy_with_logprobs(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    tokens = out[0, len(prompt) :].tolist()
    logprobs = torch.log_softmax(model(torch.tensor([prompt + tokens])).logits[0].float(), dim=-1)
    return tokens, [logprobs[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


def test_greedy_tokens_equal_hf_and_the_builtin_engine_and_logprobs_are_within_1e3(engine, hf):
    model, tokenizer = hf
    prompts = [tokenizer.encode(p) for p in PROMPTS]

    async def both():
        builtin = make_engine(model, tokenizer, EngineConfig(max_model_len=256))
        try:
            ours = await asyncio.gather(
                *(builtin.generate(greedy(f"b{i}", p)) for i, p in enumerate(prompts))
            )
        finally:
            builtin.shutdown()
        theirs = await asyncio.gather(*(engine.generate(greedy(f"v{i}", p)) for i, p in enumerate(prompts)))
        return ours, theirs

    ours, theirs = asyncio.run(both())
    for prompt, built_in, served in zip(prompts, ours, theirs, strict=True):
        tokens, logprobs = hf_greedy_with_logprobs(model, prompt, 12)
        assert list(served.token_ids) == tokens == list(built_in.token_ids)
        assert list(served.logprobs) == pytest.approx(logprobs, abs=1e-3)
        assert list(served.versions) == [0] * 12 and served.finish_reason is FinishReason.LENGTH


async def aborted_once_started(engine, long_request) -> tuple[Generation | None, Generation]:
    """``abort``'s and ``generate``'s results for a request aborted as soon as it has a new token; on a fast
    engine a request may finish first, so ``long_request(attempt)`` is sent again, up to 10 times."""
    for attempt in range(10):
        rid = (request := long_request(attempt)).request_id
        task = asyncio.ensure_future(engine.generate(request))
        while (await engine.worker_stats())["running_tokens"].get(rid, 0) < 1 and not task.done():
            await asyncio.sleep(0.001)
        aborted = await engine.abort(rid)
        finished = await task
        if finished.finish_reason is FinishReason.ABORT:
            return aborted, finished
    pytest.fail("every request finished before it could be aborted")


def test_abort_returns_the_prefix_generated_so_far(engine, hf):
    _, tokenizer = hf
    prompt = tokenizer.encode(PROMPTS[1])

    def long_request(attempt: int) -> Request:
        return request(f"long{attempt}", prompt, max_new_tokens=200, ignore_eos=True)

    aborted, finished = asyncio.run(aborted_once_started(engine, long_request))
    assert 0 < len(finished.token_ids) < 200 and len(finished.logprobs) == len(finished.token_ids)
    assert aborted is None or list(aborted.token_ids) == list(finished.token_ids)


def test_an_aborted_continuation_returns_its_prefix_then_the_tokens_generated_after_it(engine, hf):
    """A continued request (a partial rollout, or one migrated by recompute) aborted here: ``abort`` returns
    what its ``generate`` returns, the prompt ids and the whole output (the prefix it was sent with, then the
    new tokens) with a log-prob and a version per token. The worker holds only the new tokens; an abort that
    passed them on alone made a request migrated twice lose all it generated before its first move."""
    _, tokenizer = hf
    prompt = tokenizer.encode(PROMPTS[1])
    first = asyncio.run(engine.generate(greedy("before-move", prompt, n=4)))
    prefix = (list(first.token_ids), list(first.logprobs), list(first.versions))

    def continued(attempt: int) -> Request:
        return Request(
            request_id=f"continued{attempt}",
            prompt_token_ids=prompt,
            sampling=SamplingParams(max_new_tokens=200, ignore_eos=True),
            prefix_token_ids=prefix[0],
            prefix_logprobs=prefix[1],
            prefix_versions=prefix[2],
        )

    aborted, finished = asyncio.run(aborted_once_started(engine, continued))
    assert aborted is not None, "the request ended as aborted, so the abort found it running"
    assert list(aborted.prompt_token_ids) == prompt
    assert 4 < len(aborted.token_ids) < 200 and list(aborted.token_ids[:4]) == prefix[0]
    assert list(aborted.logprobs[:4]) == prefix[1] and list(aborted.versions[:4]) == prefix[2]
    assert len(aborted.logprobs) == len(aborted.versions) == len(aborted.token_ids)
    assert aborted == finished


def test_a_weight_update_mid_generation_switches_the_following_tokens_and_their_version(engine, hf):
    """keep semantics: the prefix's KV (old weights) stays; tokens after the update come from the new weights
    on top of it, tagged with the new version (an exact new-policy continuation needs a recompute: the
    proxy's partial-rollout continuation re-sends the prefix as prompt)."""
    model, tokenizer = hf
    prompt = tokenizer.encode(PROMPTS[0])
    torch.manual_seed(0)
    other = {name: torch.randn_like(t) * 0.2 for name, t in state_dict_for_sync(model).items()}

    async def paused_mid_generation(attempt: int) -> asyncio.Future | None:
        """A request paused with >= 5 of its N tokens, or None when it finished first (vLLM's engine core
        runs ahead of the worker's loop, so a poll can miss the whole generation)."""
        rid = f"mid{attempt}"
        task = asyncio.ensure_future(engine.generate(greedy(rid, prompt, N)))
        while (await engine.worker_stats())["running_tokens"].get(rid, 0) < 5 and not task.done():
            await asyncio.sleep(0.001)
        await engine.pause()
        if rid in (await engine.worker_stats())["running_tokens"]:
            return task
        await engine.resume()
        await task
        return None

    async def scenario():
        for attempt in range(10):
            if task := await paused_mid_generation(attempt):
                break
        else:
            pytest.fail("every request finished before it could be paused mid-generation")
        await engine.update_weights(other, version=1)
        await engine.resume()
        generation = await task
        await engine.pause()
        await engine.update_weights(state_dict_for_sync(model), version=2)  # back to the model's weights
        await engine.resume()
        return generation

    generation = asyncio.run(scenario())
    versions = list(generation.versions)
    switch = versions.index(1)
    assert 5 <= switch < N and versions == [0] * switch + [1] * (N - switch)
    unchanged, _ = hf_greedy_with_logprobs(model, prompt, N)
    assert list(generation.token_ids[:switch]) == unchanged[:switch], (
        "tokens before the update are the old policy's"
    )
    assert list(generation.token_ids[switch:]) != unchanged[switch:], (
        "the update did not change the next tokens"
    )
    restored = asyncio.run(engine.generate(greedy("restored", prompt, N)))  # served at v2 = the model again
    assert list(restored.token_ids) == unchanged and set(restored.versions) == {2}


def test_engine_args_override_the_workers_defaults_in_vllms_own_engine_args():
    """What vLLM receives, built in vLLM's environment without starting an engine: the overrides win, and no
    keyword arrives twice."""
    import json
    import os
    import subprocess

    from asyncrl.engine.vllm.client import WORKER, worker_args

    config = VLLMConfig(engine_args={"enforce_eager": False, "enable_prefix_caching": True, "seed": 5})
    argv = worker_args(DEFAULT_MODEL_DIR, config, max_model_len=256, seed=0)
    code = (
        "import json, sys, worker_main\n"
        "args = worker_main.engine_args_of(worker_main.parse_args(sys.argv[1:]))\n"
        "names = ('enforce_eager', 'enable_prefix_caching', 'seed', 'skip_tokenizer_init', 'max_model_len')\n"
        "print(json.dumps({name: getattr(args, name) for name in names}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(vllm_python()), "-c", code, *argv, "--port", "1", "--authkey-hex", "00"],
        cwd=WORKER.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    received = json.loads(done.stdout.strip().splitlines()[-1])
    assert received == {
        "enforce_eager": False,
        "enable_prefix_caching": True,
        "seed": 5,
        "skip_tokenizer_init": False,  # the tiny model ships its tokenizer: stop strings work
        "max_model_len": 256,
    }


def test_stop_strings_end_a_vllm_request_where_the_text_first_holds_one(engine, hf):
    model, tokenizer = hf
    prompt = tokenizer.encode(PROMPTS[1])
    full = asyncio.run(engine.generate(greedy("full", prompt, 16))).token_ids
    text = tokenizer.decode(full)
    stop = text.split()[1]  # the second word of the greedy answer
    cut = next(n for n in range(1, len(full) + 1) if stop in tokenizer.decode(full[:n]))
    stopped = asyncio.run(
        engine.generate(request("stopped", prompt, temperature=0.0, max_new_tokens=16, stop_strings=(stop,)))
    )
    assert stopped.finish_reason == FinishReason.STOP
    assert list(stopped.token_ids) == list(full[:cut])


def test_a_mismatched_or_stale_update_is_refused_and_the_old_weights_keep_serving(engine, hf):
    model, tokenizer = hf
    prompt = tokenizer.encode(PROMPTS[2])
    weights = state_dict_for_sync(model)
    before = asyncio.run(engine.generate(greedy("before", prompt))).token_ids
    bad_shape = {**weights, "model.norm.weight": torch.ones(3)}
    unknown = {**weights, "model.extra.weight": torch.ones(2)}
    missing = {k: v for k, v in weights.items() if k != "lm_head.weight"}
    for update, match in ((bad_shape, "has shape"), (unknown, "unknown tensor"), (missing, "missing tensor")):
        with pytest.raises(WeightSyncError, match=match):
            asyncio.run(engine.update_weights(update, version=engine.version + 1))
    with pytest.raises(WeightSyncError, match="older than the served"):
        asyncio.run(engine.update_weights(weights, version=engine.version - 1))
    assert asyncio.run(engine.generate(greedy("after", prompt))).token_ids == before


def test_a_delta_update_lands_bit_for_bit_rebuilt_one_tensor_at_a_time(engine, hf, tmp_path):
    """vLLM cannot patch its weights in place, so it reads a delta update (a snapshot and a delta after it)
    through ``DeltaSync.receive``, which rebuilds each tensor as the bucket stream reaches it: every served
    parameter equals the chain's last version bit for bit, and the model's own weights serve again after."""
    model, tokenizer = hf
    prompt = tokenizer.encode(PROMPTS[1])
    weights = state_dict_for_sync(model)
    before = asyncio.run(engine.generate(greedy("delta-before", prompt))).token_ids
    generator = torch.Generator().manual_seed(3)
    moved = [
        {name: t + torch.randn(t.shape, generator=generator) * 1e-3 for name, t in weights.items()}
        for _ in range(2)
    ]
    for step in moved:  # the tied matrix moves as one
        step["lm_head.weight"] = step["model.embed_tokens.weight"]
    sync, version = DeltaSync(tmp_path, full_every=100), engine.version + 1
    sync.publish(version, moved[0])
    update = sync.publish(version + 1, moved[1])
    asyncio.run(engine.update_weights(update, version=version + 1))
    digests = asyncio.run(engine.weight_digest())
    mismatched = [name for name, digest in digests.items() if digest != served_digest(moved[1], name)]
    assert digests and mismatched == [], f"served weights differ from the sent: {mismatched}"
    asyncio.run(engine.update_weights(weights, version=version + 2))
    assert asyncio.run(engine.generate(greedy("delta-after", prompt))).token_ids == before


def test_a_broadcast_update_lands_in_the_vllm_worker_like_the_pipe_update_and_a_mismatch_is_refused(
    engine, hf
):
    """weight_sync.type=broadcast on vLLM: vLLM's worker joins the trainer's gloo group, stages the broadcast
    buckets and applies them in place. Greedy tokens then equal those after the same weights sent over the
    worker pipe and HF's with those weights; a bucket with a wrong shape is refused by name, old weights kept."""
    from asyncrl.trainer.distributed.process_group import free_port
    from asyncrl.weight_sync.broadcast import WeightGroup
    from asyncrl.weight_sync.flat import pack_state
    from asyncrl.weight_sync.transports import update_of_buckets

    model, tokenizer = hf
    prompt = tokenizer.encode(PROMPTS[0])
    original = state_dict_for_sync(model)
    model_with_new = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model_with_new.parameters():  # a tied matrix once: both names get the same update
            parameter.add_(0.2 * torch.randn_like(parameter))
    new = state_dict_for_sync(model_with_new)
    base = engine.version

    async def update_by_pipe(weights, version):
        await engine.pause()
        await engine.update_weights(weights, version=version)
        await engine.resume()
        return await engine.generate(greedy(f"pipe{version}", prompt, 24))

    async def broadcast(group, buckets, version):
        staged = asyncio.ensure_future(engine.stage_weights())
        await asyncio.to_thread(group.send, [pack_state(b, version) for b in buckets])
        assert await staged == version
        flats = [pack_state(b, version).without_buffers() for b in buckets]
        await engine.update_weights(update_of_buckets(flats, "broadcast", None), version)

    async def scenario():
        by_pipe = await update_by_pipe(new, base + 1)
        await update_by_pipe(original, base + 2)
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
        names = list(new)
        await broadcast(group, [{n: new[n] for n in names[:3]}, {n: new[n] for n in names[3:]}], base + 3)
        by_broadcast = await engine.generate(greedy("bcast", prompt, 24))
        with pytest.raises(WeightSyncError, match="'model.norm.weight' has shape"):
            await broadcast(group, [{**original, "model.norm.weight": torch.ones(3)}], base + 4)
        kept = await engine.generate(greedy("kept", prompt, 24))
        return by_pipe, by_broadcast, kept

    by_pipe, by_broadcast, kept = asyncio.run(scenario())
    tokens, _ = hf_greedy_with_logprobs(model_with_new, prompt, 24)
    assert by_broadcast.token_ids == by_pipe.token_ids == tokens
    assert tokens != hf_greedy_with_logprobs(model, prompt, 24)[0], "the new weights change the tokens"
    assert set(by_broadcast.versions) == {base + 3} and engine.version == base + 3
    assert kept.token_ids == tokens and set(kept.versions) == {base + 3}


@pytest.mark.ray
@pytest.mark.parametrize(
    ("transport", "mode"),
    [
        ("object_store", ["controller.mode=async", "buffer.async_ratio=1"]),
        ("broadcast", ["controller.mode=async", "buffer.async_ratio=1"]),
        ("broadcast", ["controller.mode=sync"]),
    ],
    ids=["object_store-async", "broadcast-async-staged", "broadcast-sync-streamed"],
)
def test_vllm_engines_as_ray_actors_train_a_short_run(tmp_path, transport, mode):
    """engine.backend=vllm under the Ray runtime: each vLLM worker is started by its engine actor (so it runs
    in the actor's bundle), weights arrive as object-store buckets or are broadcast by trainer rank 0 straight
    into vLLM's worker (staged under async, streamed bucket by bucket under sync: ``broadcast_apply`` auto),
    and a short run trains every step."""
    import json
    from pathlib import Path

    from asyncrl.app import train as training
    from asyncrl.config.run import load_run_config

    config = load_run_config(
        None,
        [
            "engine.backend=vllm",
            "runtime.type=local",
            "runtime.rollout_num_cpus=1",
            "runtime.train_num_cpus=1",
            *mode,
            "controller.num_steps=4",
            "controller.eval_prompts=0",
            "rollout.rollout_batch_size=4",
            "rollout.num_return_sequences=4",
            "rollout.max_new_tokens=16",
            "engine.max_model_len=256",
            "model.device=cpu",
            f"weight_sync.type={transport}",
            "proxy.max_engine_restarts=8",
            f"output_dir={tmp_path}",
        ],
    )
    assert config.broadcast_apply() == ("streamed" if "controller.mode=sync" in mode else "staged")
    summary = asyncio.run(training.train(config, console=None))
    lines = [json.loads(line) for line in Path(summary.metrics_path).read_text().splitlines()]
    assert [line["train/version"] for line in lines] == [1.0, 2.0, 3.0, 4.0]
    assert all(line["staleness/max"] <= 1 for line in lines)
    placed = json.loads((tmp_path / "placement.json").read_text())
    assert len(placed["engines"]) == 1 and placed["engines"][0]["pid"] != placed["trainer_ranks"][0]["pid"]


def test_multi_version_moves_requests_between_vllm_engines_by_recompute(hf):
    """controller.mode=multi_version on vLLM: an update switches one engine to the new weights and its
    in-flight requests move, as prefixes, to the engine still on their version, which prefills them again;
    every request ends as an uninterrupted greedy run would, all its tokens on v0. Two fresh engines: the
    proxy starts at version 0, so its engines must serve v0 (the module's engine has taken updates)."""
    from asyncrl.config.proxy import ProxyConfig
    from asyncrl.proxy.factory import proxy_for_mode

    _, tokenizer = hf
    prompts = [tokenizer.encode(p) for p in PROMPTS] + [tokenizer.encode("copy 2 d: m n")]
    engine = VLLMEngineClient.start(DEFAULT_MODEL_DIR, VLLMConfig(), max_model_len=256)
    second = VLLMEngineClient.start(DEFAULT_MODEL_DIR, VLLMConfig(), max_model_len=256)
    reference = [
        asyncio.run(engine.generate(greedy(f"ref{i}", p, n=120))).token_ids for i, p in enumerate(prompts)
    ]
    weights = {k: v + 0.01 for k, v in state_dict_for_sync(hf[0]).items()}

    async def scenario():
        engines = [engine, second]
        proxy = proxy_for_mode(engines, ProxyConfig(), "multi_version", async_ratio=1.0, slots_per_engine=8)
        base = engine.version
        await asyncio.gather(*(e.pause() for e in engines))  # held from the start: nothing can run away
        calls = [
            asyncio.ensure_future(proxy.generate(greedy(f"mv{i}", p, n=120))) for i, p in enumerate(prompts)
        ]
        deadline = time.monotonic() + 60
        for client in engines:  # step each held engine in short bursts until both its requests have tokens
            while len(running := (await client.worker_stats())["running_tokens"]) < 2 or (
                min(running.values()) < 1
            ):
                assert time.monotonic() < deadline, f"the requests never ran two per engine: {running}"
                await client.resume()
                await client.pause()
        await proxy.suspend()
        await proxy.model_update(weights, base + 1)
        await proxy.resume()
        await proxy.update_applied(base + 1)
        await asyncio.gather(*(e.resume() for e in engines))
        generations = await asyncio.gather(*calls)
        await proxy.aclose()
        return base, generations, proxy.stats()

    try:
        base, generations, stats = asyncio.run(scenario())
    finally:
        engine.shutdown()
        second.shutdown()
    assert stats["num_migrations"] == 2 and stats["kv_bytes_moved"] == 0
    for generation, expected in zip(generations, reference, strict=True):
        assert generation.token_ids == expected
        assert generation.versions == [base] * 120 and generation.finish_reason is FinishReason.LENGTH


def test_an_adapter_update_is_served_through_vllms_lora_support_as_the_merged_model(hf):
    """Adapter pairs (kind ``lora``) become vLLM's newest LoRA adapter: the greedy tokens are the peft-merged
    model's and the log-probs within 1e-4 of it (vLLM adds the low-rank product at every step, the merged model
    has it in its weights); a later adapter update replaces it, and requests carry the new version."""
    import copy

    import peft

    from asyncrl.trainer.lora import adapter_spec, adapter_tensors
    from asyncrl.weight_sync import InProcessSync

    model, tokenizer = hf
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    client = VLLMEngineClient.start(DEFAULT_MODEL_DIR, VLLMConfig(max_lora_rank=8), max_model_len=256)
    try:
        for version, seed in ((1, 1), (2, 2)):
            torch.manual_seed(seed)
            wrapped = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=8, lora_alpha=16))
            with torch.no_grad():
                for name, param in wrapped.named_parameters():
                    if "lora_B" in name:
                        param.copy_(torch.randn(param.shape) * 0.05)
            inner = wrapped.get_base_model()
            update = InProcessSync().publish(version, adapter_tensors(inner), adapter=adapter_spec(inner))
            asyncio.run(client.update_weights(update, version))
            merged = copy.deepcopy(wrapped).merge_and_unload()

            async def serve(client=client, version=version):
                return await asyncio.gather(
                    *(client.generate(greedy(f"a{version}-{i}", p)) for i, p in enumerate(prompts))
                )

            for prompt, served in zip(prompts, asyncio.run(serve()), strict=True):
                tokens, logprobs = hf_greedy_with_logprobs(merged, prompt, 12)
                assert list(served.token_ids) == tokens
                assert list(served.logprobs) == pytest.approx(logprobs, abs=1e-4)
                assert list(served.versions) == [version] * 12
    finally:
        client.shutdown()
