"""Benchmark: asyncrl's continuous-batching engine against Hugging Face ``generate`` in static batches.

Both serve the same tiny random Qwen2 model (hidden 256, 4 layers, ~3.4 M parameters) and the same requests,
side by side in one run. Output lengths are imposed with ``ignore_eos`` and per-request ``max_new_tokens``:
a long-tailed workload (lognormal, clipped to [4, 512], as reasoning outputs are) and a uniform one.
HF runs static batches of ``max_running_requests`` requests in arrival order, each until its longest member
is done; only the tokens each request asked for count towards its throughput.

    python bench/engine.py [--quick] [--threads N ...] [--repeats 3] [--vllm] [--out bench/results/engine.json]

Every comparison runs at torch's default thread count (what a user gets) and at 1 thread, beside it.

**Compute ceiling.** On the larger model of the generation-bound workload (``bench/workloads.py``, ~21 M
parameters) the engine decodes a uniform batch of 64 requests, and a ``gemm_ceiling`` arm times, in the same run
and on the same threads, exactly the matrix products one decode step of that batch needs (every layer's
q/k/v/o and MLP projections, then the LM head, at 64 rows): the tokens/s the machine's GEMMs allow if decoding
were nothing else. The engine's share of it (``large_uniform_share_of_gemm_ceiling``) is the fraction the target
asks for (>= 40 %); attention, sampling and scheduling are what the remaining share is spent on.

``--device cuda`` runs every arm on the GPU (torch's default thread count only: the threads then only feed the
GPU), with Qwen2-0.5B's shape (random weights, float32) as the large model: the CPU workload's 21 M model would
only measure kernel launches there. Write it to ``bench/results/engine_cuda.json``.

``--vllm`` adds the vLLM backend (``engine.backend=vllm``, a worker in vLLM's own environment: run
``asyncrl backends install vllm`` first) as a third arm on the same model and requests; its start-up (worker
spawn, model load, engine build) is paid once, measured and recorded as ``setup.vllm_startup_s``.

**Decode attention by length level** (``--part decode_attention``, its own result
``bench/results/engine_attention.json``): one decode step of 64 rows at fixed contexts, in the model runner the
engine uses, each row attending over its own length bucket (``decode_plan``: what the engine does) against
every row attending over the batch's longest context (what it did before per-row attention). Three mixes of
contexts (``context_mix``): a long tail (one row at 2,000 positions, 63 at ~100), a spread (uniform over
[100, 2,000]) and a control of equal contexts (~100), where both plans are the same one group. Beside each time,
the KV positions the step's attention reads (a count from ``decode_plan``, not a time) and the SDPA kernels
it dispatched to. The model is the generation-bound workload's on CPU (``large_model``, ~21 M parameters, 4 KV
heads of 64; Qwen2-0.5B's shape in bfloat16 on CUDA): its KV rows are wide enough that at 2,000 positions
the KV read is most of a step's bytes (~1.6 GB against 84 MB of weights), and at ~100 about the weights' size,
so attention is a real share of every mix's step by bytes (the result's ``table`` counts them).

    python bench/engine.py --part decode_attention [--quick] [--device cuda] [--repeats 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/engine.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import asyncio
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import transformers

from asyncrl.config.engine import EngineConfig
from asyncrl.engine import make_engine
from asyncrl.engine.decode_plan import Group, attention_groups, attention_positions, length_bucket
from asyncrl.engine.llm_engine import cast_to_serving_dtype
from asyncrl.engine.model_runner import ModelRunner
from asyncrl.types import Request, SamplingParams
from bench import harness
from bench.workloads import synchronize

VOCAB = 4096
MAX_OUTPUT = 512


def tiny_model() -> transformers.Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    return transformers.Qwen2ForCausalLM(config).eval()


def workload(
    kind: str, num_requests: int, seed: int, max_output: int = MAX_OUTPUT
) -> list[tuple[list[int], int]]:
    """(prompt, output length) pairs: prompts of 16-64 tokens; outputs long-tailed (clipped to ``max_output``)
    or all 64."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, VOCAB, size=int(rng.integers(16, 65))).tolist() for _ in range(num_requests)]
    if kind == "long_tail":
        lengths = np.clip(rng.lognormal(mean=np.log(24), sigma=1.3, size=num_requests), 4, max_output).astype(
            int
        )
    else:
        lengths = np.full(num_requests, min(64, max_output))
    return list(zip(prompts, lengths.tolist(), strict=True))


