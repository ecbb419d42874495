"""``deterministic: true``: a sync run and its kill/resume twin end bit-equal whatever the kill schedule, and so
do sync and the α = 0 runs of the async modes.

Several requests share each of the engine's decode steps, so its log-probs depend on which requests share
them, which depends on timing: without the switch such twins end with weights differing in the last bits
(issue 31 measured 4.7e-6 after a kill schedule). With it the loss never reads the engine's log-probs of
current-version tokens, and the trajectories are the same token for token (each request is seeded by its
prompt and sample).

Each kill schedule is drawn from a seed: ``ASYNCRL_KILL_SEED`` replays one, else each test draws a fresh one
and prints it (pytest shows it with a failure, and every assertion names it). The subprocess runs with SIGKILLs
at random moments (generation, training, weight sync, a checkpoint write) are ``slow``; the default suite runs
the same equalities in process, cheaper by the start-ups: a stop at a random step and a resume whose engine
runs another number of requests at once (a random one: what a kill changes), which without the switch ends
with other weights (a slow control test shows it).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_kill_resume import RUN, ledger, run_to_completion, run_with_kills

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config

SYNC = ("controller.mode=sync", "buffer.async_ratio=0")
KILLED_STEPS = 10
KILLED = (
    "deterministic=true",
    f"controller.num_steps={KILLED_STEPS}",
    "rollout.rollout_batch_size=8",
    "rollout.num_return_sequences=4",
    "rollout.max_new_tokens=24",
    "task.num_train=400",
    "rollout.filter=none",
    "rollout.max_additional_running_prompts=0",
)
"""The subprocess runs: 8 prompts x 4 samples in flight at once, 10 steps."""
IN_PROCESS_STEPS = 3
IN_PROCESS = (
    "deterministic=true",
    f"controller.num_steps={IN_PROCESS_STEPS}",
    "rollout.rollout_batch_size=4",
    "rollout.num_return_sequences=4",
    "rollout.max_new_tokens=12",
    "task.num_train=200",
    "rollout.filter=none",
    "rollout.max_additional_running_prompts=0",
    "metrics.trackers=[jsonl]",
)
"""The default suite's runs: 4 prompts x 4 samples, 3 steps (a stop after step 1 or 2)."""


def schedule_seed() -> int:
    """The seed of a kill (or stop) schedule: ``ASYNCRL_KILL_SEED`` if set, else a fresh one, printed."""
    seed = int(os.environ.get("ASYNCRL_KILL_SEED") or random.SystemRandom().randrange(2**31))
    print(f"kill schedule seed {seed} (replay: ASYNCRL_KILL_SEED={seed})")
    return seed


def final_weights(out: Path, steps: int) -> dict[str, torch.Tensor]:
    """The step's exported weights: one file, or one per gathered bucket (a sharded trainer's export)."""
    model = out / "checkpoints" / f"step_{steps:08d}" / "model"
    weights: dict[str, torch.Tensor] = {}
    for file in sorted(model.glob("*.safetensors")):
        weights |= load_file(file)
    assert weights, f"no weights exported in {model}"
    return weights


def assert_same_run(out: Path, reference: Path, steps: int, samples: int, why: str) -> None:
    """The same trajectories trained at the same steps (with their rewards and versions), and bit-equal final
    weights; ``why`` names the run (and its schedule's seed) in every failure."""
    trained, want = ledger(out, "trained"), ledger(reference, "trained")
    assert [line["step"] for line in want] == [s for s in range(1, steps + 1) for _ in range(samples)], why
    assert trained == want, f"{why}: the trained trajectories differ"
    got, expected = final_weights(out, steps), final_weights(reference, steps)
    assert got.keys() == expected.keys(), why
    differing = [name for name in expected if not torch.equal(got[name], expected[name])]
    assert not differing, f"{why}: final weights differ in {differing}"


def train_in_process(out: Path, steps: int, *overrides: str, resume: bool = False) -> None:
    extra = [f"resume={out}"] if resume else []
    config = load_run_config(
        None, [*RUN, *IN_PROCESS, *overrides, f"controller.num_steps={steps}", f"output_dir={out}", *extra]
    )
    asyncio.run(training.train(config, console=None))


