"""Every benchmark's full mode and its headline, in the order ``bench/run_all.py`` runs them.

Why one list: the published results must all come from one commit (``run_all`` re-runs every entry in turn),
and ``docs/benchmarks.md`` opens with one table of headlines generated from the same entries
(``scripts/bench_docs.py``). A new benchmark is one more ``Benchmark(...)`` line; a headline names a ratio in
its result file and says, in words, what it compares, on what, and where its section is.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Headline:
    """One number a benchmark is quoted for: a ratio of its result, described for the headline table."""

    ratio: str
    """Key in the result's ``ratios``."""
    compared: str
    """What is compared, numerator over denominator, and on which metric."""
    workload: str
    """On what workload and resources."""
    section: str
    """The anchor of its section on a family page under docs/benchmarks/ (a heading's GitHub slug)."""


@dataclass(frozen=True)
class Benchmark:
    """A benchmark's full-mode command and its result file."""

    result: str
    """Stem of ``bench/results/<result>.json``."""
    args: tuple[str, ...]
    """The command after ``python``: the script and its full-mode flags."""
    minutes: float
    """Expected wall-clock on a quiet 2-core machine (what ``run_all`` adds up before it starts)."""
    headlines: tuple[Headline, ...] = ()
    needs: str = ""
    """What it needs beyond the project's install (``run_all`` says so; it fails without it)."""
    measured_code: tuple[str, ...] = ()
    """Paths its numbers depend on beyond what the import trace of its ``--quick`` run lists
    (``scripts/import_trace.py``): what its full mode imports and its quick mode does not."""
    derived_only: tuple[str, ...] = ()
    """Traced paths whose changes alter what its result derives, not what it measures (a stopped run is
    continued, and a result kept, across a change to them)."""


ASYNC_VS_SYNC = "async-vs-the-best-sync-on-a-long-tail-workload-that-learns"

BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "long_tail",
        ("bench/long_tail.py",),
        # measured on AMD 2026-11-27: sweep ~33 min, time to reward ~56, bound ~3, throughput ~35; on an Intel
        # Xeon (2026-11-28) the curve took 119 min and partial_time_to_reward 77 (the Intel ran this workload
        # ~1.5x slower, so the AMD stages would take longer there)
        325,
        (
            Headline(
                "time_to_reward_async_a2_over_best_sync",
                "async α = 2 / best sync: time to best sync's final held-out reward",
                "~18 M Qwen3-shaped warm start, copy task with long-tailed lengths (≤ 1,024 tokens), 110 steps; "
                "2 cores, one process",
                ASYNC_VS_SYNC,
            ),
            Headline(
                "throughput_async_a2_over_best_sync",
                "async α = 2 / best sync: trained samples/s at steady state",
                "the same workload, 2 cores",
                ASYNC_VS_SYNC,
            ),
        ),
        # its script is mostly stage bookkeeping (ratios, continuation) that changes what it derives, not what
        # it measures: its stopped runs are continued (--extend) across a change to it
        derived_only=("bench/long_tail.py", "bench/provenance.py", "bench/registry.py"),
    ),
    Benchmark(
        "engine",
        ("bench/engine.py", "--vllm"),
        8,
        (
            Headline(
                "long_tail_throughput_t2",
                "built-in engine / HF generate: tokens/s",
                "3.4 M Qwen2, long-tailed output lengths, 2 threads",
                "engine",
            ),
        ),
        needs="vLLM in its own environment (asyncrl backends install vllm)",
    ),
    Benchmark(
        "engine_attention",
        ("bench/engine.py", "--part", "decode_attention"),
        # estimated, not yet run: 6 arms x 4 runs (a warm-up, 3 repeats) x 22 steps of at most ~0.5 s on 2 cores
        4,
        (
            Headline(
                "tail_longest_over_bucketed",
                "decode step, every row over the longest context / each row over its own bucket: ms",
                "21 M Qwen2, 64 rows: one at 2,000 positions, 63 at ~100; 2 threads",
                "decode-attention-by-length-level",
            ),
        ),
    ),
    Benchmark(
        "trainer",
        ("bench/trainer.py",),
        5,
        (
            Headline(
                "packed_over_padded",
                "packed / padded training: trained tokens/s",
                "21 M Qwen2, 64 long-tailed samples, 2 threads",
                "trainer-packed-vs-padded-vs-a-plain-loop",
            ),
        ),
    ),
    Benchmark("distributed", ("bench/distributed.py",), 5),
    # its --quick runs every arm inline, its full mode on Ray: the trace misses the Ray runtime's modules
    Benchmark("async_vs_sync", ("bench/async_vs_sync.py",), 10, measured_code=("asyncrl",)),
    # its --quick runs every arm inline, its full mode on Ray: the trace misses the Ray runtime's modules
    Benchmark(
        "async_vs_sync_training_bound",
        ("bench/async_vs_sync.py", "--workload", "training_bound"),
        10,
        measured_code=("asyncrl",),
    ),
    Benchmark("ray_calls", ("bench/ray_calls.py",), 1),
    Benchmark(
        "sync_vs_trl",
        ("bench/sync_vs_trl.py",),
        5,  # measured at b524b63 on the AMD EPYC: 2.3 min; at a8fb02b on the Intel Xeon: 4.2
        (
            Headline(
                "samples_per_s",
                "asyncrl sync / TRL GRPOTrainer: trained samples/s",
                "the same model, task and batch, 2 cores",
                "sync-vs-trl",
            ),
        ),
    ),
    Benchmark("offpolicy", ("bench/offpolicy.py",), 50),
    Benchmark(
        "default_run",
        ("bench/default_run.py",),
        18,  # 9.5 min on the AMD EPYC, 17.5 on the Intel Xeon (2026-11-29)
        (
            Headline(
                "faster_sync_over_default_train_wall_s",
                "faster sync / async (the default): training wall-clock of the same 150 steps",
                "`asyncrl train` as shipped (1.1 M warm start, copy task), 2 cores",
                "the-embedded-default-run-asyncrl-train",
            ),
        ),
    ),
    Benchmark("agentic_run", ("bench/default_run.py", "--example", "agentic"), 6),
    Benchmark(
        "agentic",
        ("bench/agentic.py",),
        30,
        (
            Headline(
                "headline/env_async_vs_best_sync",
                "env-level async / best sync: trained episodes/s",
                "multi-turn copy_chain with lognormal env delays at a middle σ, one process",
                "agentic-env-level-asynchrony",
            ),
        ),
    ),
    Benchmark(
        "lora",
        ("bench/lora.py",),
        16,
        (
            Headline(
                "full_over_lora_sync_bytes_object_store",
                "full / LoRA (rank 16, every linear layer): bytes of one weight update",
                "18.3 M Qwen3-shaped model (the long-tail workload's), flat-buffer transport, 2 cores",
                "lora-against-full-fine-tuning",
            ),
        ),
    ),
    Benchmark("deterministic", ("bench/deterministic.py",), 2),
    Benchmark("agentic_learning", ("bench/agentic_learning.py",), 25),
    Benchmark("critic_learning", ("bench/critic_learning.py",), 55),
    Benchmark("agents_external", ("bench/agents_external.py",), 40),
    Benchmark("serve_load", ("bench/serve_load.py",), 3),
    Benchmark("soak", ("bench/soak.py",), 30),
    Benchmark("simulator", ("bench/simulator.py",), 5),
    # 15 min of CPU in its runs (both clocks, 1k/8k/64k, 3 repeats; 64 k requests per step dominate); under a
    # load average of 27-38 (2026-12-06, 6865b3b) it took 70 min of wall time
    Benchmark("control_plane", ("bench/control_plane.py",), 20),
    # estimated (2026-12-06): the DORA study's 30 runs at 20-40 s of CPU each, the all-modes study back at 256 x 16
    Benchmark("sim_studies", ("bench/sim_studies.py",), 30),
    # 68 min on the AMD EPYC; 103 on the Intel Xeon (2026-11-29), part of it beside a test pass
    Benchmark("paper_tables", ("bench/paper_tables.py",), 100),
    # its --quick runs every arm inline, its full mode on Ray: the trace misses the Ray runtime's modules
    Benchmark("sim_vs_real", ("bench/sim_vs_real.py",), 10, measured_code=("asyncrl",)),
    Benchmark(
        "weight_sync",
        # without 1.1B: there Ray's memory monitor kills the object store's receiver on a 24 GB machine (four
        # float32 copies), as the recorded result's command already left it out (docs/weight-sync.md)
        ("bench/weight_sync.py", "--parts", "transports,long_tail_step", "--sizes", "21M,100M,0.5B"),
        30,
    ),
    Benchmark(
        "weight_sync_vllm",
        # its own result: it needs vLLM's environment and ~40 s of engine start-up per size and dtype, and is
        # re-run when the vLLM worker changes, independently of the transports' half-hour sweep
        (
            "bench/weight_sync.py",
            "--parts",
            "vllm",
            "--sizes",
            "21M,100M,0.5B",
            "--out",
            "bench/results/weight_sync_vllm.json",
        ),
        15,
        needs="the vLLM environment (asyncrl backends install vllm)",
    ),
    Benchmark(
        "weight_sync_delta_bytes",
        (
            "bench/weight_sync.py",
            "--parts",
            "delta_bytes",
            "--out",
            "bench/results/weight_sync_delta_bytes.json",
        ),
        4,
    ),
)
"""In run order: the long-tail benchmark first (the longest, and the one the headline rests on)."""

GPU_RESULTS = ("engine_cuda", "trainer_cuda", "weight_sync_cuda")
"""Results measured on a lent GPU machine: not re-run by ``run_all`` (see docs/gpu-smoke/)."""


def by_result(name: str) -> Benchmark:
    """The entry whose result file is ``bench/results/<name>.json``."""
    for benchmark in BENCHMARKS:
        if benchmark.result == name:
            return benchmark
    raise KeyError(f"no benchmark writes bench/results/{name}.json (bench/registry.py)")