LARGE_BATCH, LARGE_PROMPT, LARGE_OUTPUT = 64, 32, 64
"""The ceiling comparison: 64 requests, all decoding at once, 32-token prompts, 64 tokens each."""


def large_model(quick: bool, device: str):
    """``workloads.model_shape``'s model (random weights, float32, eval) on ``device``."""
    from bench.workloads import build_model, model_shape

    return build_model(model_shape(device, quick)).to(device)


def large_workload(vocab: int, batch: int) -> list[tuple[list[int], int]]:
    rng = np.random.default_rng(2)
    return [(rng.integers(3, vocab, size=LARGE_PROMPT).tolist(), LARGE_OUTPUT) for _ in range(batch)]


def decode_gemm_shapes(config: Any) -> list[tuple[int, int]]:
    """(in, out) of every matrix product in one decode step of a Qwen2/Llama-shaped model."""
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = hidden // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    per_layer = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden)]
    per_layer += [(hidden, inter), (hidden, inter), (inter, hidden)]
    return per_layer * config.num_hidden_layers + [(hidden, config.vocab_size)]


@torch.inference_mode()
def gemm_ceiling(config: Any, batch: int, device: str, seconds: float = 2.0) -> dict[str, float]:
    """Decode steps per second if a step were only its matrix products (random operands of the model's
    shapes, ``batch`` rows, on ``device``), as tokens/s; run for about ``seconds`` after one untimed pass."""
    shapes = decode_gemm_shapes(config)
    weights = [torch.randn(n_in, n_out, device=device) for n_in, n_out in shapes]
    inputs = {n_in: torch.randn(batch, n_in, device=device) for n_in, _ in shapes}

    def step() -> None:
        for weight in weights:
            torch.mm(inputs[weight.shape[0]], weight)
        synchronize(device)  # a step is done when its products are, not when they are queued

    step()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
    elapsed = time.perf_counter() - start
    flops_per_step = 2 * batch * sum(n_in * n_out for n_in, n_out in shapes)
    return {"tokens_per_s": steps * batch / elapsed, "gflops": steps * flops_per_step / elapsed / 1e9}


def percentiles(values: list[float]) -> dict[str, float]:
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99))}


async def _serve_all(engine, requests: list[Request]):
    return await asyncio.gather(*(engine.generate(r) for r in requests))


def on_fresh_thread(fn, num_threads: int):
    """``fn()`` on a new thread with ``num_threads`` torch threads, like the engine's own thread: each arm
    computes on a thread of its own while the main thread keeps one torch thread, so no arm runs beside
    another thread's OpenMP team (libgomp throttles every team once their threads outnumber the cores)."""
    import threading

    out: dict = {}

    def target() -> None:
        torch.set_num_threads(num_threads)
        out["result"] = fn()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    return out["result"]


def run_engine(model, work, batch_size: int, num_threads: int | None = None) -> dict:
    config = EngineConfig(
        max_running_requests=batch_size,
        max_kv_tokens=batch_size * (64 + MAX_OUTPUT),
        max_prefill_tokens_per_step=512,
        max_model_len=64 + MAX_OUTPUT,
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),  # HF generate's precision too
    )
    engine = make_engine(model, None, config, num_threads)
    requests = [
        Request(
            request_id=str(i),
            prompt_token_ids=prompt,
            sampling=SamplingParams(max_new_tokens=n, ignore_eos=True, seed=i),
        )
        for i, (prompt, n) in enumerate(work)
    ]
    before = engine.stats()
    start = time.perf_counter()
    generations = asyncio.run(_serve_all(engine, requests))
    seconds = time.perf_counter() - start
    after = engine.stats()
    engine.shutdown()
    num_tokens = sum(g.num_tokens for g in generations)
    assert num_tokens == sum(n for _, n in work), "the engine must produce exactly the imposed lengths"
    return {
        "seconds": seconds,
        "tokens": num_tokens,
        "tokens_per_s": num_tokens / seconds,
        "ttft_s": percentiles([g.timings["ttft_s"] for g in generations]),
        "idle_fraction": (after["idle_seconds"] - before["idle_seconds"])
        / (after["uptime_s"] - before["uptime_s"]),
        "step_time_fraction": (after["busy_seconds"] - before["busy_seconds"]) / seconds,
    }


