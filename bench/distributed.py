"""Benchmark: the sharded trainer's throughput at 1 vs 2 ranks, and weight-sync time vs model size by transport.

Arms, interleaved and repeated (bench/harness.py):

- ``train_1rank`` / ``train_2ranks``: trained tokens/s of ``Trainer.train_step`` on the generation-bound
  workload's batch, at equal total cores: one process with every core's threads, or two FSDP2 ranks (gloo)
  with one thread each. A warm-up step is untimed; each repeat times ``--steps`` steps.
- ``sync_<size>``: for each model size, one publish of the whole model the way the Ray runtime does it,
  split into its parts: ``gather_pack_s`` (2 ranks all-gather parameter by parameter and rank 0 packs flat
  buckets), ``object_store_s`` (rank 0 ``ray.put``s each bucket and an engine actor in another process reads
  them zero-copy and copies them into a model-sized buffer) and ``gloo_broadcast_s`` (the same buckets
  broadcast from rank 0 to a second process over a gloo group instead, for comparison).

The simulator's weight-sync cost is checked against these figures: ``setup.cost_model_check`` holds the measured
seconds per GB per transport beside the simulator's constant ``sim.engine.weight_update_s``.

    python bench/distributed.py [--quick] [--repeats 3] [--out bench/results/distributed.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/distributed.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import os
import time
from collections.abc import Callable

import torch

from asyncrl.config.runtime import RuntimeConfig
from asyncrl.runtime.ray_runtime import ray_session
from asyncrl.testing.ranks import run_ranks
from asyncrl.weight_sync.protocol import WeightUpdate
from asyncrl.weight_sync.transports import FlatBufferSync
from bench import harness
from bench.trainer import make_groups
from bench.workloads import GENERATION_BOUND, QUICK, ModelShape, Workload, build_model

SYNC_SIZES = {
    "small": ModelShape(hidden=256, layers=4, heads=4, kv_heads=2, intermediate=768, vocab=4096),
    "medium": ModelShape(hidden=512, layers=6, heads=8, kv_heads=4, intermediate=1536, vocab=4096),
    "large": ModelShape(hidden=768, layers=12, heads=12, kv_heads=4, intermediate=2304, vocab=8192),
}
QUICK_SIZES = {"tiny": QUICK.model}


def _trainer(work: Workload, sharded: bool):
    from asyncrl.config.algorithm import AdvantageConfig, LossConfig
    from asyncrl.config.trainer import TrainerConfig
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel, SingleProcess
    from asyncrl.trainer.trainer import Trainer

    parallel = FullyShardedParallel("cpu") if sharded else SingleProcess()
    return Trainer(
        build_model(work.model).train(),
        TrainerConfig(lr=1e-5),
        LossConfig(name="ppo"),
        AdvantageConfig(name="grpo"),
        parallel=parallel,
    )


def train_tokens_per_s(work: Workload, steps: int, sharded: bool) -> dict[str, float] | None:
    """On every rank: one warm-up step, then ``steps`` timed steps; rank 0 reports tokens/s."""
    trainer = _trainer(work, sharded)
    groups = make_groups(work)
    trainer.train_step(groups, policy_version=0)
    started = time.perf_counter()
    tokens = 0.0
    for step in range(steps):
        tokens += trainer.train_step(groups, policy_version=step + 1)["num_tokens"]
    elapsed = time.perf_counter() - started
    return (
        {"tokens_per_s": tokens / elapsed, "step_s": elapsed / steps} if trainer.parallel.rank == 0 else None
    )


def train_arm(work: Workload, steps: int, world_size: int) -> Callable[[], dict[str, float]]:
    cores = len(os.sched_getaffinity(0))

    def run() -> dict[str, float]:
        threads = max(1, cores // world_size)
        return run_ranks(train_tokens_per_s, world_size, work, steps, world_size > 1, num_threads=threads)[0]

    return run


def publish_parts(shape: ModelShape) -> dict[str, float] | None:
    """On 2 ranks: gather + pack every bucket, then broadcast the packed buckets from rank 0 over gloo."""
    import torch.distributed as dist

    from asyncrl.trainer.distributed.parallel import FullyShardedParallel
    from asyncrl.trainer.distributed.weights import full_weight_buckets
    from asyncrl.weight_sync.flat import pack_state

    parallel = FullyShardedParallel("cpu")
    model = build_model(shape)
    parallel.shard(model)
    started = time.perf_counter()
    packed = [pack_state(bucket, 1) for bucket in full_weight_buckets(model, 64 * 2**20)]
    gather_pack_s = time.perf_counter() - started
    buffers = [torch.from_numpy(buffer.view("uint8")) for flat in packed for buffer in flat.buffers.values()]
    dist.barrier()
    started = time.perf_counter()
    for buffer in buffers:
        dist.broadcast(buffer if parallel.rank == 0 else torch.empty_like(buffer), src=0)
    dist.barrier()
    broadcast_s = time.perf_counter() - started
    nbytes = sum(b.numel() for b in buffers)
    if parallel.rank != 0:
        return None
    return {"gather_pack_s": gather_pack_s, "gloo_broadcast_s": broadcast_s, "bytes": float(nbytes)}


class _Reader:
    """An engine stand-in: reads published buckets from the object store and copies each tensor out."""

    def read(self, update: WeightUpdate) -> float:
        import ray

        total = 0
        for _, tensor in FlatBufferSync(get=ray.get).receive(update):
            total += tensor.clone().numel()
        return float(total)


def object_store_s(shape: ModelShape, reader) -> float:
    """Seconds from the first ``ray.put`` of rank 0's buckets to the reader actor holding a copy of them."""
    import ray

    from asyncrl.trainer.distributed.weights import full_weight_buckets

    model = build_model(shape)
    started = time.perf_counter()
    update = FlatBufferSync(put=ray.put).publish_buckets(1, full_weight_buckets(model, 64 * 2**20))
    ray.get(reader.read.remote(update))
    return time.perf_counter() - started


