"""``asyncrl plan``: mode, async ratio and train/infer split for a model on a cluster, chosen by simulation."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from asyncrl.cli.args import add_config_arguments, split_config_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="recommend mode, async ratio and train/infer split by simulation",
        description="Simulate candidate schedules of one workload on a cluster of --gpus accelerators, with "
        "every engine and trainer cost derived from model= and hardware= (asyncrl.sim.derive): colocated sync "
        "on all GPUs, partial rollout at alpha 2 on train shares of 1/8 to 7/8 and at Proposition 2's beta*, "
        "then one_step_off, async and partial rollout at each --alphas on the best split. A layout whose memory "
        "plan (asyncrl doctor's, per role and shared GPU, and each node's host RAM; trainer settings from memory.* or "
        "memory.train_config) does not fit the hardware is dropped and listed with its largest term. Prints the "
        "recommendation (the least stale schedule within --tolerance of the best steady-state throughput) "
        "with its step time, speedup over colocated sync and staleness, the runner-up and why it lost, the "
        "engine it simulated and planned as asyncrl train keys, and "
        "writes OUT/plan.json (OUT: the output_dir key). The workload (lengths, batch, prompt tokens) is the "
        "config's, or a real run's with --from-run. Example: asyncrl plan model=qwen3-8b hardware=h800 "
        "lengths.mean=11000 rollout.max_new_tokens=30720 rollout.rollout_batch_size=256 "
        "rollout.num_return_sequences=16 --gpus 64",
    )
    add_config_arguments(parser)
    parser.add_argument("--gpus", type=int, required=True, help="accelerators in the cluster (train + infer)")
    parser.add_argument(
        "--host-gb",
        type=float,
        help="host RAM per node to plan the memory check for, in GB (default: the hardware profile's; 2000 for "
        "the named ones, a DGX node's), as asyncrl doctor --host-gb",
    )
    parser.add_argument("--alphas", default="1,2,4", help="async ratios to try on the best split")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.02,
        help="throughput within this fraction of the best counts as equal; the least stale of those wins",
    )
    parser.add_argument(
        "--from-run",
        metavar="RUN_DIR",
        help="take the workload from a real run's output_dir: batch shape, longest response (config.json) and "
        "lognormal lengths matching its responses' mean, p50 and p99 (metrics.jsonl); overrides still win",
    )


def run(args: argparse.Namespace) -> int:
    from asyncrl.app.planner import Planner, why_lost, workload_from_run
    from asyncrl.sim.trained import trained_parts

    path, overrides = split_config_args(args.config_args)
    if args.from_run:
        overrides = [*workload_from_run(args.from_run), *overrides]
    alphas = [float(a) for a in args.alphas.split(",") if a.strip()]
    planner = Planner(path, overrides, args.gpus, args.host_gb)
    host = f", {planner.memory.hardware.host_bytes / 1e9:g} GB of host RAM per node" if planner.memory else ""
    print(
        f"planning {planner.base.model} on {args.gpus} x {planner.base.hardware}{host}: about a dozen "
        "simulations"
    )
    parts = trained_parts(planner.base)
    if parts.critic == "separate":  # say which shape its memory and time are costed at
        copy = "the policy's shape (a copy of the policy: no critic.model_path or memory.critic_model)"
        print(f"separate critic costed at {parts.critic_shape.source if parts.critic_shape else copy}")
    result = planner.search(alphas, args.tolerance)
    gpus = args.gpus
    print(f"{'candidate':<40} {'step_s':>9} {'samples/s':>10} {'speedup':>8} {'staleness':>9} {'engines':>8}")
    for outcome in result.outcomes:
        print(
            f"{outcome.candidate.label(gpus):<40} {outcome.step_s:>9.1f} {outcome.samples_per_s:>10.3g} "
            f"{result.speedup(outcome):>7.2f}x {outcome.mean_staleness:>9.2f} {outcome.engine_busy:>8.0%}"
        )
    for candidate, drop in result.dropped:
        print(f"dropped for memory: {candidate.label(gpus)}: {drop.text(result.hardware)}")
    best, second, prop = result.recommended, result.runner_up, result.proposition
    print(
        f"recommended: {best.candidate.label(gpus)}: {best.step_s:.1f} s per step, "
        f"{result.speedup(best):.2f}x colocated sync ({result.baseline.step_s:.1f} s), "
        f"mean staleness {best.mean_staleness:.2f}"
    )
    if second is None:
        alone = "colocated sync only" if gpus < 2 * planner.gpus_per_engine else "no other layout that fits"
        print(f"runner-up: none: {gpus} accelerator(s) hold {alone}")
    else:
        print(f"runner-up: {second.candidate.label(gpus)}: {why_lost(best, second, gpus)}")
    if prop is not None:
        print(
            f"Proposition 2 (alpha 2): beta* = {prop.beta:.2f} -> {prop.num_train_workers} train GPUs; "
            f"bound speedup <= {prop.speedup_bound:.2f}x"
        )
    print(f"multi_version: {result.mode_verdict('multi_version')}")
    print(f"placement: {result.placement_text(best.candidate)}")
    print(f"engine: {' '.join(result.engine)}")
    if not all(o.converged for o in result.outcomes):
        print("note: some candidates hit the step cap before their step time settled (controller.num_steps)")
    out = Path(planner.base.output_dir) / "plan.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result.to_json(), indent=1))
    print(f"written: {out}")
    return 0