class _FirstCall(transformers.LogitsProcessor):
    """Records when generate() first asks for logits processing: the first token of the batch is ready."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(self, input_ids, scores):
        if self.at is None:
            self.at = time.perf_counter()
        return scores


@torch.inference_mode()
def run_hf(model, work, batch_size: int) -> dict:
    start = time.perf_counter()
    ttfts = []
    for first in range(0, len(work), batch_size):
        batch = work[first : first + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in batch], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch], device=model.device)
        marker = _FirstCall()
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max(n for _, n in batch),
            min_new_tokens=max(n for _, n in batch),
            do_sample=True,
            top_k=0,
            eos_token_id=None,
            pad_token_id=0,
            logits_processor=transformers.LogitsProcessorList([marker]),
        )
        ttfts += [marker.at - start] * len(batch)
    seconds = time.perf_counter() - start
    num_tokens = sum(n for _, n in work)
    return {
        "seconds": seconds,
        "tokens": num_tokens,
        "tokens_per_s": num_tokens / seconds,
        "ttft_s": percentiles(ttfts),
    }


def start_vllm(model, max_model_len: int, threads: int):
    """A vLLM worker serving ``model`` (saved to a temporary directory) and its measured start-up seconds."""
    import tempfile

    from asyncrl.config.engine import VLLMConfig
    from asyncrl.engine.vllm import VLLMEngineClient, vllm_python

    if vllm_python() is None:
        raise SystemExit("--vllm: no vLLM environment; run `asyncrl backends install vllm`")
    os.environ["OMP_NUM_THREADS"] = str(threads)  # the same threads the other arms get
    directory = tempfile.mkdtemp(prefix="asyncrl-bench-vllm-")
    model.save_pretrained(directory)
    started = time.perf_counter()
    client = VLLMEngineClient.start(directory, VLLMConfig(), max_model_len=max_model_len)
    return client, time.perf_counter() - started


def run_vllm(client, work) -> dict:
    requests = [
        Request(
            request_id=f"{time.monotonic_ns()}-{i}",
            prompt_token_ids=prompt,
            sampling=SamplingParams(max_new_tokens=n, ignore_eos=True, seed=i),
        )
        for i, (prompt, n) in enumerate(work)
    ]
    start = time.perf_counter()
    generations = asyncio.run(_serve_all(client, requests))
    seconds = time.perf_counter() - start
    num_tokens = sum(g.num_tokens for g in generations)
    assert num_tokens == sum(n for _, n in work), "vLLM must produce exactly the imposed lengths"
    return {"seconds": seconds, "tokens": num_tokens, "tokens_per_s": num_tokens / seconds, "ttft_s": {}}


def flat(result: dict) -> dict[str, float]:
    """One arm's run as flat numbers (the harness summarizes each across repeats)."""
    metrics = {key: result[key] for key in ("seconds", "tokens_per_s", "idle_fraction") if key in result}
    metrics.update({f"ttft_{key}_s": value for key, value in result["ttft_s"].items()})
    return metrics


def length_stats(work: list[tuple[list[int], int]]) -> dict[str, float]:
    lengths = [n for _, n in work]
    median = statistics.median(lengths)
    p99 = float(np.percentile(lengths, 99))
    return {
        "median": median,
        "p99": p99,
        "max": max(lengths),
        "total": sum(lengths),
        "p99_over_median": p99 / median,
    }


