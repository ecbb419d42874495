"""Benchmark: the trainer's packed path against its padded path and against a plain training loop.

On the generation-bound workload's batches (long-tailed response lengths, so a padded batch is mostly
padding), three arms each run one full ``train_step``-sized update of the same batch, interleaved:

- ``packed``: ``Trainer.train_step`` with ``trainer.sequence_packing=true`` (the default);
- ``padded``: the same with ``sequence_packing=false`` (right-padded rows, micro-batches by rows × width, the
  samples taken longest first so each micro-batch pads only to its own longest row);
- ``padded_whole_batch``: the padded path with one micro-batch for the whole batch, so every row is padded to
  the batch's longest (what a collator that pads the batch as one tensor computes);
- ``plain``: the floor asyncrl's bookkeeping is measured against: one forward + backward + AdamW step of the
  same model over the same packed rows (``asyncrl.trainer.packing.pack``), full-vocabulary log-softmax, no
  advantages, no loss registry, no micro-batching.

Metric: trained tokens/s = real (unpadded) tokens of the batch / seconds of the update. Targets (issue 14):
packed ≥ 2× padded, packed ≥ 0.8× plain. Key decision: the result also records each arm's *computed* tokens
(rows × width summed over its micro-batches), because packing can gain at most computed / real tokens over a
padded arm when the cost is linear in tokens; each ratio is reported as a share of that bound too, so a target
the batch cannot allow shows as such instead of as a shortfall of the trainer.

``--device cuda`` runs the arms on the GPU with Qwen2-0.5B's shape (random weights, float32) on the same
batch: the 21 M model would measure kernel launches there. Write it to ``bench/results/trainer_cuda.json``.

    python bench/trainer.py [--quick] [--repeats 3] [--device cpu|cuda] [--out bench/results/trainer.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/trainer.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import time
from collections.abc import Callable
from typing import Any

import torch

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.batching import build_train_batch, plan_micro_batches, sequence_lengths
from asyncrl.trainer.packing import pack
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import Group, Trajectory
from bench import harness
from bench.workloads import (
    GENERATION_BOUND,
    QUICK,
    ModelShape,
    Workload,
    build_model,
    model_shape,
    synchronize,
)


def make_groups(work: Workload, seed: int = 0) -> list[Group]:
    """One step's groups: random prompts, lognormal response lengths, 0/1 rewards, behaviour log-prob -1."""
    gen = torch.Generator().manual_seed(seed)
    lengths = work.lengths.sample(work.samples_per_step, seed)
    groups = []
    for p in range(work.prompts_per_step):
        prompt = torch.randint(3, work.model.vocab, (work.prompt_tokens,), generator=gen).tolist()
        trajectories = []
        for i in range(work.samples_per_prompt):
            n = lengths[p * work.samples_per_prompt + i]
            response = torch.randint(3, work.model.vocab, (n,), generator=gen).tolist()
            trajectories.append(
                Trajectory(
                    prompt_uid=f"p{p}",
                    sample_index=i,
                    token_ids=prompt + response,
                    loss_mask=[0] * len(prompt) + [1] * n,
                    logprobs=[0.0] * len(prompt) + [-1.0] * n,
                    versions=[-1] * len(prompt) + [0] * n,
                    start_version=0,
                    num_prompt_tokens=len(prompt),
                    reward=float(torch.randint(0, 2, (1,), generator=gen)),
                )
            )
        groups.append(Group(prompt_uid=f"p{p}", trajectories=trajectories))
    return groups


def trainer_arm(
    shape: ModelShape, groups: list[Group], config: TrainerConfig, real_tokens: int, device: str
) -> Callable[[], dict]:
    model = build_model(shape).to(device)
    trainer = Trainer(model, config, LossConfig(name="ppo"), AdvantageConfig(name="grpo"))

    def run() -> dict[str, float]:
        synchronize(device)
        start = time.perf_counter()
        trainer.train_step(groups, trainer.version)
        synchronize(device)
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "trained_tokens_per_s": real_tokens / seconds}

    return run


