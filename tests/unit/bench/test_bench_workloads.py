"""The workloads have the shapes their benchmarks claim, and their models build into a cache dir."""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from asyncrl.config.loader import load_config
from asyncrl.config.run import load_run_config
from asyncrl.config.sft import SFTConfig
from asyncrl.data.registry import make_task
from asyncrl.models.sft import tokenizer_texts
from asyncrl.models.tiny import build_tiny_model
from asyncrl.models.tokenizer import train_tokenizer
from bench.workloads import GENERATION_BOUND, LONG_TAIL, QUICK, RLWorkload, WarmStart, cached_model_dir


def test_generation_bound_lengths_are_long_tailed_and_k_exceeds_n() -> None:
    lengths = GENERATION_BOUND.lengths.sample(10_000, seed=0)
    assert np.percentile(lengths, 99) / np.median(lengths) >= 8
    assert GENERATION_BOUND.max_running_requests > GENERATION_BOUND.samples_per_step
    assert GENERATION_BOUND.samples_per_prompt > 1


def test_model_is_built_once_into_the_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ASYNCRL_BENCH_CACHE", str(tmp_path))
    first = cached_model_dir(QUICK)
    mtime = (first / "config.json").stat().st_mtime
    assert cached_model_dir(QUICK) == first and (first / "config.json").stat().st_mtime == mtime
    model = AutoModelForCausalLM.from_pretrained(first)
    assert (
        model.config.hidden_size == QUICK.model.hidden
        and model.config.intermediate_size == QUICK.model.intermediate
    )


def config_of(work: RLWorkload, *extra: str):
    """The workload's run config without building its warm start (the model path is not read here)."""
    return load_run_config(None, [*work.run, *extra])


def test_long_tail_is_the_workload_the_issue_asks_for() -> None:
    """Group size 8, max_new_tokens >= 1,024, over 100 steps after warm-up, a Qwen3 shape of tens of millions
    of parameters, learning on (lr not frozen), and the warm start a recipe of ``asyncrl sft``."""
    config = config_of(LONG_TAIL)
    assert config.rollout.num_return_sequences == LONG_TAIL.group_size == 8
    assert config.rollout.rollout_batch_size == LONG_TAIL.prompts_per_step
    assert config.rollout.max_new_tokens >= 1024
    assert LONG_TAIL.steps - LONG_TAIL.warmup >= 100 and LONG_TAIL.measured_steps >= 20
    assert config.trainer.lr >= 1e-5 and config.runtime.type == "inline"
    sft = load_config(SFTConfig, None, [*LONG_TAIL.warm_start.sft, "output_dir=x"])
    assert sft.architecture == "qwen3" and sft.task == config.task
    with torch.device("meta"):
        model = build_tiny_model(
            architecture=sft.architecture,
            hidden_size=sft.hidden_size,
            num_layers=sft.num_layers,
            num_heads=sft.num_heads,
            num_kv_heads=sft.num_kv_heads,
            intermediate_size=sft.intermediate_size,
            vocab_size=sft.vocab_size,
        )
    params = sum(p.numel() for p in model.parameters())
    assert params * 4 > 2 * 32 * 2**20 and params >= 10_000_000  # float32 weights over twice a 32 MiB L3


def test_long_tail_responses_are_long_tailed_in_tokens() -> None:
    """p99/median of the correct responses' token counts >= 10 (copy: one token per item, then EOS), and the
    longest prompts ask for hundreds of tokens."""
    config = config_of(LONG_TAIL, "task.num_train=4000")
    tokenizer = train_tokenizer(tokenizer_texts(0, num_per_task=200), 384)
    samples = make_task(config.task).split("train")
    lengths = [len(ids) + 1 for ids in tokenizer([s.demonstration for s in samples])["input_ids"]]
    assert np.percentile(lengths, 99) / np.median(lengths) >= 10
    assert max(lengths) >= 300


def test_a_warm_start_is_named_by_its_recipe(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ASYNCRL_BENCH_CACHE", str(tmp_path))
    other = WarmStart(name=LONG_TAIL.warm_start.name, sft=(*LONG_TAIL.warm_start.sft, "seed=1"))
    assert other.directory() != LONG_TAIL.warm_start.directory()
    assert LONG_TAIL.warm_start.directory().parent == tmp_path
    assert LONG_TAIL.warm_start.command()[-1] == f"output_dir={LONG_TAIL.warm_start.directory()}"
