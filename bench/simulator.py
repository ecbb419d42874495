"""Simulator scale benchmark: wall time of 100 simulated training steps at 256, 1,024 and 4,096 accelerators.

The workload grows with the cluster (weak scaling): a quarter of the accelerators train, the rest serve in
engines of ``GPUS_PER_ENGINE``, and each step trains one sample per training accelerator (see ``config_for``),
so requests per step grow linearly with the cluster and ``us_per_request`` flat means wall time linear.

``simulate`` pauses Python's cyclic garbage collector during the run, as ``asyncrl simulate`` does
(``asyncrl.sim.gc_pause``; ``--gc on`` keeps it running): the simulator keeps hundreds of thousands of
objects alive and every full collection re-scans them all (70 s instead of 42 s at 4,096 accelerators).
Reference counting still frees everything; one collection runs at the end of each run (inside the timing).
Writes bench/results/simulator.json. Run: ``python bench/simulator.py [--steps 100] [--sizes 256,1024,4096] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from asyncrl.app.simulate import simulate
from asyncrl.config.loader import from_dict
from asyncrl.config.sim import SimConfig
from asyncrl.controller.modes import async_ratio_for

GPUS_PER_ENGINE = 16
GROUP_SIZE = 8
TOTALS = ("sim_time_s", "mean_step_s", "tokens_per_s", "engine_busy_fraction", "mean_staleness")


def config_for(num_gpus: int, num_steps: int, mode: str) -> SimConfig:
    """A quarter of ``num_gpus`` trains; the rest serve in engines of 16; num_gpus/4 samples per step."""
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
                "decode_step_s": 0.03,
                "knee_batch": 128,
                "max_running_requests": 256,
                "prefill_s_per_token": 1e-5,
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


def measure(num_gpus: int, num_steps: int, mode: str, pause_gc: bool, repeats: int) -> dict[str, Any]:
    """``repeats`` identical runs: the median wall and CPU seconds (every wall time is kept too: this
    machine's speed drifts by tens of per cent from one minute to the next), per-request cost, and the
    run's headline totals (the runs are deterministic, so their totals agree)."""
    config = config_for(num_gpus, num_steps, mode)
    walls, cpus, loads = [], [], []
    for _ in range(repeats):
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        result = simulate(config, pause_gc=pause_gc)
        walls.append(time.perf_counter() - wall_start)
        cpus.append(time.process_time() - cpu_start)
        loads.append(os.getloadavg()[0])
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    num_requests = result.totals["requests"]
    return {
        "load_avg_1m": round(max(loads), 2),  # other jobs share the cores: wall > cpu when high
        "num_gpus": num_gpus,
        "num_engines": config.rollout.num_engines,
        "wall_s": round(wall, 2),
        "wall_s_runs": [round(w, 2) for w in walls],
        "cpu_s": round(cpu, 2),
        "requests": num_requests,
        "us_per_request": round(1e6 * wall / num_requests, 1),
        "cpu_us_per_request": round(1e6 * cpu / num_requests, 1),
        **{key: round(result.totals[key], 3) for key in TOTALS},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--sizes", default="256,1024,4096")
    parser.add_argument("--mode", default="async")
    parser.add_argument("--gc", choices=("paused", "on"), default="paused")
    parser.add_argument("--repeats", type=int, default=3, help="runs per size; the median is reported")
    parser.add_argument("--out", default="bench/results/simulator.json")
    args = parser.parse_args()
    rows = []
    simulate(config_for(256, 5, args.mode))  # warm-up, untimed: the first run in a process is slower
    for num_gpus in [int(size) for size in args.sizes.split(",")]:
        rows.append(measure(num_gpus, args.steps, args.mode, args.gc == "paused", args.repeats))
        print(json.dumps(rows[-1]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    machine = platform.processor() or platform.machine()
    summary = {
        "machine": machine,
        "steps": args.steps,
        "mode": args.mode,
        "gc": args.gc,
        "repeats": args.repeats,
        "runs": rows,
    }
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
