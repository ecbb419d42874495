"""Control-plane cost per request: every mode at 1 k, 8 k and 64 k requests per step, with zero-cost workers.

What is measured is asyncrl's own driver — producer, buffer, controller and proxy (``MultiVersionProxy`` in
``multi_version`` mode, else ``LLMProxy``), wired by ``asyncrl.app.simulate`` as in a real run — with the
engines and trainer reduced to (near) zero cost: ``SimEngine`` steps of 1 µs, 8-token prompts and responses,
a 1 µs training step. So the wall time is the control plane's alone, and ``us_per_request`` flat from 1 k to
64 k means every per-event operation is O(1) amortised or O(log n) (no scan of every call per event).

Two clocks: ``virtual`` is the simulator's loop (time jumps to the next timer; ``asyncrl simulate``), ``real``
is asyncio's default loop, where the 1 µs timers really elapse: the cost a real run's driver pays, and its
event-loop lag (how late a 1 ms timer fires while the run is under way: ``max_lag_ms``, ``mean_lag_ms``).

A size is the requests per step (rollout_batch_size × 16 responses); α = 1 for the asynchronous modes, so up
to twice that many are admitted at once; ``peak_in_flight`` is the largest number of ``generate`` calls in
the proxy at once (held at the gate or on an engine), counted per run. Each run is a fresh forked process,
so ``peak_rss_mb`` is that run's own peak resident memory (the parent's, at fork, included; see
``rss_at_start_mb``). The cyclic garbage collector is paused during a run, as ``asyncrl simulate`` does.

Writes bench/results/control_plane.json; ratio ``<mode>_<clock>_us_per_request_64k_over_1k`` is the issue's
bound (≤ 2). Run: ``python bench/control_plane.py [--quick] [--sizes 1024,8192,65536] [--steps 1]
[--modes sync,...] [--clocks virtual,real] [--repeats 3]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/control_plane.py` puts bench/ first on sys.path: make the checkout the import root
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import asyncio
import functools
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from asyncrl.app import simulate as simulate_module
from asyncrl.config.loader import from_dict
from asyncrl.config.sim import SimConfig
from asyncrl.modes import MODES, async_ratio_for
from asyncrl.sim.clock import run_shuffled
from asyncrl.sim.gc_pause import gc_paused
from asyncrl.staleness import max_policy_age
from bench import harness

GROUP_SIZE = 16
NUM_ENGINES = 16
TOKENS = 8
"""Prompt and response length: short, so memory holds the control plane's records, not token lists."""
STEP_S = 1e-6
"""An engine step and a training step: (near) zero, on either clock."""
LAG_PROBE_S = 1e-3
"""The real loop's lag probe: a timer every millisecond, and how late it fired."""


def config_for(num_requests: int, mode: str, num_steps: int) -> SimConfig:
    """``num_requests`` per step on ``NUM_ENGINES`` zero-cost engines, each with room for all of them (the
    gate holds calls only while weights change, never for want of a slot)."""
    return from_dict(
        SimConfig,
        {
            "seed": 0,
            "timeline": "none",
            "num_prompts": 4 * num_requests // GROUP_SIZE,
            "prompt_tokens": TOKENS,
            "lengths": {"distribution": "constant", "mean": float(TOKENS)},
            "engine": {
                "decode_step_s": STEP_S,
                "knee_batch": 2 * num_requests,
                "max_running_requests": 2 * num_requests,
                "weight_update_s": STEP_S,
                "allreduce_hop_s": 0.0,
            },
            "trainer": {"num_gpus": 1, "gpu_s_per_token": 0.0, "step_overhead_s": STEP_S},
            "rollout": {
                "num_engines": NUM_ENGINES,
                "rollout_batch_size": num_requests // GROUP_SIZE,
                "num_return_sequences": GROUP_SIZE,
                "max_new_tokens": TOKENS,
            },
            "buffer": {"async_ratio": async_ratio_for(mode, 1.0)},
            "controller": {"mode": mode, "num_steps": num_steps, "wait_for_weight_sync": False},
        },
    )


