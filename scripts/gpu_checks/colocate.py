"""GPU kit section: colocated sync (``runtime.switch``) and async on one device, at a Qwen3-1.7B shape.

Usage: ``python scripts/gpu_checks/colocate.py --device {cpu,cuda} --out DIR [--engine-stream {own,default}]``

Two real ``asyncrl train`` runs (inline runtime, built-in engine) on one device, the same model and workload:

- ``colocated_sync``: ``controller.mode=sync`` with ``runtime.switch.enabled``: the engine sleeps (KV pool freed)
  while the trainer trains, the trainer offloads its optimizer state while the engine generates, weights go
  by the colocated transport (CUDA IPC on CUDA). The phases' times (``colocate/*``) are the switch cost.
- ``async_one_device``: ``controller.mode=async``, α = 1: engine and trainer both resident, running at once
  on their own threads (one process, one device: an explicit memory split is the engine's KV pool size).
  The engine's kernels go on a CUDA stream of its own (``--engine-stream own``, the default) or on the default
  stream it then shares with the trainer (``default``: serialised, for comparison). Each run reports the
  stream mode its engines ran in (``engine_streams``); on CUDA the async run also profiles a 2 s window after
  its first step and reports how long kernels of two streams ran at once (``stream_overlap``, a measurement).

``--device cuda``: random-initialised weights at the shape table's ``qwen3-1.7b`` (``asyncrl.sim.model_shape``,
bfloat16, its full vocabulary: 2.03 B parameters), written locally with the packaged tiny tokenizer (ids it
lacks decode to nothing); nothing is downloaded. ``--device cpu``: the probe's tiny shape, a twin under 60 s.

Lengths are long-tailed by the task's law (``data.lengths.long_tail_count``: a clipped log-normal): a random
model never says EOS, so each request's length is forced, EOS ignored, to a draw seeded by its request id.

Each run: ≥ 4 steps, step time with its breakdown (wait, train, sync; and the switch phases), samples/s, peak
memory (CUDA allocator peak; on CPU the process's peak RSS so far). Writes ``DIR/result.json``; PASS/FAIL lines
for what must hold (every colocated step slept and woke, the KV pool was empty while training, ≥ 4 steps each),
and the one-device async/sync throughput ratio as a measurement, not a check. Exit status non-zero on a FAIL.

Disk: the model and each run's output directory live in a temporary directory outside ``DIR``, removed as soon
as they are done with (and in any case on exit): a run always ends with a full checkpoint (fp32 masters and
Adam's moments: ~24 GB at this shape, whatever ``trainer.checkpoint_every`` says), which must neither fill
the GPU machine's disk nor travel back with the results. Only each run's small top-level files (metrics,
summary, config, timeline) are copied to ``DIR/<run>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import resource
import shutil
import sys
import tempfile
import time
import traceback
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from stream_overlap import ProfileWindow

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config
from asyncrl.data.lengths import long_tail_count
from asyncrl.engine.async_engine import AsyncEngine
from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.sim.model_shape import NAMED_SHAPES
from asyncrl.sim.probe import TINY_SHAPE, build_model

TOKENIZER = Path(__file__).resolve().parents[2] / "asyncrl" / "assets" / "tiny-copy"
STEPS = 4
KEPT_FILE_BYTES = 16 << 20
"""A run's top-level files up to this size come back under ``--out`` (metrics, summary, config, timeline);
checkpoints never do."""


def settings(device: str) -> dict[str, Any]:
    """Shape, dtype and workload per device: the real shape on CUDA, a tiny twin on CPU."""
    if device == "cuda":
        return {
            "shape": NAMED_SHAPES["qwen3-1.7b"],
            "dtype": torch.bfloat16,
            "median": 96,
            "max_new_tokens": 512,
            "overrides": [
                "model.dtype=float32",  # fp32 master weights (the bf16 file is upcast on load)
                "trainer.compute_dtype=bfloat16",
                "rollout.rollout_batch_size=8",
                "rollout.num_return_sequences=4",
                "engine.max_running_requests=32",
                "engine.max_model_len=768",
            ],
        }
    return {
        "shape": dataclasses.replace(TINY_SHAPE, vocab=512),  # room for the tokenizer's 384 ids
        "dtype": torch.float32,
        "median": 6,
        "max_new_tokens": 24,
        "overrides": [
            "rollout.rollout_batch_size=2",
            "rollout.num_return_sequences=4",
            "engine.max_model_len=256",
        ],
    }


def write_model(work: Path, device: str, setting: dict[str, Any]) -> Path:
    """A random-initialised model of the setting's shape and the tiny tokenizer, saved as a model directory
    under ``work`` (the temporary directory: ~4 GB at the CUDA shape)."""
    model_dir = work / "model"
    model = build_model(setting["shape"], device=torch.device(device), dtype=setting["dtype"])
    model.generation_config.eos_token_id = None  # lengths are forced (see module docstring)
    model.save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (TOKENIZER / name).is_file():
            shutil.copy(TOKENIZER / name, model_dir / name)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return model_dir


def force_long_tailed_lengths(median: float, max_new_tokens: int) -> None:
    """Every request the built-in engine admits gets a length drawn from the task's long-tailed law, seeded
    by its id, and ignores EOS (a random model's lengths say nothing)."""
    add = LLMEngine.add_request

    def forced(self: LLMEngine, request: Any) -> None:
        rng = random.Random(zlib.crc32(request.request_id.encode()))
        length = long_tail_count(rng, median=median, sigma=1.0, max_items=max_new_tokens)
        sampling = dataclasses.replace(request.sampling, max_new_tokens=length, ignore_eos=True)
        return add(self, dataclasses.replace(request, sampling=sampling))

    LLMEngine.add_request = forced  # type: ignore[method-assign]


@contextlib.contextmanager
def engine_streams_recorded() -> Iterator[list[str]]:
    """The stream mode (``EngineStream.mode``) of every built-in engine built inside, in order: what ran, not
    what was asked (CPU runs ``default`` whatever the setting)."""
    modes: list[str] = []
    init = AsyncEngine.__init__

    def recorded(self: AsyncEngine, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        modes.append(self.stream.mode)

    AsyncEngine.__init__ = recorded  # type: ignore[method-assign]
    try:
        yield modes
    finally:
        AsyncEngine.__init__ = init  # type: ignore[method-assign]


RUNS = {
    "colocated_sync": ["controller.mode=sync", "buffer.async_ratio=0", "runtime.switch.enabled=true"],
    "async_one_device": ["controller.mode=async", "buffer.async_ratio=1", "runtime.colocate=never"],
}


def run_one(
    name: str, model_dir: Path, work: Path, device: str, setting: dict[str, Any], engine_stream: str
) -> dict[str, Any]:
    """One training run, its output directory ``work/name``; its per-step breakdown, throughput, peak memory
    and the engines' stream mode."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    config = load_run_config(
        None,
        [
            f"model.path={model_dir}",
            f"model.device={device}",
            f"output_dir={work / name}",
            f"controller.num_steps={STEPS}",
            "controller.eval_prompts=0",
            "task.num_eval=4",
            f"rollout.max_new_tokens={setting['max_new_tokens']}",
            "rollout.filter=none",
            "rollout.max_additional_running_prompts=0",
            "trainer.checkpoint_every=0",
            "metrics.trackers=[jsonl]",
            f"engine.cuda_stream={engine_stream}",
            *setting["overrides"],
            *RUNS[name],
        ],
    )
    window = (
        ProfileWindow(work / name / "metrics.jsonl")
        if device == "cuda" and name == "async_one_device"
        else None
    )
    started = time.perf_counter()
    with engine_streams_recorded() as engine_streams:
        summary = asyncio.run(training.train(config, console=None))
    wall = time.perf_counter() - started
    lines = [json.loads(line) for line in Path(summary.metrics_path).read_text().splitlines() if line.strip()]
    steps = [line for line in lines if "train/version" in line]
    keep = ("time/", "train/colocate/", "weight_sync/", "samples")
    breakdown = [{k: v for k, v in line.items() if k.startswith(keep) or k == "step"} for line in steps]
    peak = (
        torch.cuda.max_memory_allocated()
        if device == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    return {
        "steps": len(steps),
        "planned_device_bytes": planned_device_bytes(config, setting["shape"]) if device == "cuda" else None,
        "wall_s": wall,
        "samples_per_s": steady_rate(steps),
        "samples_per_s_definition": "steps 2..N: trained samples / the steps' own time",
        "peak_memory_bytes": peak,
        "peak_memory_kind": "cuda max_memory_allocated" if device == "cuda" else "process peak RSS so far",
        "per_step": breakdown,
        "engine_cuda_stream_setting": engine_stream,
        "engine_streams": engine_streams,
        **({"stream_overlap": window.result()} if window is not None else {}),
    }


def keep_small_files(run_dir: Path, dest: Path) -> list[str]:
    """Copy ``run_dir``'s top-level files of at most ``KEPT_FILE_BYTES`` into ``dest``; the names copied."""
    dest.mkdir(parents=True, exist_ok=True)
    kept = []
    for path in sorted(run_dir.iterdir()) if run_dir.is_dir() else []:
        if path.is_file() and path.stat().st_size <= KEPT_FILE_BYTES:
            shutil.copy(path, dest / path.name)
            kept.append(path.name)
    return kept


def planned_device_bytes(config: Any, shape: Any) -> dict[str, int]:
    """What ``asyncrl doctor`` plans for this run's one GPU (``app.memory_plan``), to set beside the measured
    peak: per phase under the switch (the heaviest is the device's need), else the two roles resident."""
    from asyncrl.app import memory_plan as mp

    hardware = mp.Hardware("cuda", torch.cuda.get_device_properties(0).total_memory, 1)
    plan = mp.plan(config, shape, config.engine.max_model_len, hardware)
    return {device.name: device.total for device in plan.devices}


def steady_rate(steps: list[dict]) -> float:
    """Trained samples per second over the steps after the first (the first pays start-up: allocator,
    kernels, the first weight publish), from each step's own time."""
    later = steps[1:] or steps
    seconds = sum(line["time/step_s"] for line in later)
    return sum(line["samples"] for line in later) / seconds if seconds > 0 else 0.0


def checks(results: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """(name, passed, detail) of what must hold."""
    found = []
    for name, result in results.items():
        found.append((f"{name}: >= {STEPS} steps", result["steps"] >= STEPS, f"{result['steps']} steps"))
    colocated = results.get("colocated_sync", {}).get("per_step", [])
    slept = [
        s.get("train/colocate/sleep_bytes", 0) > 0 and s.get("train/colocate/wake_s") is not None
        for s in colocated
    ]
    found.append(("colocated: the engine slept and woke every step", bool(slept) and all(slept), f"{slept}"))
    empty = [s.get("train/colocate/kv_pool_bytes_while_training") == 0 for s in colocated]
    found.append(
        ("colocated: KV pool empty while the trainer trained", bool(empty) and all(empty), f"{empty}")
    )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--engine-stream",
        choices=("own", "default"),
        default="own",
        help="engine.cuda_stream of both runs: the engine on a CUDA stream of its own, or on the default one",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    setting = settings(args.device)
    result: dict[str, Any] = {
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "shape": setting["shape"].name,
        "params": setting["shape"].num_params,
        "lengths": {
            "law": "clipped log-normal",
            "median": setting["median"],
            "sigma": 1.0,
            "max": setting["max_new_tokens"],
        },
        "runs": {},
        "errors": {},
    }
    force_long_tailed_lengths(setting["median"], setting["max_new_tokens"])
    work = Path(tempfile.mkdtemp(prefix="asyncrl-colocate-"))
    try:
        model_dir = write_model(work, args.device, setting)
        for name in RUNS:
            try:
                result["runs"][name] = run_one(
                    name, model_dir, work, args.device, setting, args.engine_stream
                )
            except Exception:  # deliberate: one failed run is recorded and the other still measured
                result["errors"][name] = traceback.format_exc()
                print(f"FAIL {name}: {traceback.format_exc().splitlines()[-1]}")
            finally:  # before the next run writes its own checkpoint: one on disk at a time
                keep_small_files(work / name, args.out / name)
                shutil.rmtree(work / name, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    runs = result["runs"]
    if {"colocated_sync", "async_one_device"} <= runs.keys() and runs["colocated_sync"]["samples_per_s"] > 0:
        ratio = runs["async_one_device"]["samples_per_s"] / runs["colocated_sync"]["samples_per_s"]
        result["async_over_sync_samples_per_s"] = ratio
        print(f"MEASURED async/sync throughput on one {args.device} device: {ratio:.2f}x")
    for name, run in runs.items():
        print(f"RAN {name}: engine stream {run['engine_streams']} (engine.cuda_stream={args.engine_stream})")
        if run["planned_device_bytes"]:
            planned = max(run["planned_device_bytes"].values())
            print(
                f"MEASURED {name}: peak {run['peak_memory_bytes'] / 1e9:.2f} GB allocated against "
                f"{planned / 1e9:.2f} GB planned at its heaviest phase ({run['planned_device_bytes']})"
            )
        overlap = run.get("stream_overlap")
        if overlap is not None and "error" not in overlap:
            print(
                f"MEASURED {name}: kernels of two streams ran at once {overlap['overlap_s']:.3f} s of a "
                f"{overlap['window_s']:.3f} s profiled window (busy s per stream: {overlap['streams_busy_s']})"
            )
        elif overlap is not None:
            print(f"NOT MEASURED {name}: stream overlap ({overlap['error']})")
    outcome = checks(runs)
    result["checks"] = [{"name": n, "passed": p, "detail": d} for n, p, d in outcome]
    for name, passed, detail in outcome:
        print(f"{'PASS' if passed else 'FAIL'} {name} ({detail})")
    (args.out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    failed = bool(result["errors"]) or not all(p for _, p, _ in outcome)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