@pytest.fixture(scope="module")
def in_process_sync(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("determinism") / "sync"
    train_in_process(out, IN_PROCESS_STEPS, *SYNC)
    return out


def stopped_and_resumed(out: Path, seed: int, *overrides: str) -> str:
    """A sync run stopped after a random step and resumed with a random engine batch limit (so its engine's
    decode steps hold other sets of requests, as after a kill they would); returns what was drawn."""
    rng = random.Random(seed)
    stop, occupancy = rng.randint(1, IN_PROCESS_STEPS - 1), rng.choice([2, 3, 5])
    train_in_process(out, stop, *SYNC, *overrides)
    limit = f"engine.max_running_requests={occupancy}"
    train_in_process(out, IN_PROCESS_STEPS, *SYNC, *overrides, limit, resume=True)
    return f"stopped after step {stop}, resumed with {limit} (seed {seed})"


def test_a_deterministic_sync_run_stopped_and_resumed_at_another_occupancy_ends_bit_equal(
    tmp_path, in_process_sync
):
    out = tmp_path / "stopped"
    why = stopped_and_resumed(out, schedule_seed())
    assert_same_run(out, in_process_sync, IN_PROCESS_STEPS, 16, why)


@pytest.mark.slow
def test_without_the_switch_the_same_resume_ends_with_other_weights(tmp_path):
    """The control: the engine's log-probs do depend on its batches, so the equality above is the switch's."""
    seed = schedule_seed()
    train_in_process(tmp_path / "whole", IN_PROCESS_STEPS, *SYNC, "deterministic=false")
    why = stopped_and_resumed(tmp_path / "stopped", seed, "deterministic=false")
    assert ledger(tmp_path / "stopped", "trained") == ledger(tmp_path / "whole", "trained"), why
    got, expected = (
        final_weights(tmp_path / "stopped", IN_PROCESS_STEPS),
        final_weights(tmp_path / "whole", IN_PROCESS_STEPS),
    )
    assert any(not torch.equal(got[name], expected[name]) for name in expected), f"{why}: no difference"


def test_async_at_alpha_zero_trains_exactly_what_sync_trains(tmp_path, in_process_sync):
    out = tmp_path / "async"
    train_in_process(out, IN_PROCESS_STEPS, "controller.mode=async", "buffer.async_ratio=0")
    assert_same_run(out, in_process_sync, IN_PROCESS_STEPS, 16, "async at α = 0")


@pytest.fixture(scope="module")
def killed_sync_reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("determinism") / "sync"
    run_to_completion(out, *KILLED, *SYNC)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("schedule", [1, 2])
def test_a_deterministic_sync_run_killed_at_random_moments_ends_bit_equal(
    tmp_path, killed_sync_reference, schedule
):
    """Slow: a 10-step reference and a run of four lives, each SIGKILLed 0-0.5 s after its first trained step (so
    in any phase of a step, at any of several steps), per schedule; ~2-3 min of CPU on a busy 2-core machine."""
    seed = schedule_seed()
    out = tmp_path / "killed"
    hits = run_with_kills(out, *KILLED, *SYNC, num_kills=4, seed=seed, max_delay_s=0.5)
    why = f"schedule {schedule}, seed {seed}, {hits} kills of a resumed life"
    assert hits >= 2, f"{why}: too few kills landed in a live, resumed run"
    assert_same_run(out, killed_sync_reference, KILLED_STEPS, 32, why)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["async", "partial_rollout", "multi_version"])
def test_alpha_zero_trains_exactly_what_sync_trains(tmp_path, killed_sync_reference, mode):
    """Every mode that has an α = 0 (``one_step_off`` is α = 1 by definition: its α = 0 is sync itself), as
    its own process, with sync's placement (``runtime.colocate: auto`` colocates any mode at α = 0)."""
    out = tmp_path / mode
    run_to_completion(out, *KILLED, f"controller.mode={mode}", "buffer.async_ratio=0")
    assert_same_run(out, killed_sync_reference, KILLED_STEPS, 32, f"{mode} at α = 0")
    placement = json.loads((out / "placement.json").read_text())
    reference = json.loads((killed_sync_reference / "placement.json").read_text())
    assert placement == {**reference, "pid": placement["pid"]}
