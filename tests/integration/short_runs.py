"""Short in-process training runs on the embedded default and what their output directory says: the
scaffolding of the resume tests (full fine-tuning and LoRA), which stop a run, resume it and compare its
ledger with an uninterrupted one's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config

SHORT_RUN = (
    "controller.eval_prompts=0",
    "rollout.rollout_batch_size=2",
    "rollout.num_return_sequences=4",
    "rollout.max_new_tokens=12",
    "task.num_train=64",
    "task.num_eval=8",
    "trainer.checkpoint_every=1",
    "model.device=cpu",
    "metrics.trackers=[jsonl]",
)
"""Two prompts of four samples per step, a checkpoint every step, no evaluation: seconds per step."""
SYNC_EVERY_GROUP = (
    "controller.mode=sync",
    "buffer.async_ratio=0",
    # Every group trained, no redundant prompts: with redundant prompts a sync batch is whichever groups
    # finish first, so no two sync runs train the same trajectories, stopped or not.
    "rollout.filter=none",
    "rollout.max_additional_running_prompts=0",
    # Bit-equal weights across a stop (or kill) and resume are deterministic mode's contract: without it the
    # engine's log-probs depend on which requests share its decode steps, which timing decides (docs/modes.md;
    # CI failed on a kill -9 run's last bits once).
    "deterministic=true",
)


def train(out: Path, steps: int, *overrides: str, resume: bool = False) -> None:
    """Train ``steps`` steps into ``out`` (continuing its last checkpoint if ``resume``)."""
    extra = [f"resume={out}"] if resume else []
    config = load_run_config(
        None, [*SHORT_RUN, *overrides, f"controller.num_steps={steps}", f"output_dir={out}", *extra]
    )
    asyncio.run(training.train(config, console=None))


def ledger_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]


def trained(out: Path) -> list[tuple]:
    """Every trained sample as (step, prompt, sample index), in the ledger's order."""
    return [(x["step"], x["prompt"], x["sample"]) for x in ledger_lines(out) if x["event"] == "trained"]
