"""Benchmark: an async training run with random faults injected, which it must survive without losing a sample.

The shipped ``tiny-count`` model trains in ``async`` mode through the real engines, proxy, buffer, controller
and trainer (``runtime.type=inline``, two engines), while a seeded schedule injects faults at random steps:
an engine killed mid-generation, an engine wedged (alive but silent: only the health probe finds it), a burst
of rewards raising, a reward hanging past its timeout (``asyncrl.testing.faults``). The run goes on until it
has trained its steps and every fault has been dealt with (the last engine replaced), and at most
``--minutes`` (it then stops after the step in progress). ``soak.json`` records:

- ``faults_injected`` and ``faults_survived`` (an engine fault survives once its replacement holds the current
  weights; a reward fault once its calls were counted as failed and the run went on); a run that crashes
  raises, and ``stopped_by_deadline`` says whether ``--minutes`` cut it short of its steps;
- ``samples_lost``: samples of groups dropped because an engine failed (their requests must be re-routed
  instead), plus any admitted group whose end the buffer did not record. Must be 0. Samples a failing reward
  marks as failed are not lost (they are dropped with their reason) and are counted apart
  (``reward_failures``);
- ``throughput_dip``: 1 − (slowest samples/s of the step an engine fault struck and the next one) / (median
  samples/s of the other steps);
- ``recovery_s``: seconds from an engine fault to its replacement holding the current weights.

Repeat i runs seed i (its own fault schedule), so the spread is across fault schedules.

    python bench/soak.py [--quick] [--repeats 3] [--minutes 10] [--out bench/results/soak.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/soak.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import asyncio
import contextlib
import itertools
import os
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from asyncrl.app.runtimes import assemble_controller, make_proxy, make_source, runtime_parts  # noqa: E402
from asyncrl.buffer.records import DropKind  # noqa: E402
from asyncrl.config.run import RunConfig, load_run_config  # noqa: E402
from asyncrl.controller.controller import StepRecord  # noqa: E402
from asyncrl.rewards.service import RewardService, make_reward_fn  # noqa: E402
from asyncrl.testing.faults import FaultyEngineFactory, FaultyReward  # noqa: E402
from bench import harness  # noqa: E402

FAULT_KINDS = ("engine_kill", "engine_wedge", "reward_raise", "reward_hang")
ENGINE_ERRORS = ("EngineFailure", "EngineReclaimed", "NoHealthyEngine", "RequestTimeout", "ProxyClosed")
"""How a group dropped because of an engine names its error (``RLVRProducer`` reasons start with it)."""
MAX_STEPS = 1_000_000
"""The controller's step budget: the injector (or the deadline) ends the run instead."""
GENERATION_WAIT_S = 30.0
"""An engine fault strikes mid-generation: at the engine's next request, or after this long regardless."""
TIMEOUT_S = 10.0
"""The health probe's and the reward's timeout: a live engine or reward waiting for the CPU on a loaded box
answers within it (2 s can pass while it waits, and a spurious replacement breaks the quick test's exact restart
count). A wedged engine is found, and a hanging reward given up, this long after the fault: part of its
recovery time."""


@dataclass(frozen=True)
class Workload:
    steps: int
    prompts_per_step: int
    samples_per_prompt: int
    max_new_tokens: int
    num_faults: int
    seed: int = 0


FULL = Workload(steps=300, prompts_per_step=8, samples_per_prompt=4, max_new_tokens=64, num_faults=16)
QUICK = Workload(steps=12, prompts_per_step=2, samples_per_prompt=2, max_new_tokens=16, num_faults=4)


def run_config(work: Workload, out: Path) -> RunConfig:
    n = work.prompts_per_step * work.samples_per_prompt
    return load_run_config(
        None,
        [
            f"output_dir={out}",
            f"controller.num_steps={work.steps}",
            "controller.mode=async",
            "controller.eval_prompts=0",
            f"rollout.rollout_batch_size={work.prompts_per_step}",
            f"rollout.num_return_sequences={work.samples_per_prompt}",
            f"rollout.max_new_tokens={work.max_new_tokens}",
            "rollout.num_engines=2",
            f"engine.max_running_requests={n}",
            "engine.max_model_len=256",
            f"engine.max_kv_tokens={n * 256}",
            "trainer.lr=1e-6",
            "model.path=tiny-count",
            "task.type=count",
            "model.device=cpu",
            f"reward.timeout_s={TIMEOUT_S}",
            "proxy.health_check_interval_s=1",
            f"proxy.health_check_timeout_s={TIMEOUT_S}",
            "runtime.type=inline",
        ],
    )


