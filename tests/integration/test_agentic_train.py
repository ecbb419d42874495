"""``asyncrl train`` with the agentic producer: the shipped example, shrunk to a few seconds, end to end.

The default tiny-copy model plays the copy_chain env through the real engine and proxy, the trainer
trains on the whole conversations, and the run's accounting shows that no episode was lost: every one the
producer started ended exactly once, and every group the buffer admitted was trained or dropped with a reason.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from transformers import AutoTokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from asyncrl.app import train as training  # noqa: E402
from asyncrl.config.run import load_run_config  # noqa: E402
from asyncrl.controller.controller import Controller, StepRecord  # noqa: E402
from asyncrl.envs.copy_chain import plan_turns  # noqa: E402
from asyncrl.models.loading import resolve_model_path  # noqa: E402
from asyncrl.rollout.agentic_producer import AgenticProducer  # noqa: E402
from asyncrl.types import Trajectory, TrajectoryStatus  # noqa: E402

EXAMPLE = Path(training.__file__).resolve().parent.parent / "examples" / "agentic.yaml"
NUM_STEPS = 3
BATCH, GROUP = 2, 2
SMALL = (
    f"controller.num_steps={NUM_STEPS}",
    "controller.eval_prompts=2",
    f"rollout.rollout_batch_size={BATCH}",
    f"rollout.num_return_sequences={GROUP}",
    "rollout.max_new_tokens=16",
    "env.num_turns=2",
    "env_manager.num_env_groups=3",
    "env_manager.group_size=3",
    "model.device=cpu",
)


def run_example(out: Path) -> tuple[list[StepRecord], list[dict], Controller, training.TrainingSummary]:
    """Train the example shrunk by ``SMALL``; return the step records, metrics lines, controller, summary."""
    config = load_run_config(EXAMPLE, [*SMALL, f"output_dir={out}"])
    records: list[StepRecord] = []
    controllers: list[Controller] = []
    original_metrics, original_controller = training.step_metrics, training.assemble_controller

    def capturing(record: StepRecord, *args: object) -> dict[str, float]:
        records.append(record)
        return original_metrics(record, *args)

    def capturing_controller(*args: object, **kwargs: object) -> Controller:
        controllers.append(original_controller(*args, **kwargs))
        return controllers[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(training, "step_metrics", capturing)
        patch.setattr(training, "assemble_controller", capturing_controller)
        summary = asyncio.run(training.train(config, console=None))
    lines = [json.loads(line) for line in Path(summary.metrics_path).read_text().splitlines()]
    return records, lines, controllers[0], summary


def mask_runs(t: Trajectory) -> list[tuple[int, list[int]]]:
    """The trajectory as alternating runs of (loss mask value, token ids)."""
    runs: list[tuple[int, list[int]]] = []
    for token, mask in zip(t.token_ids, t.loss_mask, strict=True):
        if runs and runs[-1][0] == mask:
            runs[-1][1].append(token)
        else:
            runs.append((mask, [token]))
    return runs


def assert_conversation(t: Trajectory, tokenizer, env_config) -> None:
    """A completed 2-turn episode is: first observation (0), response (1), second observation (0), response
    (1), the observations being exactly the env's copying requests."""
    first, second = plan_turns(env_config, t.info["env_seed"])
    runs = mask_runs(t)
    assert [mask for mask, _ in runs] == [0, 1, 0, 1]
    assert tokenizer.decode(runs[0][1]) == first.prompt
    assert tokenizer.decode(runs[2][1]) == second.prompt
    assert t.num_prompt_tokens == len(runs[0][1])
    assert all(v == -1 for v, m in zip(t.versions, t.loss_mask, strict=True) if not m)


def test_agentic_example_trains_multi_turn_episodes_and_loses_none(tmp_path: Path) -> None:
    records, lines, controller, summary = run_example(tmp_path / "run")
    config = load_run_config(EXAMPLE, [*SMALL, f"output_dir={tmp_path / 'run'}"])
    assert summary.steps == NUM_STEPS
    assert [r.version for r in records] == list(range(NUM_STEPS))
    assert [line["train/version"] for line in lines] == [float(v) for v in range(1, NUM_STEPS + 1)]
    assert summary.trained_samples == NUM_STEPS * BATCH * GROUP
    assert summary.eval_before["eval/num_prompts"] == summary.eval_after["eval/num_prompts"] == 2.0

    trained = [t for r in records for g in r.groups for t in g.trajectories]
    assert all(t.status.trainable for t in trained)
    completed = [t for t in trained if t.status is TrajectoryStatus.COMPLETED]
    assert completed, "no episode completed: nothing multi-turn to check"
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny-copy"), local_files_only=True)
    for t in completed:
        assert t.info["turns"] == 2
        assert_conversation(t, tokenizer, config.env)
    for record in records:  # async ratio 1: every sample started at most one version before it was trained
        assert all(0 <= record.version - t.start_version <= 1 for g in record.groups for t in g.trajectories)

    producer = controller.producer
    assert isinstance(producer, AgenticProducer)
    ended = sum(producer.counts[s.value] for s in TrajectoryStatus)
    assert producer.counts["episodes"] == ended  # every episode started ended exactly once
    accounting = controller.buffer.accounting()
    assert accounting.num_in_flight == 0
    assert accounting.num_trained == NUM_STEPS * BATCH
    assert accounting.num_admitted == (
        accounting.num_trained + accounting.num_buffered + accounting.num_dropped_total
    )
    assert producer.counts["episodes"] == 3 * accounting.num_admitted