class InFlight:
    """Counts the proxy's ``generate`` calls in flight (wrapping the one proxy a run makes)."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.completed = 0

    def wrap(self, make_proxy: Callable[..., Any]) -> Callable[..., Any]:
        def counted_make_proxy(*args: Any, **kwargs: Any) -> Any:
            proxy = make_proxy(*args, **kwargs)
            generate = proxy.generate

            async def counted(request: Any, observe: Any = None) -> Any:
                self.now += 1
                self.peak = max(self.peak, self.now)
                try:
                    return await generate(request, observe)
                finally:
                    self.now -= 1
                    self.completed += 1

            proxy.generate = counted
            return proxy

        return counted_make_proxy


async def _with_lag_probe(config: SimConfig, lags: list[float]) -> None:
    """The run, with a timer every ``LAG_PROBE_S`` recording how late it fires (real loop only)."""
    loop = asyncio.get_running_loop()

    async def probe() -> None:
        while True:
            due = loop.time() + LAG_PROBE_S
            await asyncio.sleep(LAG_PROBE_S)
            lags.append(loop.time() - due)

    prober = asyncio.ensure_future(probe())
    try:
        await simulate_module._run(config)
    finally:
        prober.cancel()


def run_once(config: SimConfig, clock: str) -> dict[str, float]:
    """One run in this process: wall and CPU seconds per request, peak in flight, memory, lag."""
    counter = InFlight()
    original = simulate_module.make_proxy
    simulate_module.make_proxy = counter.wrap(original)
    lags: list[float] = []
    start_rss = harness.resident_memory_mb()["rss_mb"]
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    try:
        with gc_paused(True):
            if clock == "virtual":
                run_shuffled(lambda: simulate_module._run(config), seed=None, virtual_time=True)
            else:
                asyncio.run(_with_lag_probe(config, lags))
    finally:
        simulate_module.make_proxy = original
    wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
    metrics = {
        "wall_s": wall,
        "cpu_s": cpu,
        "requests": counter.completed,
        "us_per_request": 1e6 * wall / counter.completed,
        "cpu_us_per_request": 1e6 * cpu / counter.completed,
        "peak_in_flight": counter.peak,
        "rss_at_start_mb": start_rss,
        "peak_rss_mb": harness.resident_memory_mb()["peak_rss_mb"],
        "load_avg_1m": os.getloadavg()[0],
    }
    if lags:
        metrics |= {"max_lag_ms": 1e3 * max(lags), "mean_lag_ms": 1e3 * statistics.fmean(lags)}
    return metrics


def _child(config: SimConfig, clock: str, sender: Any) -> None:
    sender.send(run_once(config, clock))
    sender.close()


def measure(num_requests: int, mode: str, clock: str, num_steps: int) -> dict[str, float]:
    """One run in a fresh forked process, so its peak memory is its own."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(config_for(num_requests, mode, num_steps), clock, sender))
    process.start()
    sender.close()
    try:
        metrics = receiver.recv()
    except EOFError:
        raise RuntimeError(f"{mode} on the {clock} loop at {num_requests} requests: the run died") from None
    finally:
        process.join()
    return metrics


def arm_name(mode: str, clock: str, num_requests: int) -> str:
    return f"{mode}_{clock}_{_size_label(num_requests)}"


def _size_label(num_requests: int) -> str:
    return f"{num_requests // 1024}k" if num_requests % 1024 == 0 else str(num_requests)


def flatness_ratios(
    raw: Mapping[str, Any], modes: list[str], clocks: list[str], sizes: list[int]
) -> dict[str, dict[str, Any]]:
    """Per mode and clock: cost per request at the largest size over the smallest (the issue's ≤ 2 bound)."""
    small, large = min(sizes), max(sizes)
    if small == large:
        return {}
    return {
        f"{mode}_{clock}_us_per_request_{_size_label(large)}_over_{_size_label(small)}": harness.paired_ratio(
            raw, arm_name(mode, clock, large), arm_name(mode, clock, small), "us_per_request"
        )
        for mode in modes
        for clock in clocks
    }


def load_averages() -> dict[str, float]:
    """The machine's 1, 5 and 15 minute load averages (what ``uptime`` prints): on a shared machine the wall
    cost per request depends on them, the CPU cost per request much less."""
    return dict(zip(("1m", "5m", "15m"), (round(load, 2) for load in os.getloadavg()), strict=True))


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "control_plane")
    parser.add_argument("--sizes", default="1024,8192,65536", help="requests per step")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--clocks", default="virtual,real")
    args = parser.parse_args()
    load_at_start = load_averages()
    sizes = [256, 1024] if args.quick else [int(size) for size in args.sizes.split(",")]
    modes, clocks = args.modes.split(","), args.clocks.split(",")
    steps = 1 if args.quick else args.steps
    arms = {
        arm_name(mode, clock, size): functools.partial(measure, size, mode, clock, steps)
        for size in sizes
        for mode in modes
        for clock in clocks
    }
    raw = harness.run_arms(arms, harness.repeats_for(args), harness.print_run)
    setup = {
        "sizes": sizes,
        "steps": steps,
        "modes": modes,
        "clocks": clocks,
        "num_engines": NUM_ENGINES,
        "group_size": GROUP_SIZE,
        "tokens": TOKENS,
        "step_s": STEP_S,
        "max_admitted": {m: (max_policy_age(async_ratio_for(m, 1.0)) + 1) for m in modes},
    }
    resources = {"all_arms": "one forked process per run, one thread (the driver is single-threaded asyncio)"}
    ratios = flatness_ratios(raw, modes, clocks, sizes)
    load = {"at_start": load_at_start, "at_end": load_averages()}
    harness.write_result(
        args, "control_plane", raw, ratios=ratios, resources=resources, setup=setup, extra={"load_avg": load}
    )


if __name__ == "__main__":
    main()
