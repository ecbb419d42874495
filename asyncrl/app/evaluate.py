"""``evaluate_model(config, checkpoint)``: the held-out evaluation of a model (and a checkpoint's weights) on its
own, served by one in-process engine (``asyncrl eval``)."""

from __future__ import annotations

import sys
from dataclasses import replace

from asyncrl.app.context_length import with_max_model_len
from asyncrl.config.run import RunConfig
from asyncrl.controller.evaluation import evaluate_run
from asyncrl.controller.periodic_eval import evaluate_sets
from asyncrl.data.registry import make_task
from asyncrl.engine import make_engine
from asyncrl.metrics.progress import Progress
from asyncrl.models.loading import load_configured_model
from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.rewards.service import RewardService
from asyncrl.trainer.checkpoint import resolve_resume_path, served_model


async def evaluate_model(config: RunConfig, checkpoint: str | None) -> dict[str, float]:
    """Load the model (and a checkpoint's weights), serve it on one engine and run the config's evaluation."""
    config, _ = with_max_model_len(config)  # the engine's KV pool sized to the task, as in training
    model, tokenizer = load_configured_model(config.model)
    if checkpoint:  # a verified step directory, or the newest under a run directory, as export reads it
        model = served_model(model, resolve_resume_path(checkpoint))
    engine = make_engine(model, tokenizer, config.engine)
    proxy = LLMProxy([engine], replace(config.proxy, update_policy="drain"))
    task = make_task(config.task) if config.producer == "rlvr" else None
    progress = Progress(
        config.controller.eval_prompts, label="eval", stream=sys.stderr, unit="prompt", min_interval_s=2.0
    )
    try:
        with RewardService.from_config(config.reward) as rewards:
            metrics = await evaluate_run(config, proxy, tokenizer, task, rewards, progress=progress)
            return metrics | await evaluate_sets(config, proxy, tokenizer, task, rewards, step=0)
    finally:
        progress.close()
        await proxy.aclose()
        engine.shutdown()