def fault_schedule(work: Workload) -> list[tuple[int, str]]:
    """(step after which to inject, kind): every kind in turn, at distinct random steps of the first three
    quarters of the run (seeded), so the run shows its recovery after each."""
    rng = random.Random(work.seed)
    kinds = [FAULT_KINDS[i % len(FAULT_KINDS)] for i in range(work.num_faults)]
    rng.shuffle(kinds)
    steps = sorted(rng.sample(range(1, max(2, 3 * work.steps // 4)), work.num_faults))
    return list(zip(steps, kinds, strict=True))


class Soak:
    """One run: the parts with faults wired in, the per-step record, and the injector."""

    def __init__(self, config: RunConfig, work: Workload, deadline_s: float) -> None:
        self.config = config
        self.work = work
        self.deadline_s = deadline_s
        self.steps: list[dict[str, float]] = []
        self.faults: list[dict[str, Any]] = []
        self.stop = asyncio.Event()
        self._step_done = asyncio.Event()
        self._scored = asyncio.Event()

    async def run(self) -> dict[str, Any]:
        with runtime_parts(self.config) as parts:
            factory = FaultyEngineFactory(parts.engine_factory, parts.engines)
            parts.engine_factory = factory
            reward = FaultyReward(make_reward_fn(self.config.reward))
            parts.rewards.close()
            parts.rewards = RewardService(reward, timeout_s=self.config.reward.timeout_s)
            parts.rewards.on_scored = lambda _: self._scored.set()
            proxy = make_proxy(parts)
            controller = assemble_controller(
                parts, proxy, make_source(self.config, parts.task), self._on_step
            )
            injector = asyncio.ensure_future(self._inject(factory, reward, parts.rewards))
            deadline = asyncio.get_running_loop().call_later(self.deadline_s, self.stop.set)
            try:
                done = await controller.run(MAX_STEPS, stop=self.stop)
            finally:
                deadline.cancel()
                injector.cancel()
                await asyncio.gather(injector, return_exceptions=True)
                reward.release()
            drops = controller.buffer.take_dropped()
            accounting = controller.buffer.accounting()
            stats = proxy.stats()
            await proxy.aclose()
            reward_counts = dict(parts.rewards.counts)
        return {
            "steps_done": done,
            "drops": drops,
            "accounting": accounting,
            "proxy": stats,
            "reward_counts": reward_counts,
        }

    def _on_step(self, record: StepRecord) -> None:
        samples = sum(len(g) for g in record.groups)
        step_s = record.wait_s + record.train_s + record.sync_s
        self.steps.append({"step": record.step, "samples": samples, "samples_per_s": samples / step_s})
        self._step_done.set()

    async def _inject(
        self, factory: FaultyEngineFactory, reward: FaultyReward, service: RewardService
    ) -> None:
        rng = random.Random(self.work.seed + 1)
        for step, kind in fault_schedule(self.work):
            while len(self.steps) < step:
                self._step_done.clear()
                await self._step_done.wait()
            fault: dict[str, Any] = {"kind": kind, "after_step": step, "survived": False}
            self.faults.append(fault)
            if kind == "reward_raise":
                await self._fault_reward(
                    service, "failed", self.work.samples_per_prompt, reward.raise_next, fault
                )
            elif kind == "reward_hang":
                await self._fault_reward(service, "timed_out", 1, reward.hang_next, fault)
            else:
                await self._fault_engine(factory, rng.choice(sorted(factory.live)), kind, fault)
        while len(self.steps) < self.work.steps:
            self._step_done.clear()
            await self._step_done.wait()
        self.stop.set()

    async def _fault_reward(
        self, service: RewardService, counter: str, count: int, inject: Any, fault: dict[str, Any]
    ) -> None:
        """Make the next ``count`` reward calls fail; survived once the service has counted them as failed (the
        run went on past them: their samples were marked, not stuck)."""
        target = service.counts[counter] + count
        inject(count)
        while service.counts[counter] < target:
            self._scored.clear()
            await self._scored.wait()
        fault["survived"] = True

    async def _fault_engine(self, factory: FaultyEngineFactory, index: int, kind: str, fault: dict) -> None:
        engine = factory.live[index]
        engine.generating.clear()
        with contextlib.suppress(TimeoutError):  # an idle engine is faulted anyway
            await asyncio.wait_for(engine.generating.wait(), GENERATION_WAIT_S)
        factory.replaced[index].clear()
        injected = time.perf_counter()
        if kind == "engine_kill":
            engine.kill()
        else:
            engine.wedge()
        fault.update(engine=index, step_at_fault=len(self.steps))
        await factory.replaced[index].wait()
        await factory.live[index].updated.wait()  # faults come after step 1: there is an update to receive
        fault.update(survived=True, recovery_s=time.perf_counter() - injected)


def samples_lost(result: dict[str, Any], group_size: int) -> int:
    """Samples of groups dropped because an engine failed, plus admitted groups with no recorded end."""
    by_engine = sum(
        group_size
        for drop in result["drops"]
        if drop.kind is DropKind.FAILED and drop.reason.startswith(ENGINE_ERRORS)
    )
    unaccounted = (
        0 if result["accounting"].is_balanced else group_size * abs(_imbalance(result["accounting"]))
    )
    return by_engine + unaccounted


def _imbalance(accounting: Any) -> int:
    ended = accounting.num_trained + sum(accounting.num_dropped.values())
    return accounting.num_admitted - ended - accounting.num_in_flight - accounting.num_buffered


def throughput_dip(steps: list[dict[str, float]], faults: list[dict[str, Any]]) -> float:
    """1 − slowest samples/s of the two steps after each engine fault over the median of the other steps."""
    hit = {f["step_at_fault"] + k for f in faults if "step_at_fault" in f for k in (1, 2)}
    after = [s["samples_per_s"] for s in steps if s["step"] in hit]
    others = [s["samples_per_s"] for s in steps if s["step"] not in hit]
    if not after or not others:
        return 0.0
    return max(0.0, 1.0 - min(after) / statistics.median(others))


def soak_once(work: Workload, deadline_s: float) -> tuple[dict[str, float], dict[str, Any]]:
    """One soak run: its headline metrics (for the harness) and the per-fault and per-step detail."""
    with tempfile.TemporaryDirectory() as out:
        soak = Soak(run_config(work, Path(out)), work, deadline_s)
        result = asyncio.run(soak.run())
    recoveries = [f["recovery_s"] for f in soak.faults if "recovery_s" in f]
    # A run that crashed raises out of ``soak.run``; one the deadline stopped early still counts what it survived.
    every_step_recorded = result["steps_done"] == len(soak.steps)
    metrics = {
        "steps": float(result["steps_done"]),
        "faults_injected": float(len(soak.faults)),
        "faults_survived": float(sum(f["survived"] for f in soak.faults) if every_step_recorded else 0),
        "stopped_by_deadline": float(result["steps_done"] < work.steps),
        "samples_lost": float(samples_lost(result, work.samples_per_prompt)),
        "reward_failures": float(result["reward_counts"]["failed"] + result["reward_counts"]["timed_out"]),
        "engine_restarts": float(result["proxy"].get("num_engine_restarts", 0)),
        "throughput_dip": throughput_dip(soak.steps, soak.faults),
        "recovery_s_max": max(recoveries, default=0.0),
        "recovery_s_median": statistics.median(recoveries) if recoveries else 0.0,
        "samples_per_s_median": statistics.median(s["samples_per_s"] for s in soak.steps),
    }
    return metrics, {"faults": soak.faults, "steps": soak.steps}


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "soak")
    parser.add_argument(
        "--minutes", type=float, default=10.0, help="per repeat: stop after the step in progress then"
    )
    args = parser.parse_args()
    base = QUICK if args.quick else FULL
    deadline_s = 120.0 if args.quick else 60.0 * args.minutes
    details: list[dict[str, Any]] = []
    seeds = itertools.count()

    def one_seed() -> dict[str, float]:
        """Repeat i runs seed i: its own fault schedule and kinds, so the repeats are three different soaks."""
        seed = next(seeds)
        metrics, detail = soak_once(replace(base, seed=seed), deadline_s)
        details.append({"seed": seed, **detail})
        return metrics

    raw = harness.run_arms({"soak": one_seed}, harness.repeats_for(args), harness.print_run)
    harness.write_result(
        args,
        "soak",
        raw,
        resources={"soak": {"runtime": "inline", "engines": 2, "torch_threads": "the process's"}},
        setup={**asdict(base), "seed": "repeat i runs seed i", "deadline_s": deadline_s},
        extra={"runs": details},
    )


if __name__ == "__main__":
    main()
