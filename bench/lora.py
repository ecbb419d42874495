"""Benchmark: LoRA against full fine-tuning, and how the built-in engine serves adapters.

Four parts, every arm repeated and interleaved by the harness:

- ``trainer_full`` / ``trainer_lora``: one ``train_step`` on the long-tail workload's model (``LONG_TAIL_SHAPE``:
  18.3 M Qwen3-shaped, random weights) over one step's batch of its lengths (4 prompts x 8 samples, log-normal
  responses, median 13, σ 1.2); each repeat is a fresh process (a warm-up step, then the timed one), so its peak
  resident memory is the arm's own. Metrics: trained tokens/s, peak RSS, and the trainer's state (parameters,
  gradients and AdamW moments, counted from the tensors). LoRA: ``trainer.lora`` at its defaults (rank 16,
  alpha 32, every linear layer of the decoder).
- ``sync_<kind>_<transport>``: one weight update of that trainer (after its step) through the in-process and the
  flat-buffer (object-store layout, no Ray) transports into a built-in engine: bytes shipped, seconds to publish
  (trainer side) and to apply (engine side: a copy for a full update, the merge for an adapter).
- ``engine_<merged|low_rank>_b<B>``: decode tokens/s of the engine serving one adapter merged into its weights
  (what ``engine.adapters`` does) against peft's unmerged low-rank layers, at batch sizes up to the engine's
  default 64 running requests; ``engine_merge_update`` times the merge an update costs. The engine's choice
  (merge, for a float32 engine as here; half precision serves low-rank for accuracy) stands only if merged is
  at least as fast at every batch size (``engine_choice``).
- ``learn_lora`` / ``learn_full``: the default example (``asyncrl train``, async α = 2, 150 steps, 512 held-out
  prompts before and after) with ``trainer.lora`` (lr 1e-3: LoRA's customary 10x the full run's rate) and as
  shipped (full, lr 1e-4), one seed per repeat.

    python bench/lora.py [--quick] [--repeats 3] [--out bench/results/lora.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/lora.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import copy
import json
import subprocess
import time
from collections.abc import Callable

import torch

from asyncrl.cli.train import DEFAULT_EXAMPLE
from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.engine import EngineConfig
from asyncrl.config.trainer import LoraConfig, TrainerConfig
from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.models.tiny import build_tiny_model
from asyncrl.trainer.batching import build_train_batch, sequence_lengths
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import Request, SamplingParams
from asyncrl.weight_sync import FlatBufferSync, InProcessSync
from bench import harness
from bench.default_run import example_run_arm
from bench.trainer import make_groups
from bench.workloads import LONG_TAIL_SHAPE, LengthDistribution, ModelShape, Workload

VOCAB = 384
"""The copy task's tokenizer (the long-tail warm start's vocabulary)."""
BATCH = Workload(
    name="long_tail_step",
    bound="training",
    model=ModelShape(hidden=512, layers=6, heads=8, kv_heads=2, intermediate=1536, vocab=VOCAB),
    prompt_tokens=24,
    lengths=LengthDistribution(median=13, sigma=1.2, min_tokens=2, max_tokens=1024),
    prompts_per_step=4,
    samples_per_prompt=8,
    max_running_requests=64,
)
"""One step of the long-tail workload: its groups, prompts of the copy task's typical length, its response
length distribution (``LONG_TAIL_TASK``)."""
QUICK_BATCH = Workload(
    name="quick_step",
    bound="training",
    model=ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=VOCAB),
    prompt_tokens=8,
    lengths=LengthDistribution(median=8, sigma=1.0, min_tokens=2, max_tokens=64),
    prompts_per_step=2,
    samples_per_prompt=4,
    max_running_requests=8,
)
LORA = LoraConfig()
"""``trainer.lora`` at its defaults: what a user who switches LoRA on gets."""
ENGINE_BATCHES = (1, 8, 32, 64)
"""Decode batch sizes: one request up to the engine's default ``max_running_requests``."""
PROMPT_TOKENS, NEW_TOKENS = 16, 32
LEARN_LORA = ["trainer.lora.rank=16", "trainer.lr=1e-3"]
QUICK_LEARN = ["controller.num_steps=1", "controller.eval_prompts=8", "task.num_eval=8"]


def long_tail_kwargs() -> dict[str, object]:
    """``build_tiny_model`` arguments of ``LONG_TAIL_SHAPE`` (written as ``asyncrl tiny`` flags)."""
    kwargs: dict[str, object] = {}
    for flag in LONG_TAIL_SHAPE:
        key, value = flag.split("=", 1)
        kwargs[key] = value if key == "architecture" else int(value)
    return kwargs


