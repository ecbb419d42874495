"""The memory plan against what torch's CPU allocator reports for a real train step at a small Qwen3 shape: the
trainer role's planned peak within ±15 % of the measured one, with and without activation checkpointing; the
engine's; and each phase of an inline switched device (``runtime.switch``: trainer and engine taking turns).

Measured: the bytes alive before the step (weights, kept gradients, AdamW's moments: counted tensor by tensor)
plus the peak of the allocator's running total during the step ("Total Allocated" of the profiler's memory
events, not RSS). The second step is the one measured: the first creates the optimizer state."""

from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import Qwen3Config, Qwen3ForCausalLM

from asyncrl.app import memory_plan as mp
from asyncrl.config.run import load_run_config
from asyncrl.sim.model_shape import shape_from_hf_config
from asyncrl.trainer.factory import build_trainer
from asyncrl.types import Group, Trajectory

VOCAB = 4096
SHAPE = Qwen3Config(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=VOCAB,
    tie_word_embeddings=False,
    max_position_embeddings=1024,
)
TOKENS = 512
"""Tokens per micro-batch; two micro-batches a step, so gradients accumulate."""


class _Tokenizer:
    pad_token_id = 0


def groups(seed: int) -> list[Group]:
    """Two groups of four 128-token trajectories (32 prompt tokens), 0/1 rewards."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for g in range(2):
        prompt = torch.randint(0, VOCAB, (32,), generator=gen).tolist()
        trajectories = []
        for i in range(4):
            response = torch.randint(0, VOCAB, (TOKENS // 4 - 32,), generator=gen).tolist()
            trajectories.append(
                Trajectory(
                    prompt_uid=f"p{g}",
                    sample_index=i,
                    token_ids=prompt + response,
                    loss_mask=[0] * 32 + [1] * len(response),
                    logprobs=[0.0] * 32 + [-1.0] * len(response),
                    versions=[-1] * 32 + [0] * len(response),
                    start_version=0,
                    num_prompt_tokens=32,
                    reward=float(i % 2),
                )
            )
        out.append(Group(prompt_uid=f"p{g}", trajectories=trajectories))
    return out


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def peak_allocated(fn, trace) -> int:
    """The highest running total of the CPU allocator's bytes while ``fn`` runs, relative to its start."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    prof.export_chrome_trace(str(trace))
    events = [e["args"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    if (
        not events
    ):  # nothing allocated (a float32 publication packs into shared memory, outside the allocator)
        return 0
    # the running total is process-wide: blocks an earlier profile saw allocated, and that were freed after it
    # stopped, are still in it; the total just before the first event is this profile's zero
    zero = events[0]["Total Allocated"] - events[0]["Bytes"]
    return max(e["Total Allocated"] for e in events) - zero


@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-checkpointing", "checkpointing"])
def test_the_trainer_plan_is_within_15_percent_of_the_allocator(checkpointing, tmp_path) -> None:
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(SHAPE)
    config = load_run_config(
        None,
        [
            "model.dtype=float32",
            f"trainer.activation_checkpointing={checkpointing}",
            f"trainer.max_tokens_per_microbatch={TOKENS}",
            "loss.name=reinforce",
        ],
    )
    role = mp.trainer_role(config, shape_from_hf_config(SHAPE.to_dict()), device="cpu")
    trainer = build_trainer(config, model, _Tokenizer())
    trainer.train_step(groups(0), policy_version=0)  # creates AdamW's moments (and frees its gradients)
    assert all(p.grad is None for p in model.parameters())
    state = [t for s in trainer.optimizer.state.values() for t in s.values()]
    before = tensor_bytes([*model.parameters(), *state])
    measured = before + peak_allocated(
        lambda: trainer.train_step(groups(1), policy_version=1), tmp_path / "t.json"
    )
    assert role.peak_phase == "train"
    # the proxy's kept update is planned on the trainer's device (inline, in_process): no proxy runs here
    planned = role.total - sum(t.bytes for t in role.terms if t.name == "retained update")
    assert abs(planned - measured) <= 0.15 * measured, (planned, measured, role.terms)


PADDED_PREFILL = (128, 43, 43, 42)
"""Prompts whose step of prefill (256 tokens, ``max_prefill_tokens_per_step``) runs as one group padded to
4 × 128 = 512 tokens (``padding_groups``: within twice its real tokens), the most the plan counts."""


def test_the_engine_plan_is_within_15_percent_of_the_allocator(tmp_path) -> None:
    from asyncrl.engine.llm_engine import LLMEngine
    from asyncrl.types import Request, SamplingParams

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(SHAPE).eval()
    config = load_run_config(
        None,
        [
            "model.dtype=float32",
            "engine.max_running_requests=8",
            "engine.max_model_len=512",
            "engine.max_prefill_tokens_per_step=256",
        ],
    )
    role = mp.engine_role(
        config, shape_from_hf_config(SHAPE.to_dict()), 512, mp.Hardware("cpu", 2**34, 1), "cpu"
    )
    gen = torch.Generator().manual_seed(2)

    def serve() -> None:
        engine = LLMEngine(model, None, config.engine)
        for i, length in enumerate(PADDED_PREFILL * 2):
            prompt = torch.randint(0, VOCAB, (length,), generator=gen).tolist()
            engine.add_request(
                Request(
                    request_id=f"r{i}",
                    prompt_token_ids=prompt,
                    sampling=SamplingParams(max_new_tokens=8, seed=i),
                )
            )
        while engine.has_work():
            engine.step()

    before = tensor_bytes(model.parameters())
    measured = before + peak_allocated(serve, tmp_path / "e.json")
    assert abs(role.total - measured) <= 0.15 * measured, (role.total, measured, role.terms)


SWITCHED = [
    "model.dtype=float32",
    "engine.dtype=float32",
    f"trainer.max_tokens_per_microbatch={TOKENS}",
    "loss.name=reinforce",
    "controller.mode=sync",
    "runtime.switch.enabled=true",
    "runtime.switch.offload_optimizer=false",
    "engine.max_running_requests=16",
    "engine.max_model_len=1024",
    "engine.max_prefill_tokens_per_step=256",
]
"""An inline switched run at the small shape, its KV pool (16 slots of 1,024) a real share of the device. Planned
with nothing offloaded: on CPU the switch's offload moves the optimizer state from host memory to host memory."""


def switched_phase_peaks(config, tmp_path) -> list[int]:
    """The allocator's peak in each phase of ``memory_plan.SWITCH_PHASES``, run by hand in
    ``runtime.colocate``'s order with the real trainer, engine, transport and offloader, one whole step first
    (it creates AdamW's moments). Each is the bytes alive as the phase begins (weights, moments, the engine's
    weights and, awake, its KV pool: counted tensor by tensor; the packed copy once published: its shared-memory
    blocks, the CPU twin of the GPU's device blocks, outside the allocator) plus the allocator's peak during it."""
    import copy

    from asyncrl.engine.llm_engine import LLMEngine
    from asyncrl.runtime.colocate import offload_choice
    from asyncrl.trainer.offload import StateOffloader
    from asyncrl.types import Request, SamplingParams
    from asyncrl.weight_sync.colocated import ColocatedSync

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(SHAPE)
    trainer = build_trainer(config, model, _Tokenizer())
    engine = LLMEngine(copy.deepcopy(model).eval(), None, config.engine)
    sync = ColocatedSync("cpu")
    offloader = StateOffloader.for_trainer(trainer, offload_choice(config.runtime.switch))
    gen = torch.Generator().manual_seed(2)

    def alive() -> int:
        state = [t for s in trainer.optimizer.state.values() for t in s.values()]
        served = tensor_bytes([*engine.model.parameters(), *engine.model.buffers()])
        return tensor_bytes([*model.parameters(), *state]) + served + engine.stats()["kv_pool_bytes"]

    def generate() -> None:
        for i in range(16):
            prompt = torch.randint(0, VOCAB, (64,), generator=gen).tolist()
            sampling = SamplingParams(max_new_tokens=8, seed=i)
            engine.add_request(Request(request_id=f"r{i}", prompt_token_ids=prompt, sampling=sampling))
        while engine.has_work():
            engine.step()

    def publish():
        return sync.publish(trainer.version, trainer.serving_tensors(), adapter=trainer.adapter)

    def step(seed: int, measure) -> None:
        engine.sleep(1)
        offloader.reload()
        measure("train", lambda: trainer.train_step(groups(seed), policy_version=seed))
        update = measure("publish", publish)
        offloader.offload()
        measure("apply", lambda: (engine.wake(), engine.update_weights(update, update.version)))
        sync.release()
        measure("generate", generate)

    step(0, lambda name, fn: fn())
    peaks: dict[str, int] = {}

    def measured(name, fn):
        before, result = alive() + sync.held_bytes, None

        def run() -> None:
            nonlocal result
            result = fn()

        peak = peak_allocated(run, tmp_path / f"{name}.json")
        peaks[name] = before + peak + (sync.held_bytes if name == "publish" else 0)
        return result

    step(1, measured)
    return [peaks[name] for name in ("train", "publish", "apply", "generate")]


def test_a_switched_gpus_phases_are_within_15_percent_of_the_allocator(tmp_path) -> None:
    """Inline under ``runtime.switch`` the trainer and the engine take turns on one device: each phase the plan
    counts (``memory_plan.switch_devices``) within ±15 % of what the allocator held in it, so the device's need
    is the heaviest phase's; the trainer's peak plus the engine's, which the plan once summed, is far above
    anything the run ever held."""
    config = load_run_config(None, SWITCHED)
    shape = shape_from_hf_config(SHAPE.to_dict())
    trainer = mp.trainer_role(config, shape, device="cpu")
    engine = mp.engine_role(config, shape, 1024, mp.Hardware("cpu", 2**34, 1), "cpu")
    planned = [device.total for device in mp.shared_gpu_devices(config, shape, trainer, engine)]
    measured = switched_phase_peaks(config, tmp_path)
    for phase, plan, held in zip(mp.SWITCH_PHASES, planned, measured, strict=True):
        assert abs(plan - held) <= 0.15 * held, (phase, plan, held)
    assert trainer.total + engine.total > 1.15 * max(measured), (trainer.total, engine.total, measured)
