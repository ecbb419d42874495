"""``asyncrl eval [CONFIG] [KEY=VALUE ...] [--checkpoint DIR]``: held-out reward of a model on a task."""

from __future__ import annotations

import argparse
import json

from asyncrl.cli.args import add_config_arguments, run_config_from_args


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
        help="a checkpoint directory written by asyncrl train (e.g. runs/default/checkpoints/step_00000150)",
    )


def run(args: argparse.Namespace) -> int:
    import asyncio

    config = run_config_from_args(args)
    print(json.dumps(asyncio.run(evaluate_model(config, args.checkpoint)), indent=1))
    return 0


async def evaluate_model(config, checkpoint: str | None) -> dict[str, float]:
    """Load the model (and a checkpoint's weights), serve it on one engine and run the config's evaluation."""
    from dataclasses import replace
    from pathlib import Path

    from asyncrl.controller.evaluation import evaluate_run
    from asyncrl.data.registry import make_task
    from asyncrl.engine import make_engine
    from asyncrl.models.loading import load_model_and_tokenizer
    from asyncrl.proxy.llm_proxy import LLMProxy
    from asyncrl.rewards.service import RewardService
    from asyncrl.trainer.checkpoint import MODEL_DIR, load_model_weights

    model, tokenizer = load_model_and_tokenizer(config.model.path, config.model.dtype, config.model.device)
    if checkpoint:
        load_model_weights(model, Path(checkpoint) / MODEL_DIR)
    engine = make_engine(model, tokenizer, config.engine)
    proxy = LLMProxy([engine], replace(config.proxy, update_policy="drain"))
    task = make_task(config.task) if config.producer == "rlvr" else None
    try:
        with RewardService.from_config(config.reward) as rewards:
            return await evaluate_run(config, proxy, tokenizer, task, rewards)
    finally:
        await proxy.aclose()
        engine.shutdown()
