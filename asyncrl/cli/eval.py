"""``asyncrl eval [CONFIG] [KEY=VALUE ...] [--checkpoint DIR]``: held-out reward of a model on a task."""

from __future__ import annotations

import argparse
import json

from asyncrl.cli.args import add_config_arguments, checkpoint_run_config


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="held-out reward of a model on a task",
        description="Score model.path (or a training checkpoint's weights on top of it) on the first "
        "controller.eval_prompts prompts of task's eval split (agentic configs: as many held-out env episodes), "
        "one sample each at controller.eval_temperature, through the built-in engine: the same numbers a "
        "training run reports before and after.",
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--checkpoint",
        help="a checkpoint directory written by asyncrl train (e.g. runs/default/checkpoints/step_00000150), or "
        "a run directory (its newest verified checkpoint); "
        "without a CONFIG.yaml its run's own config (config.json) is used, overrides on top",
    )


def run(args: argparse.Namespace) -> int:
    import asyncio

    from asyncrl.app.evaluate import evaluate_model

    config = checkpoint_run_config(args, args.checkpoint)
    print(json.dumps(asyncio.run(evaluate_model(config, args.checkpoint)), indent=1))
    return 0