def thread_counts(asked: list[int], device: str) -> list[int]:
    """The thread counts to compare at: what was asked, else torch's default (what a user gets) and, on CPU, 1."""
    if asked:
        return asked
    default = torch.get_num_threads()
    return [default, 1] if default != 1 and device == "cpu" else [default]


ATTENTION_ROWS, LONG_CONTEXT, SHORT_CONTEXT, ATTENTION_MAX_LEN = 64, 2000, 100, 2048
"""The decode-attention part's batch: 64 rows (the engine arms' batch), the long row at 2,000 positions and the
short ones at ~100 (an RL rollout's long tail: one trace still reasoning beside many that are short), in a KV
pool of 2,048 positions per slot."""
ATTENTION_STEPS, ATTENTION_WARMUP = 20, 2
"""Decode steps timed per run (their median is the run's step time), after untimed ones (a CUDA capture)."""
MIXES = ("tail", "spread", "equal")
PLANS = ("bucketed", "longest")


def context_mix(kind: str, rows: int, long: int, short: int, seed: int = 3) -> list[int]:
    """Each row's context (positions already in its KV; it decodes the token at that position), in slot order
    as the scheduler keeps it (longer buckets in lower slots):

    - ``tail``: one row at ``long``, the others at ``short`` ± 10 %: the long tail per-row attention is for;
    - ``spread``: uniform over [``short``, ``long``]: every length level holds rows, the most attention groups;
    - ``equal``: every row at ``short`` ± 10 %: one level, so both plans are one and the same group (a control).
    """
    rng = np.random.default_rng(seed)
    shorts = rng.integers(short * 9 // 10, short * 11 // 10 + 1, size=rows).tolist()
    if kind == "tail":
        return [long, *shorts[1:]]
    if kind == "spread":
        return sorted(rng.integers(short, long + 1, size=rows).tolist(), reverse=True)
    if kind == "equal":
        return shorts
    raise ValueError(f"context mix must be one of {', '.join(MIXES)}, got {kind!r}")


def attention_plan(runner: ModelRunner, rope: list[int], plan: str) -> tuple[int, tuple[Group, ...]]:
    """The (batch, attention groups) of one decode step of rows at positions ``rope`` under ``plan``.

    ``bucketed``: what the engine does (``attention_groups``; ``StaticDecode.shape_of`` at static shapes).
    ``longest``: what it did before per-row attention (before commit d874368): one group, every row over the
    batch's longest need, or that need's length bucket at static shapes. No setting reaches it any more, so
    this is the baseline: the same runner, KV pool and forward, with that one plan in place of the engine's.
    """
    if plan not in PLANS:
        raise ValueError(f"attention plan must be one of {', '.join(PLANS)}, got {plan!r}")
    needs = [position + 1 for position in rope]
    max_len, static = runner.cache.max_len, runner.static
    if static is None:
        if plan == "longest":
            return len(rope), ((0, len(rope), max(needs)),)
        return len(rope), attention_groups(needs, max_len)
    if plan == "bucketed":
        return static.shape_of(rope)
    batch = next(b for b in static.buckets if b >= len(rope))
    return batch, ((0, batch, length_bucket(max(needs), max_len)),)


@torch.inference_mode()
def decode_step(
    runner: ModelRunner, tokens: list[int], rope: list[int], plan: str, *, eager: bool = False
) -> torch.Tensor:
    """One decode step as ``ModelRunner._decode`` runs it (the plan, the inputs' one copy, the forward), every
    row writing its KV at its own position; on the static path a captured graph replays unless ``eager``
    (then the same shapes run op by op, so a profiler sees which kernels SDPA picks)."""
    batch, groups = attention_plan(runner, rope, plan)
    if runner.static is not None and not eager:
        return runner.static.run(tokens, rope, rope, (batch, groups))
    pad = batch - len(rope)
    scratch = runner.cache.scratch_position
    rows = [tokens + [0] * pad, rope + [0] * pad, rope + [scratch] * pad]
    return runner._decode_rows(torch.tensor(rows, device=runner.device), groups)


def sdpa_ops(step: Callable[[], object]) -> dict[str, int]:
    """The SDPA kernels one call of ``step`` dispatched to, as aten op name → calls: which of flash,
    memory-efficient, cuDNN or math attention really ran (a mask or a layout can rule a kernel out)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        step()
    counts: dict[str, int] = {}
    for event in profiled.events():
        if event.name.startswith("aten::_scaled_dot_product"):
            counts[event.name] = counts.get(event.name, 0) + 1
    return counts


def time_decode(
    runner: ModelRunner, tokens: list[int], rope: list[int], plan: str, steps: int, warmup: int
) -> dict[str, float]:
    """One run of an arm: ``warmup`` untimed steps, then ``steps`` timed ones, each synchronised. The step time
    is their median; CPU time is the process's (every thread's) per step, less sensitive than wall time to a
    shared machine descheduling the run; the positions and groups are the plan's, counted."""
    device = runner.device.type
    for _ in range(warmup):
        decode_step(runner, tokens, rope, plan)
    synchronize(device)
    seconds, cpu_start = [], time.process_time()
    for _ in range(steps):
        start = time.perf_counter()
        decode_step(runner, tokens, rope, plan)
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    cpu = time.process_time() - cpu_start
    _, groups = attention_plan(runner, rope, plan)
    return {
        "step_ms": statistics.median(seconds) * 1e3,
        "step_cpu_ms": cpu / steps * 1e3,
        "kv_positions_per_layer": attention_positions(groups),
        "attention_groups": len(groups),
    }