def sync_arm(shape: ModelShape, reader) -> Callable[[], dict[str, float]]:
    def run() -> dict[str, float]:
        parts = run_ranks(publish_parts, 2, shape)[0]
        return {**parts, "object_store_s": object_store_s(shape, reader), "gb": parts["bytes"] / 1e9}

    return run


def main() -> None:
    args = harness.parser(__doc__.splitlines()[0], "distributed").parse_args()
    import ray

    work = QUICK if args.quick else GENERATION_BOUND
    steps = 1 if args.quick else 3
    sizes = QUICK_SIZES if args.quick else SYNC_SIZES
    with ray_session(RuntimeConfig(type="local", rollout_num_cpus=1, train_num_cpus=1)):
        reader = ray.remote(_Reader).options(num_cpus=0).remote()
        arms = {"train_1rank": train_arm(work, steps, 1), "train_2ranks": train_arm(work, steps, 2)}
        arms |= {f"sync_{name}": sync_arm(shape, reader) for name, shape in sizes.items()}
        raw = harness.run_arms(arms, harness.repeats_for(args), harness.print_run)
    ratios = {"two_ranks_over_one": harness.paired_ratio(raw, "train_2ranks", "train_1rank", "tokens_per_s")}
    measured = {
        name: {
            "gb": runs[0]["gb"],
            "object_store_s_per_gb": sorted(r["object_store_s"] / r["gb"] for r in runs)[len(runs) // 2],
            "gloo_broadcast_s_per_gb": sorted(r["gloo_broadcast_s"] / r["gb"] for r in runs)[len(runs) // 2],
        }
        for name, runs in raw.items()
        if name.startswith("sync_")
    }
    setup = {
        "workload": work.name,
        "train_steps_per_repeat": steps,
        "sync_model_shapes": {name: vars(shape) for name, shape in sizes.items()},
        "cost_model_check": {"measured": measured, "simulator": _simulator_rate()},
    }
    cores = len(os.sched_getaffinity(0))
    resources = {
        "train_1rank": f"one process, {cores} torch threads",
        "train_2ranks": f"two FSDP2 ranks (gloo), {max(1, cores // 2)} torch thread(s) each",
        "sync": "2 trainer ranks with 1 thread each; the reader is a Ray actor with 0 reserved CPUs",
    }
    harness.write_result(args, "distributed", raw, ratios=ratios, resources=resources, setup=setup)


def _simulator_rate() -> dict[str, object]:
    """What the simulator charges per weight update: a constant ``sim.engine.weight_update_s``, whatever the
    model size (compare with the measured seconds per GB above to pick it for a given model)."""
    from asyncrl.config.sim import SimEngineConfig

    return {"field": "sim.engine.weight_update_s", "default_s": SimEngineConfig().weight_update_s}


if __name__ == "__main__":
    main()
