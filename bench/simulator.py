"""Simulator scale benchmark: wall time of 100 simulated training steps at 256, 1,024 and 4,096 accelerators.

The workload grows with the cluster (weak scaling): a quarter of the accelerators train, the rest serve in
tensor-parallel engines of ``GPUS_PER_ENGINE`` accelerators each, and each step trains one sample per training
accelerator (see ``config_for``), so requests per step grow linearly with the cluster and ``us_per_request``
flat means wall time linear. "4,096 accelerators" is therefore 1,024 training + 192 engines × 16 serving; with
α = 2 at most (⌊α⌋ + 1) × 1,024 = 3,072 requests are admitted and untrained at once (``asyncrl.staleness``),
16 per engine on average, far below the 256 slots each engine has: the cluster size scales the simulator's
bookkeeping (engines, routing, requests), not a saturated serving load.

Each engine's cost is the tensor-parallel model of ``asyncrl.sim.cost``: ``DECODE_STEP_S`` and
``PREFILL_S_PER_TOKEN`` are one accelerator's, so a 16-way engine steps in 0.35 / 16 s plus its all-reduces
(28 layers × 2 × 30 hops × 5 µs = 8.4 ms), ≈ 0.030 s at up to ``knee_batch`` requests: the per-engine step
this benchmark used before ``gpus_per_engine`` entered the cost model, so its results stay comparable.

``simulate`` pauses Python's cyclic garbage collector during the run, as ``asyncrl simulate`` does
(``asyncrl.sim.gc_pause``; ``--gc on`` keeps it running): the simulator keeps hundreds of thousands of
objects alive and every full collection re-scans them all (``--gc on`` measures what that costs).
Reference counting still frees everything; one collection runs at the end of each run (inside the timing).
Writes bench/results/simulator.json. Run: ``python bench/simulator.py [--quick] [--steps 100] [--sizes 256,1024,4096] [--repeats 3]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/simulator.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import functools
import os
import time

from asyncrl.app.simulate import simulate
from asyncrl.config.loader import from_dict
from asyncrl.config.sim import SimConfig
from asyncrl.modes import async_ratio_for
from bench import harness

GPUS_PER_ENGINE = 16
DECODE_STEP_S = 0.35
"""One accelerator's decode step of a model that needs 16 per engine (module docstring)."""
PREFILL_S_PER_TOKEN = 1.6e-4
"""One accelerator's prefill per token: 1e-5 s per token on the 16-way engine."""
GROUP_SIZE = 8
TOTALS = ("sim_time_s", "mean_step_s", "tokens_per_s", "engine_busy_fraction", "mean_staleness")


def config_for(num_gpus: int, num_steps: int, mode: str) -> SimConfig:
    """A quarter of ``num_gpus`` trains; the rest serve in tensor-parallel engines of 16 (default all-reduce
    model: 28 layers, 5 µs per hop); num_gpus/4 samples per step."""
    num_train = num_gpus // 4
    return from_dict(
        SimConfig,
        {
            "seed": 0,
            "timeline": "none",
            "prompt_tokens": 512,
            "lengths": {"distribution": "lognormal", "mean": 2000.0, "sigma": 1.0},
            "engine": {
                "gpus_per_engine": GPUS_PER_ENGINE,
                "decode_step_s": DECODE_STEP_S,
                "knee_batch": 128,
                "max_running_requests": 256,
                "prefill_s_per_token": PREFILL_S_PER_TOKEN,
                "weight_update_s": 5.0,
            },
            "trainer": {"num_gpus": num_train, "gpu_s_per_token": 0.02, "step_overhead_s": 10.0},
            "rollout": {
                "num_engines": (num_gpus - num_train) // GPUS_PER_ENGINE,
                "rollout_batch_size": num_train // GROUP_SIZE,
                "num_return_sequences": GROUP_SIZE,
                "max_new_tokens": 16384,
            },
            "buffer": {"async_ratio": async_ratio_for(mode, 2.0)},
            "controller": {"mode": mode, "num_steps": num_steps, "wait_for_weight_sync": False},
        },
    )


def measure(num_gpus: int, num_steps: int, mode: str, pause_gc: bool) -> dict[str, float]:
    """One run: wall and CPU seconds, per-request cost, and the run's headline totals (the runs are
    deterministic, so totals agree across repeats; wall time is what the repeats are for)."""
    config = config_for(num_gpus, num_steps, mode)
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    result = simulate(config, pause_gc=pause_gc)
    wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
    num_requests = result.totals["requests"]
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "requests": num_requests,
        "us_per_request": 1e6 * wall / num_requests,
        "cpu_us_per_request": 1e6 * cpu / num_requests,
        "load_avg_1m": os.getloadavg()[0],  # other jobs share the cores: wall > cpu when high
        **{key: result.totals[key] for key in TOTALS},
    }


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "simulator")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--sizes", default="256,1024,4096")
    parser.add_argument("--mode", default="async")
    parser.add_argument("--gc", choices=("paused", "on"), default="paused")
    args = parser.parse_args()
    steps, sizes = (3, [64]) if args.quick else (args.steps, [int(size) for size in args.sizes.split(",")])
    simulate(config_for(256, 5, args.mode))  # warm-up, untimed: the first run in a process is slower
    arms = {
        f"gpus_{num_gpus}": functools.partial(measure, num_gpus, steps, args.mode, args.gc == "paused")
        for num_gpus in sizes
    }
    raw = harness.run_arms(arms, harness.repeats_for(args), harness.print_run)
    setup = {
        "steps": steps,
        "mode": args.mode,
        "gc": args.gc,
        "gpus_per_engine": GPUS_PER_ENGINE,
        "engines": {f"gpus_{n}": config_for(n, steps, args.mode).rollout.num_engines for n in sizes},
    }
    resources = {"all_arms": "one process, one thread (the simulator is single-threaded Python)"}
    harness.write_result(args, "simulator", raw, resources=resources, setup=setup)


if __name__ == "__main__":
    main()