def plain_arm(
    shape: ModelShape, groups: list[Group], row_tokens: int, real_tokens: int, device: str
) -> Callable[[], dict]:
    """Forward + backward + AdamW over the same packed rows, with nothing else."""
    model = build_model(shape).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    batch = build_train_batch(groups, [0.0] * sum(len(g.trajectories) for g in groups)).to(device)

    def run() -> dict[str, float]:
        synchronize(device)
        start = time.perf_counter()
        packing = pack(batch.input_ids, batch.attention_mask, row_tokens)
        logits = model(input_ids=packing.input_ids, position_ids=packing.position_ids).logits
        targets = packing.input_ids[:, 1:]
        logprobs = logits[:, :-1].float().log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)
        (-logprobs.mean()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "trained_tokens_per_s": real_tokens / seconds}

    return run


def computed_tokens(lengths: list[int], config: TrainerConfig) -> int:
    """Tokens the trainer runs the model on under ``config``: real tokens when packed, else rows × width of
    each micro-batch (the plan the trainer itself makes)."""
    if config.sequence_packing:
        return sum(lengths)
    plan = plan_micro_batches(lengths, config.max_tokens_per_microbatch)
    return sum(len(rows) * max(lengths[i] for i in rows) for rows in plan)


def num_parameters(shape: ModelShape) -> int:
    """The model's parameter count, from a copy built on the meta device (no memory, no initialisation)."""
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(shape).parameters())


def share_of_bound(ratio: dict[str, Any], bound: float) -> dict[str, Any]:
    """Each paired ratio as a fraction of the linear-cost bound, summarized like a metric."""
    return {"bound": bound, **harness.summary([value / bound for value in ratio["runs"]])}


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "trainer")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where every arm computes")
    args = parser.parse_args()
    work = QUICK if args.quick else GENERATION_BOUND
    shape = model_shape(args.device, args.quick)
    groups = make_groups(work)
    batch = build_train_batch(groups, [0.0] * work.samples_per_step)
    lengths = sequence_lengths(batch)
    real_tokens = sum(lengths)
    configs = {
        "packed": TrainerConfig(lr=1e-6),
        "padded": TrainerConfig(lr=1e-6, sequence_packing=False),
        "padded_whole_batch": TrainerConfig(
            lr=1e-6, sequence_packing=False, max_tokens_per_microbatch=batch.input_ids.numel()
        ),
    }
    row_tokens = configs["packed"].packed_row_tokens
    arms = {
        name: trainer_arm(shape, groups, config, real_tokens, args.device) for name, config in configs.items()
    }
    arms["plain"] = plain_arm(shape, groups, row_tokens, real_tokens, args.device)
    raw = harness.run_arms(arms, harness.repeats_for(args), harness.print_run, warmup=True)
    metric = "trained_tokens_per_s"
    ratios = {
        f"packed_over_{name}": harness.paired_ratio(raw, "packed", name, metric)
        for name in ("padded", "padded_whole_batch", "plain")
    }
    computed = {name: computed_tokens(lengths, config) for name, config in configs.items()}
    linear_bound_share = {
        f"packed_over_{name}": share_of_bound(ratios[f"packed_over_{name}"], computed[name] / real_tokens)
        for name in ("padded", "padded_whole_batch")
    }
    setup = {
        "workload": work.name,
        "device": args.device,
        "model": vars(shape),
        "params": num_parameters(shape),
        "samples": work.samples_per_step,
        "real_tokens": real_tokens,
        "padded_tokens": batch.input_ids.numel(),
        "padding_fraction": 1 - real_tokens / batch.input_ids.numel(),
        "computed_tokens": computed,
        "packed_row_tokens": row_tokens,
        "targets": {"packed_over_padded": ">= 2.0", "packed_over_plain": ">= 0.8"},
    }
    where = "on the GPU" if args.device == "cuda" else f"{torch.get_num_threads()} torch threads"
    resources = {"all_arms": f"one process, {where}, arms run one at a time"}
    extra = {"linear_bound_share": linear_bound_share}
    harness.write_result(args, "trainer", raw, ratios=ratios, resources=resources, setup=setup, extra=extra)


if __name__ == "__main__":
    main()