def attention_runner(
    model: torch.nn.Module, rows: int, max_len: int, decode_graphs: str = "auto"
) -> ModelRunner:
    """The engine's model runner over ``rows`` slots on the model's device, by default on the engine's default
    decode path (``auto``: captured static shapes on CUDA, the step's own shapes on CPU), its KV pool filled
    with random keys and values so attention computes over data, not zeros."""
    runner = ModelRunner(model, num_slots=rows, max_len=max_len, decode_graphs=decode_graphs)
    generator = torch.Generator(device=runner.device).manual_seed(0)
    for pool in (*runner.cache.keys, *runner.cache.values):
        pool.normal_(generator=generator)
    return runner


def attention_table(runner: ModelRunner, mixes: dict[str, list[int]], model: torch.nn.Module) -> dict:
    """Per mix, what each plan reads (counted from ``decode_plan``, not timed): attention groups, KV positions
    per layer, and the KV bytes of a whole step beside the weights' bytes."""
    cache = runner.cache
    kv_bytes_per_position = 2 * len(cache.keys) * cache.keys[0].shape[1] * cache.keys[0].shape[3]
    kv_bytes_per_position *= cache.keys[0].element_size()
    weight_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    rows = []
    for kind, rope in mixes.items():
        plans = {plan: attention_plan(runner, rope, plan)[1] for plan in PLANS}
        positions = {plan: attention_positions(groups) for plan, groups in plans.items()}
        rows.append(
            [
                kind,
                len(rope),
                f"{min(rope)} / {int(statistics.median(rope))} / {max(rope)}",
                len(plans["bucketed"]),
                positions["bucketed"],
                positions["longest"],
                positions["longest"] / positions["bucketed"],
                positions["bucketed"] * kv_bytes_per_position / 1e6,
                positions["longest"] * kv_bytes_per_position / 1e6,
                weight_mb,
            ]
        )
    return {
        "title": "What each plan reads per decode step (counted, not timed)",
        "columns": [
            "mix",
            "rows",
            "context min / median / max",
            "bucketed groups",
            "KV positions per layer, bucketed",
            "longest",
            "longest / bucketed",
            "KV MB per step, bucketed",
            "longest",
            "weights MB",
        ],
        "rows": rows,
    }


