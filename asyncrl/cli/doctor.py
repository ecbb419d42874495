"""``asyncrl doctor [CONFIG] [KEY=VALUE ...]``: what this machine can run for a config, before a long run."""

from __future__ import annotations

import argparse

from asyncrl.cli.args import add_config_arguments, names_no_config_file, run_config_from_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check this machine against a run config",
        description="Check devices and memory, the model (cached? its size against memory, the KV slots that "
        "fit), the task, disk for checkpoints, Ray, the vLLM environment and bubblewrap for CONFIG (without "
        "one, the default example). One OK / WARN / FAIL line each, with the fix; exit status 1 on a FAIL. "
        "Loads no weights.",
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--hardware",
        help="plan for this hardware instead of checking this machine: h100, h200 (any asyncrl.sim profile), "
        'a JSON object such as \'{"name": "l40s", "memory_gb": 48}\', or a JSON file; prints GB per GPU '
        "for every role and every device the roles share, and each node's host RAM",
    )
    parser.add_argument("--gpus", type=int, help="GPUs to plan for with --hardware (default: one node's)")
    parser.add_argument(
        "--host-gb",
        type=float,
        help="host RAM per node to plan for with --hardware, in GB (default: the profile's; 2000 for the named "
        "ones, a DGX node's)",
    )
    parser.add_argument(
        "--shape",
        help="size the model by this shape instead of its config.json: a name of the simulator's shape table "
        "(qwen3-1.7b, qwen3-8b, ...) or a path to a config.json",
    )


def run(args: argparse.Namespace) -> int:
    from asyncrl.app.doctor import Status, diagnose
    from asyncrl.cli.train import DEFAULT_EXAMPLE

    if names_no_config_file(args.config_args):  # as train: overrides apply to the default
        args.config_args = [str(DEFAULT_EXAMPLE), *args.config_args]
    hardware = shape = None
    if args.hardware:
        from asyncrl.app.memory_plan import hardware_named

        hardware = hardware_named(args.hardware, args.gpus, args.host_gb)
    elif args.gpus is not None or args.host_gb is not None:
        raise ValueError("--gpus and --host-gb plan with --hardware: name the hardware too")
    if args.shape:
        from asyncrl.sim.model_shape import resolve_shape

        shape = resolve_shape(args.shape)
    findings = diagnose(run_config_from_args(args), hardware=hardware, shape=shape)
    for finding in findings:
        print(finding.line(), flush=True)
    failed = sum(f.status is Status.FAIL for f in findings)
    warned = sum(f.status is Status.WARN for f in findings)
    print(f"\n{failed} FAIL, {warned} WARN, {len(findings) - failed - warned} OK")
    return 1 if failed else 0