def build(quick: bool) -> torch.nn.Module:
    """The benchmark's base model: the long-tail shape (the quick twin in ``--quick``), random weights."""
    if quick:
        shape = QUICK_BATCH.model
        return build_tiny_model(
            hidden_size=shape.hidden,
            num_layers=shape.layers,
            num_heads=shape.heads,
            num_kv_heads=shape.kv_heads,
            intermediate_size=shape.intermediate,
            vocab_size=VOCAB,
        )
    return build_tiny_model(**long_tail_kwargs(), vocab_size=VOCAB)


def make_trainer(kind: str, quick: bool) -> Trainer:
    config = TrainerConfig(lr=1e-4, lora=LORA if kind == "lora" else None)
    return Trainer(build(quick), config, LossConfig(name="ppo"), AdvantageConfig(name="grpo"))


def state_bytes(trainer: Trainer) -> int:
    """Bytes of the trainer's parameters, gradients and optimizer state (what LoRA shrinks by design)."""
    tensors = [p for p in trainer.model.parameters()]
    tensors += [p.grad for p in trainer.model.parameters() if p.grad is not None]
    tensors += [t for state in trainer.optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    seen = {t.data_ptr(): t.numel() * t.element_size() for t in tensors}
    return sum(seen.values())


def trainer_child(kind: str, quick: bool) -> dict[str, float]:
    """Body of one trainer repeat in its own process: a warm-up step, then the timed one."""
    work = QUICK_BATCH if quick else BATCH
    groups = make_groups(work)
    real_tokens = sum(sequence_lengths(build_train_batch(groups, [0.0] * work.samples_per_step)))
    trainer = make_trainer(kind, quick)
    trainer.train_step(groups, trainer.version)
    start = time.perf_counter()
    trainer.train_step(groups, trainer.version)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "trained_tokens_per_s": real_tokens / seconds,
        "peak_rss_mb": harness.resident_memory_mb()["peak_rss_mb"],
        "state_mb": state_bytes(trainer) / 2**20,
        "trainable_params": float(sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)),
    }


def trainer_arm(kind: str, quick: bool) -> Callable[[], dict[str, float]]:
    command = [sys.executable, __file__, "--child-trainer", kind, *(["--quick"] if quick else [])]

    def run() -> dict[str, float]:
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run


def engine_for(model: torch.nn.Module, quick: bool) -> LLMEngine:
    config = EngineConfig(
        max_running_requests=QUICK_BATCH.max_running_requests if quick else BATCH.max_running_requests,
        max_model_len=PROMPT_TOKENS + NEW_TOKENS,
        max_kv_tokens=64 * (PROMPT_TOKENS + NEW_TOKENS),
    )
    return LLMEngine(model, None, config)


def sync_arm(kind: str, transport: str, quick: bool) -> Callable[[], dict[str, float]]:
    """Publish the trained trainer's weights (adapters with LoRA) and apply them on an engine."""
    work = QUICK_BATCH if quick else BATCH
    trainer = make_trainer(kind, quick)
    trainer.train_step(make_groups(work), trainer.version)  # non-zero adapters, a real version
    engine = engine_for(build(quick), quick)
    sync = InProcessSync() if transport == "in_process" else FlatBufferSync()

    def run() -> dict[str, float]:
        start = time.perf_counter()
        update = sync.publish(trainer.version, trainer.sync_tensors(), adapter=trainer.adapter)
        published = time.perf_counter()
        engine.update_weights(update, update.version)
        applied = time.perf_counter()
        return {
            "bytes": float(update.nbytes),
            "publish_s": published - start,
            "apply_s": applied - published,
            "seconds": applied - start,
        }

    return run


def engine_arms(quick: bool) -> dict[str, Callable[[], dict[str, float]]]:
    """Decode with one adapter merged (``engine.adapters``) or as peft's low-rank layers, per batch size."""
    import peft

    from asyncrl.trainer.lora import adapter_spec, adapter_tensors, attach_lora

    base = build(quick)
    low_rank = attach_lora(copy.deepcopy(base), LORA, seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained adapter's magnitude, not peft's zero B
        for name, param in low_rank.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02, generator=gen)
    inner = low_rank.get_base_model()
    update = InProcessSync().publish(1, adapter_tensors(inner), adapter=adapter_spec(inner))
    merged_engine = engine_for(copy.deepcopy(base), quick)
    merged_engine.update_weights(update, 1)
    engines = {"merged": merged_engine, "low_rank": engine_for(inner, quick)}
    assert isinstance(low_rank, peft.PeftModel)
    batches = ENGINE_BATCHES[:2] if quick else ENGINE_BATCHES
    arms = {
        f"engine_{kind}_b{batch}": decode_arm(engine, batch)
        for kind, engine in engines.items()
        for batch in batches
    }
    merge_target = engine_for(copy.deepcopy(base), quick)

    def merge_update() -> dict[str, float]:
        start = time.perf_counter()
        merge_target.adapters.apply(update.handle, update.adapter.scaling, 1)
        return {"seconds": time.perf_counter() - start}

    arms["engine_merge_update"] = merge_update
    return arms


