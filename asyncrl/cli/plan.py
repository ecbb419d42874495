"""``asyncrl plan``: the rollout/train split β* and bound of Proposition 2, checked by simulation."""

from __future__ import annotations

import argparse

MEAN_TOKENS = 100
"""Tokens of a mean response in the checking simulation (one decode step = μ_gen / MEAN_TOKENS)."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="recommend the train/rollout split and async ratio",
        description="Proposition 2 of the ROLL Flash report: beta* = E*N*mu_train / (N*mu_gen + K*L_gen/(alpha+1) "
        "+ E*N*mu_train) and the bounds N/K*(mu_gen + E*mu_train) + L_gen (sync) and ... + L_gen/(alpha+1) "
        "(async at beta*); then a simulation of both placements with those per-sample times checks them.",
    )
    parser.add_argument("--mu-gen", type=float, required=True, help="mean generation time of one sample (s)")
    parser.add_argument(
        "--l-gen", type=float, required=True, help="longest generation time of one sample (s)"
    )
    parser.add_argument(
        "--mu-train", type=float, required=True, help="training time of one sample on one worker (s)"
    )
    parser.add_argument("--E", type=int, default=1, dest="epochs", help="times each sample is trained on")
    parser.add_argument("--K", type=int, required=True, dest="workers", help="workers (accelerators) in all")
    parser.add_argument("--N", type=int, required=True, dest="samples", help="samples per training step")
    parser.add_argument("--alpha", type=float, default=2.0, help="async ratio (default 2)")
    parser.add_argument("--steps", type=int, default=10, help="simulated steps per check (0: no simulation)")


def run(args: argparse.Namespace) -> int:
    from asyncrl.sim.plan import recommend

    p = recommend(args.samples, args.workers, args.mu_gen, args.l_gen, args.mu_train, args.epochs, args.alpha)
    print(
        f"beta* = {p.beta:.3f}: {p.num_train_workers} workers train, {p.num_rollout_workers} generate "
        f"(alpha = {p.alpha:g})"
    )
    print(
        f"bound per step: sync {p.sync_bound_s:.2f} s, async {p.async_bound_s:.2f} s "
        f"(speedup <= {p.speedup_bound:.2f}x)"
    )
    if args.steps:
        sync_s, async_s = check_by_simulation(args, p.num_train_workers)
        print(
            f"simulated mean step: sync {sync_s:.2f} s, async {async_s:.2f} s (speedup {sync_s / async_s:.2f}x)"
        )
    return 0


def check_by_simulation(args: argparse.Namespace, num_train: int) -> tuple[float, float]:
    """Mean step time of the colocated sync placement and of the split async one, simulated."""
    from asyncrl.app.simulate import simulate

    sync = simulate(plan_config(args, args.workers, None, "sync"))
    split = simulate(plan_config(args, args.workers - num_train, num_train, "partial_rollout"))
    return sync.totals["mean_step_s"], split.totals["mean_step_s"]


def plan_config(args: argparse.Namespace, rollout_workers: int, train_workers: int | None, mode: str):
    """One engine whose ``rollout_workers`` slots are the generating workers (queue scheduling), lengths
    lognormal with mean μ_gen and at most L_gen, a trainer at μ_train per sample per worker.

    The slots stand for independent single-accelerator workers fed from one queue, not a tensor-parallel
    group: ``gpus_per_engine`` stays 1 (it would split each step's compute). The sync placement
    (``train_workers`` None) trains on the same ``rollout_workers`` workers, given as the trainer's count."""
    from asyncrl.config.loader import from_dict
    from asyncrl.config.sim import SimConfig
    from asyncrl.modes import async_ratio_for

    max_tokens = max(MEAN_TOKENS, round(MEAN_TOKENS * args.l_gen / args.mu_gen))
    trainer = {
        "num_gpus": train_workers or rollout_workers,
        "epochs": args.epochs,
        "gpu_s_per_token": args.mu_train / (MEAN_TOKENS + 1),
        "step_overhead_s": 0.0,
    }
    return from_dict(
        SimConfig,
        {
            "prompt_tokens": 1,
            "timeline": "none",
            "lengths": {"distribution": "lognormal", "mean": float(MEAN_TOKENS), "sigma": 1.0},
            "engine": {
                "max_running_requests": rollout_workers,
                "knee_batch": rollout_workers,
                "decode_step_s": args.mu_gen / MEAN_TOKENS,
                "weight_update_s": 0.0,
            },
            "trainer": trainer,
            "rollout": {
                "num_engines": 1,
                "rollout_batch_size": args.samples,
                "num_return_sequences": 1,
                "max_new_tokens": max_tokens,
            },
            "buffer": {"async_ratio": async_ratio_for(mode, args.alpha)},
            "controller": {"mode": mode, "num_steps": args.steps, "wait_for_weight_sync": False},
        },
    )
