"""``asyncrl calibrate``: measure this machine's device for the cost model (``asyncrl.sim.probe``)."""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="measure the device for the cost model: GEMM, bandwidth, decode, prefill, training",
        description="Time matrix products, memory and host-link bandwidth, and for Qwen3-shaped models with "
        "random weights (0.6B, 1.7B, 4B, 8B by default) decode steps over batch and KV length (the built-in "
        "engine's runner, and a static-KV loop under CUDA graphs), whole engine steps, prefill and packed "
        "training. Writes every repeat as JSON after each section; what was not measured is listed with why.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out", default="runs/calibrate/probe.json", help="JSON file to write")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if present, else cpu)")
    parser.add_argument(
        "--models",
        default="qwen3-0.6b,qwen3-1.7b,qwen3-4b,qwen3-8b",
        help="comma-separated named dense shapes to measure (see asyncrl.sim.model_shape)",
    )
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting sections after this")
    parser.add_argument(
        "--quick", action="store_true", help="tiny shapes and grids: a check of the kit that runs on a CPU"
    )
    parser.add_argument(
        "--fit",
        metavar="PROBE.json",
        help="measure nothing: fit a hardware profile (ceilings and efficiencies) from a probe and write it to "
        "--out (asyncrl simulate hardware=FILE reads it)",
    )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    if args.fit:
        from asyncrl.sim.hardware import read_profile, write_profile

        profile = read_profile(args.fit)
        write_profile(profile, args.out)
        print(f"profile {profile.name} written to {args.out}: {profile.efficiency}")
        return 0

    import torch

    from asyncrl.sim.probe import gpu_plan, quick_plan, run_probe

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    plan = quick_plan() if args.quick else gpu_plan(tuple(name.strip() for name in args.models.split(",")))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"command": " ".join(["asyncrl", *sys.argv[1:]]), "commit": _commit(), "budget_s": args.budget_s}
    log = run_probe(
        plan,
        device=device,
        budget_s=args.budget_s,
        out=out,
        say=lambda line: print(line, flush=True),
        meta=meta,
    )
    print(f"probe written to {out} in {log.meta['wall_s']} s; not measured: {len(log.not_measured)}")
    for line in log.not_measured:
        print(f"  not measured: {line}", file=sys.stderr)
    return 0


def _commit() -> str | None:
    """The checkout's commit (``ASYNCRL_COMMIT`` where the tree travelled without its git folder)."""
    import os
    import subprocess

    if os.environ.get("ASYNCRL_COMMIT"):
        return os.environ["ASYNCRL_COMMIT"]
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
