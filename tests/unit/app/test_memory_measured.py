"""The memory plan against what torch's CPU allocator reports for a real train step at a small Qwen3 shape: the
trainer role's planned peak within ±15 % of the measured one, with and without activation checkpointing.

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
    assert abs(role.total - measured) <= 0.15 * measured, (role.total, measured, role.terms)


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
        for i in range(8):
            prompt = torch.randint(0, VOCAB, (64,), generator=gen).tolist()
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