def decode_attention(args: Any) -> None:
    """The ``decode_attention`` part: every (mix, plan) arm interleaved, a paired ratio per mix, one result."""
    from asyncrl.sim.probe import decode_path  # here: the throughput part's run (and import trace) needs none

    rows, long, short, max_len = (
        (8, 200, 20, 256) if args.quick else (ATTENTION_ROWS, LONG_CONTEXT, SHORT_CONTEXT, ATTENTION_MAX_LEN)
    )
    steps, warmup = (3, 1) if args.quick else (ATTENTION_STEPS, ATTENTION_WARMUP)
    threads = thread_counts(args.threads, args.device)[0]
    torch.set_num_threads(1)  # the main thread only orchestrates; the arms compute on threads of their own
    model = large_model(args.quick, args.device)
    dtype = cast_to_serving_dtype(model, "auto")  # the engine's default: bfloat16 on CUDA, as built on CPU
    runner = attention_runner(model, rows, max_len)
    mixes = {kind: context_mix(kind, rows, long, short) for kind in MIXES}
    tokens = np.random.default_rng(4).integers(3, model.config.vocab_size, size=rows).tolist()
    arms = {
        f"{plan}_{kind}": functools.partial(
            lambda r, p: on_fresh_thread(lambda: time_decode(runner, tokens, r, p, steps, warmup), threads),
            rope,
            plan,
        )
        for kind, rope in mixes.items()
        for plan in PLANS
    }
    # warm-up: each mix's first steps pay its shapes' first allocations and kernel choices, whichever arm runs first
    raw = harness.run_arms(arms, harness.repeats_for(args), harness.print_run, warmup=True)
    ratios = {
        f"{kind}_longest_over_bucketed": harness.paired_ratio(
            raw, f"longest_{kind}", f"bucketed_{kind}", "step_ms"
        )
        for kind in mixes
    }
    setup = {
        "device": args.device,
        "model": {
            "hidden": model.config.hidden_size,
            "layers": model.config.num_hidden_layers,
            "heads": model.config.num_attention_heads,
            "kv_heads": model.config.num_key_value_heads,
            "params": sum(p.numel() for p in model.parameters()),
            "dtype": str(dtype).removeprefix("torch."),
        },
        "rows": rows,
        "kv_pool_positions": max_len,
        "contexts": mixes,
        "steps_per_run": steps,
        "warmup_steps": warmup,
        "decode_path": decode_path(runner.static),
        "sdpa_ops": {
            f"{plan}_{kind}": sdpa_ops(lambda r=rope, p=plan: decode_step(runner, tokens, r, p, eager=True))
            for kind, rope in mixes.items()
            for plan in PLANS
        },
    }
    resources = {
        "all_arms": f"one process, arms run one at a time, each on its own thread with {threads} torch threads "
        "(the main thread keeps 1)" + (", computing on the GPU" if args.device == "cuda" else "")
    }
    torch.set_num_threads(threads)  # the machine record states the arms' thread count
    harness.write_result(
        args,
        "engine_attention",
        raw,
        ratios=ratios,
        resources=resources,
        setup=setup,
        extra={"table": attention_table(runner, mixes, model)},
    )


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "engine")
    parser.add_argument(
        "--threads", type=int, nargs="*", default=[], help="torch threads per arm (default: torch's, then 1)"
    )
    parser.add_argument("--vllm", action="store_true", help="add the vLLM backend as a third arm")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where every arm computes")
    parser.add_argument(
        "--part",
        choices=["throughput", "decode_attention"],
        default="throughput",
        help="throughput: the engine against HF generate (engine.json); decode_attention: the decode step by "
        "attention plan (engine_attention.json)",
    )
    args = parser.parse_args()
    if args.part == "decode_attention":
        if args.vllm:
            parser.error("--vllm is an arm of the throughput part, not of decode_attention")
        if args.out == f"{harness.RESULTS_DIR}/engine.json":
            args.out = f"{harness.RESULTS_DIR}/engine_attention.json"  # its own result file
        decode_attention(args)
        return
    counts = thread_counts(args.threads, args.device)
    default_threads = counts[0]
    torch.set_num_threads(1)  # the main thread only orchestrates; the arms compute on threads of their own
    num_requests, batch_size, max_output = (12, 4, 32) if args.quick else (256, 64, MAX_OUTPUT)
    large_batch = 8 if args.quick else LARGE_BATCH
    model, large = tiny_model().to(args.device), large_model(args.quick, args.device)
    works = {
        kind: workload(kind, num_requests, seed=1, max_output=max_output) for kind in ("long_tail", "uniform")
    }
    large_work = large_workload(large.config.vocab_size, large_batch)
    arms = {}
    for threads in counts:
        for kind, work in works.items():
            arms[f"engine_{kind}_t{threads}"] = functools.partial(
                lambda w, t: flat(run_engine(model, w, batch_size, t)), work, threads
            )
            arms[f"hf_{kind}_t{threads}"] = functools.partial(
                lambda w, t: flat(on_fresh_thread(lambda: run_hf(model, w, batch_size), t)), work, threads
            )
    arms["engine_large_uniform"] = lambda: flat(run_engine(large, large_work, large_batch, default_threads))
    arms["hf_large_uniform"] = lambda: flat(
        on_fresh_thread(lambda: run_hf(large, large_work, large_batch), default_threads)
    )
    arms["gemm_ceiling_large"] = lambda: on_fresh_thread(
        lambda: gemm_ceiling(large.config, large_batch, args.device), default_threads
    )
    vllm, vllm_startup_s = start_vllm(model, 64 + max_output, default_threads) if args.vllm else (None, None)
    if vllm is not None:
        for kind, work in works.items():
            arms[f"vllm_{kind}"] = functools.partial(lambda w: flat(run_vllm(vllm, w)), work)
    try:
        raw = harness.run_arms(arms, harness.repeats_for(args), harness.print_run)
    finally:
        if vllm is not None:
            vllm.shutdown()
    ratios = {
        f"{kind}_throughput_t{threads}": harness.paired_ratio(
            raw, f"engine_{kind}_t{threads}", f"hf_{kind}_t{threads}", "tokens_per_s"
        )
        for threads in counts
        for kind in works
    }
    ratios["large_uniform_throughput"] = harness.paired_ratio(
        raw, "engine_large_uniform", "hf_large_uniform", "tokens_per_s"
    )
    ratios["large_uniform_share_of_gemm_ceiling"] = harness.paired_ratio(
        raw, "engine_large_uniform", "gemm_ceiling_large", "tokens_per_s"
    )
    if vllm is not None:
        ratios |= {
            f"{kind}_engine_over_vllm": harness.paired_ratio(
                raw, f"engine_{kind}_t{default_threads}", f"vllm_{kind}", "tokens_per_s"
            )
            for kind in works
        }
    setup = {
        "model": {
            "arch": "qwen2",
            "hidden": 256,
            "layers": 4,
            "params": sum(p.numel() for p in model.parameters()),
        },
        "device": args.device,
        "large_model": {
            "hidden": large.config.hidden_size,
            "layers": large.config.num_hidden_layers,
            "params": sum(p.numel() for p in large.parameters()),
            "batch": large_batch,
            "prompt_tokens": LARGE_PROMPT,
            "output_tokens": LARGE_OUTPUT,
        },
        "num_requests": num_requests,
        "batch_size": batch_size,
        "output_len": {kind: length_stats(work) for kind, work in works.items()},
        "transformers": transformers.__version__,
    }
    resources = {
        "all_arms": "one process, arms run one at a time, each on its own thread with the torch threads its "
        f"name says (_tN), the large-model and ceiling arms with {default_threads} (the main thread keeps 1)"
        + (", computing on the GPU" if args.device == "cuda" else "")
    }
    if vllm is not None:
        setup["vllm_startup_s"] = vllm_startup_s
        resources["vllm"] = f"a worker process in vLLM's environment, OMP_NUM_THREADS={default_threads}"
    torch.set_num_threads(default_threads)  # the machine record states the default arms' thread count
    harness.write_result(args, "engine", raw, ratios=ratios, resources=resources, setup=setup)


if __name__ == "__main__":
    main()