def decode_arm(engine: LLMEngine, batch: int) -> Callable[[], dict[str, float]]:
    gen = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(3, VOCAB, (PROMPT_TOKENS,), generator=gen).tolist() for _ in range(batch)]
    runs = iter(range(10**9))

    def run() -> dict[str, float]:
        tag = next(runs)
        sampling = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, ignore_eos=True, seed=tag)
        for index, prompt in enumerate(prompts):
            engine.add_request(
                Request(request_id=f"{tag}-{index}", prompt_token_ids=prompt, sampling=sampling)
            )
        start = time.perf_counter()
        generated = 0
        while engine.has_work():
            generated += sum(g.num_tokens for g in engine.step())
        return {"tokens_per_s": generated / (time.perf_counter() - start)}

    return run


def learn_arms(quick: bool) -> dict[str, Callable[[], dict[str, float]]]:
    extra = QUICK_LEARN if quick else []
    return {
        "learn_lora": example_run_arm(DEFAULT_EXAMPLE, [*LEARN_LORA, *extra]),
        "learn_full": example_run_arm(DEFAULT_EXAMPLE, extra),
    }


def ratios_of(raw: dict[str, list[dict[str, float]]], quick: bool) -> dict[str, dict[str, object]]:
    ratio = harness.paired_ratio
    ratios = {
        "lora_over_full_trained_tokens_per_s": ratio(
            raw, "trainer_lora", "trainer_full", "trained_tokens_per_s"
        ),
        "lora_over_full_peak_rss": ratio(raw, "trainer_lora", "trainer_full", "peak_rss_mb"),
        "lora_over_full_state": ratio(raw, "trainer_lora", "trainer_full", "state_mb"),
    }
    for transport in ("in_process", "object_store"):
        for metric in ("bytes", "seconds"):
            ratios[f"full_over_lora_sync_{metric}_{transport}"] = ratio(
                raw, f"sync_full_{transport}", f"sync_lora_{transport}", metric
            )
    for batch in ENGINE_BATCHES[:2] if quick else ENGINE_BATCHES:
        ratios[f"merged_over_low_rank_b{batch}"] = ratio(
            raw, f"engine_merged_b{batch}", f"engine_low_rank_b{batch}", "tokens_per_s"
        )
    return ratios


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "lora")
    parser.add_argument("--child-trainer", choices=["full", "lora"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:  # a smoke run: one thread, so a busy machine's OpenMP barriers cannot stretch it
        torch.set_num_threads(1)
    if args.child_trainer:
        print(json.dumps(trainer_child(args.child_trainer, args.quick)))
        return
    quick, repeats = args.quick, harness.repeats_for(args)
    in_process = {
        f"sync_{kind}_{transport}": sync_arm(kind, transport, quick)
        for transport in ("in_process", "object_store")
        for kind in ("full", "lora")
    }
    in_process |= engine_arms(quick)
    # arms in this process warm up first (allocator, first-call kernels); the others start a process or a run
    raw = harness.run_arms(in_process, repeats, harness.print_run, warmup=True)
    whole = {f"trainer_{kind}": trainer_arm(kind, quick) for kind in ("full", "lora")} | learn_arms(quick)
    raw |= harness.run_arms(whole, repeats, harness.print_run)
    ratios = ratios_of(raw, quick)
    gains = [
        a["reward_gain"] - b["reward_gain"] for a, b in zip(raw["learn_lora"], raw["learn_full"], strict=True)
    ]
    merged_wins = all(v["median"] >= 1.0 for k, v in ratios.items() if k.startswith("merged_over_low_rank"))
    work = QUICK_BATCH if quick else BATCH
    setup = {
        "model": "quick twin" if quick else {"shape": list(LONG_TAIL_SHAPE), "vocab": VOCAB},
        "params": sum(p.numel() for p in build(quick).parameters()),
        "batch": {"workload": work.name, "samples": work.samples_per_step, "lengths": vars(work.lengths)},
        "lora": vars(LORA),
        "engine_batches": list(ENGINE_BATCHES[:2] if quick else ENGINE_BATCHES),
        "decode": {"prompt_tokens": PROMPT_TOKENS, "new_tokens": NEW_TOKENS},
        "learning": {
            "example": str(DEFAULT_EXAMPLE.name),
            "lora_overrides": LEARN_LORA,
            "quick": QUICK_LEARN,
        },
    }
    threads = f"{torch.get_num_threads()} torch threads"
    resources = {
        "trainer": f"one process per repeat, {threads}",
        "sync_and_engine": f"this process, {threads}, arms one at a time",
        "learn": "the default example's own placement (inline runtime)",
    }
    extra = {
        "engine_choice": "merged" if merged_wins else "low_rank (merged lost somewhere: revisit)",
        "lora_minus_full_reward_gain": harness.summary(gains),
    }
    harness.write_result(args, "lora", raw, ratios=ratios, resources=resources, setup=setup, extra=extra)


if __name__ == "__main__":
    main()
