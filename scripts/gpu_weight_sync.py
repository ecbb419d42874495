"""The colocated weight transport across two processes on one GPU: CUDA IPC handles, measured and checked.

A trainer process packs Qwen2-shaped random weights into device buffers (``ColocatedSync("cuda")``), hands
the update (CUDA IPC handles) to an engine process over a pipe; the engine maps the trainer's buffers and
copies them into its own device weights. Per size and repeat: publish seconds, apply seconds, GB/s end to end,
peak extra GPU memory each side (the allocator's peak above its level before: the engine's mapping of the
trainer's memory is not its allocation), and whether the engine's weights equal the trainer's bit for bit.
Beside it, the same copy inside one process (``in_process``: clone, then copy) as the floor.

NCCL broadcast needs two GPUs (NCCL refuses two ranks on one device): not measured by this script.

``--device cpu`` runs the same code over shared memory (the CPU twin), which the test suite does so this
script cannot rot between lent GPUs.

    scripts/gpu-weight-sync.sh [OUT_DIR]          # on the lent GPU machine
"""

from __future__ import annotations

import sys
from pathlib import Path

# started as a script: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import multiprocessing
import time

import torch

from asyncrl.weight_sync.colocated import ColocatedSync
from asyncrl.weight_sync.transports import make_weight_sync
from bench import harness
from bench.weight_sync import TARGETS, num_params, qwen_shapes
from bench.workloads import QUICK, QWEN2_0_5B, ModelShape

SIZES = {
    "0.5B": QWEN2_0_5B,
    "1.5B": ModelShape(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936),
    "7B": TARGETS["7B"],
}
CPU_SIZES = {"tiny": QUICK.model}


def random_state(shape: ModelShape, dtype: torch.dtype, device: str, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator(device=device).manual_seed(seed)
    return {
        name: torch.randn(dims, generator=generator, device=device, dtype=dtype) * 0.02
        for name, dims in qwen_shapes(shape).items()
    }


def checksum(state: dict[str, torch.Tensor]) -> list[int]:
    """Per tensor, the sum of its words as integers: equal lists mean equal bits (up to collisions)."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return [int(t.view(width[t.element_size()]).to(torch.int64).sum()) for t in state.values()]


def peak_extra(device: str, start: int) -> int:
    return torch.cuda.max_memory_allocated() - start if device == "cuda" else 0


def engine_main(conn, device: str) -> None:
    """The engine process: its own weights, then each update copied in from the trainer's mapped buffers."""
    params: dict[str, torch.Tensor] = {}
    while True:
        command, argument = conn.recv()
        if command == "stop":
            return
        if command == "alloc":
            params = {
                n: torch.zeros(dims, dtype=dtype, device=device) for n, (dims, dtype) in argument.items()
            }
            conn.send("ok")
            continue
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start_memory = torch.cuda.memory_allocated() if device == "cuda" else 0
        started = time.perf_counter()
        with torch.no_grad():
            for name, view in make_weight_sync("colocated").receive(argument):
                params[name].copy_(view)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        conn.send((seconds, peak_extra(device, start_memory), checksum(params)))


def arms_for(size: str, shape: ModelShape, dtype: torch.dtype, device: str, conn) -> dict:
    state = random_state(shape, dtype, device, seed=0)
    full_bytes = sum(t.numel() * t.element_size() for t in state.values())
    want = checksum(state)
    conn.send(("alloc", {n: (tuple(t.shape), dtype) for n, t in state.items()}))
    assert conn.recv() == "ok"
    local = {n: torch.zeros_like(t) for n, t in state.items()}
    sync = ColocatedSync(device)

    def measure(body) -> tuple[float, int]:
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start_memory = torch.cuda.memory_allocated() if device == "cuda" else 0
        started = time.perf_counter()
        result = body()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started, peak_extra(device, start_memory), result

    def cuda_ipc() -> dict[str, float]:
        sync.release()
        publish_s, sender_extra, update = measure(lambda: sync.publish(1, state))
        conn.send(("apply", update))
        apply_s, receiver_extra, got = conn.recv()
        seconds = publish_s + apply_s
        return {
            "seconds": seconds,
            "publish_s": publish_s,
            "apply_s": apply_s,
            "gb_per_s": full_bytes / seconds / 1e9,
            "sender_extra_mb": sender_extra / 2**20,
            "receiver_extra_mb": receiver_extra / 2**20,
            "exact": float(got == want),
            "params": float(num_params(shape)),
        }

    def in_process() -> dict[str, float]:
        def copy() -> None:
            with torch.no_grad():
                for name, tensor in state.items():
                    local[name].copy_(tensor.clone())

        seconds, extra, _ = measure(copy)
        return {"seconds": seconds, "gb_per_s": full_bytes / seconds / 1e9, "sender_extra_mb": extra / 2**20}

    label = str(dtype).removeprefix("torch.")
    kind = "cuda_ipc" if device == "cuda" else "shm"
    return {f"{kind}/{size}/{label}": cuda_ipc, f"in_process/{size}/{label}": in_process}, sync


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "weight_sync_cuda")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--sizes", default=",".join(SIZES), help="of " + ", ".join(SIZES))
    args = parser.parse_args()
    args.quick = args.quick or args.device == "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to measure here (--device cpu runs the shared-memory twin)")
        return
    sizes = CPU_SIZES if args.device == "cpu" else {s: SIZES[s] for s in args.sizes.split(",")}
    context = multiprocessing.get_context("spawn")
    conn, theirs = context.Pipe()
    engine = context.Process(target=engine_main, args=(theirs, args.device), daemon=True)
    engine.start()
    raw = {}
    try:
        for size, shape in sizes.items():
            for dtype in (torch.bfloat16, torch.float32) if size == next(iter(sizes)) else (torch.bfloat16,):
                arms, sync = arms_for(size, shape, dtype, args.device, conn)
                raw |= harness.run_arms(arms, harness.repeats_for(args), harness.print_run, warmup=True)
                sync.release()
                del arms, sync
                if args.device == "cuda":
                    torch.cuda.empty_cache()
    finally:
        conn.send(("stop", None))
        engine.join(60)
    resources = {"all_arms": f"trainer and engine: two processes on one {args.device} device, one at a time"}
    setup = {
        "sizes": {name: num_params(shape) for name, shape in sizes.items()},
        "nccl": "not measured: NCCL needs one GPU per rank and this machine has one",
    }
    harness.write_result(args, "weight_sync_cuda", raw, resources=resources, setup=setup)


if __name__ == "__main__":
    main()
