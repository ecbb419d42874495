"""Measures the device at hand for the cost model: matrix products, memory and host-link bandwidth, and for
Qwen3-shaped models (random weights) decode steps over batch and KV length, prefill and packed training.

Key decision: the probe records raw timings only (every repeat, every shape), never fitted parameters, so a
GPU lent for a few minutes is spent measuring and the fit can be redone on any machine afterwards
(``asyncrl.sim.hardware``). Each section runs under a global deadline and a section that fails or would not
fit is written down as not measured, with the reason, instead of ending the run: a partial profile from a
lent GPU is worth much more than none.

Decode is measured two ways: the built-in engine's own ``ModelRunner`` (what asyncrl runs) and a static-KV
decode loop captured in a CUDA graph (no Python or launch overhead: what an optimised engine approaches).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from asyncrl.engine.architectures import architecture_of
from asyncrl.engine.model_runner import ModelRunner, RotaryTable, kv_dimensions
from asyncrl.engine.scheduler import Chunk
from asyncrl.sim.model_shape import NAMED_SHAPES, ModelShape

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


@dataclass(frozen=True, kw_only=True)
class ProbePlan:
    """What to measure: shapes, grids and sizes. ``gpu_plan()`` and ``quick_plan()`` are the two in use."""

    models: tuple[ModelShape, ...]
    dtype: str = "bfloat16"
    batches: tuple[int, ...] = (1, 4, 16, 64, 128, 256)
    kv_lengths: tuple[int, ...] = (512, 2048, 8192)
    kv_memory_fraction: float = 0.5
    """Share of the device memory free after the weights that one decode grid point's KV may take."""
    gemm_shapes: tuple[tuple[int, int, int], ...] = ((8192, 8192, 8192),)
    decode_gemm_batches: tuple[int, ...] = (1, 16, 64, 256, 1024)
    """Rows of the skinny products a decode step is made of ([rows, 4096] x [4096, 12288])."""
    decode_gemm_width: tuple[int, int] = (4096, 12288)
    bandwidth_bytes: int = 4 << 30
    host_link_bytes: int = 1 << 30
    engine_step_batches: tuple[int, ...] = (1, 16, 64, 256)
    engine_step_prompt_tokens: int = 128
    engine_step_new_tokens: int = 48
    engine_decode_graphs: str = "auto"
    """``engine.decode_graphs`` of the engine steps and runner steps timed (auto: captured static shapes on CUDA)."""
    prefill_row_tokens: tuple[int, ...] = (1024, 4096)
    prefill_tokens: int = 16384
    train_samples: int = 8
    train_sample_tokens: int = 1024
    train_row_tokens: int = 1024
    """One sample per row: the causal mask alone (a packed row's block-diagonal mask is dense work for sdpa)."""
    train_memory_fraction: float = 0.5
    """Share of free device memory the training probe may plan for (weights, gradients, AdamW, activations)."""
    warmup: int = 2
    repeats: int = 5


def gpu_plan(
    model_names: tuple[str, ...] = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"),
) -> ProbePlan:
    """The plan for one H100/H200: about five minutes with the four Qwen3 sizes."""
    return ProbePlan(models=tuple(NAMED_SHAPES[name] for name in model_names))


TINY_SHAPE = ModelShape(
    name="tiny",
    num_layers=2,
    hidden=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate=128,
    vocab=256,
)


def quick_plan() -> ProbePlan:
    """Tiny shapes for a CPU: every section runs in seconds (the test suite's check of the kit)."""
    return ProbePlan(
        models=(TINY_SHAPE,),
        dtype="float32",
        batches=(1, 4),
        kv_lengths=(16, 64),
        gemm_shapes=((128, 128, 128),),
        decode_gemm_batches=(1, 8),
        decode_gemm_width=(64, 192),
        bandwidth_bytes=8 << 20,
        host_link_bytes=1 << 20,
        engine_step_batches=(1, 4),
        engine_step_prompt_tokens=8,
        engine_step_new_tokens=6,
        prefill_row_tokens=(16,),
        prefill_tokens=64,
        train_samples=4,
        train_sample_tokens=32,
        train_row_tokens=64,
        warmup=1,
        repeats=2,
    )


@dataclass(kw_only=True)
class ProbeLog:
    """Everything measured, plus what was not and why; ``save`` writes it as JSON after every section."""

    path: Path | None
    device: dict[str, Any] = field(default_factory=dict)
    gemm: list[dict[str, Any]] = field(default_factory=list)
    bandwidth: dict[str, Any] = field(default_factory=dict)
    models: list[dict[str, Any]] = field(default_factory=list)
    not_measured: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def save(self) -> None:
        if self.path is not None:
            record = {"kind": "asyncrl.probe", "version": 1, **asdict(self)}
            del record["path"]
            self.path.write_text(json.dumps(record, indent=1) + "\n")


class Deadline:
    """The run's time budget: sections check it before starting and are recorded as skipped after it."""

    def __init__(self, budget_s: float) -> None:
        self.end = time.monotonic() + budget_s

    @property
    def left_s(self) -> float:
        return self.end - time.monotonic()


def run_probe(
    plan: ProbePlan,
    *,
    device: torch.device,
    budget_s: float,
    out: Path | None,
    say: Callable[[str], None],
    meta: dict[str, Any] | None = None,
) -> ProbeLog:
    """Measure every section of ``plan`` on ``device`` within ``budget_s`` seconds; the log is saved to
    ``out`` after each section (so a run killed at its limit still leaves what it measured). ``meta`` (the
    command, the commit) is stored beside the plan."""
    started = time.monotonic()
    deadline = Deadline(budget_s)
    log = ProbeLog(
        path=out, device=describe_device(device), meta={**(meta or {}), "plan": _plan_record(plan)}
    )
    sections: list[tuple[str, Callable[[], None]]] = [
        ("gemm", lambda: log.gemm.extend(measure_gemm(plan, device))),
        ("bandwidth", lambda: log.bandwidth.update(measure_bandwidth(plan, device))),
    ]
    for section, measure in sections:
        _run_section(section, measure, log, deadline, say)
    for shape in plan.models:
        record: dict[str, Any] = {"name": shape.name, "shape": asdict(shape), "num_params": shape.num_params}
        log.models.append(record)
        _probe_model(shape, plan, device, record, log, deadline, say)
    log.meta["wall_s"] = round(time.monotonic() - started, 1)
    log.save()
    return log


def _probe_model(
    shape: ModelShape,
    plan: ProbePlan,
    device: torch.device,
    record: dict[str, Any],
    log: ProbeLog,
    deadline: Deadline,
    say: Callable[[str], None],
) -> None:
    """The decode, engine-step and prefill sections on one inference copy of ``shape``, then training."""
    built: list[torch.nn.Module] = []
    build = lambda: built.append(build_model(shape, device=device, dtype=_DTYPES[plan.dtype]))  # noqa: E731
    if _run_section(f"{shape.name}: build", build, log, deadline, say):
        _probe_inference(built.pop(), shape, plan, record, log, deadline, say)
    _free(device)  # the inference copy is gone: training gets the whole device
    _run_section(
        f"{shape.name}: train (packed, AdamW)",
        lambda: record.update({"train": train(shape, plan, device)}),
        log,
        deadline,
        say,
    )
    _free(device)


def _probe_inference(
    model: torch.nn.Module,
    shape: ModelShape,
    plan: ProbePlan,
    record: dict[str, Any],
    log: ProbeLog,
    deadline: Deadline,
    say: Callable[[str], None],
) -> None:
    steps = [
        (
            "decode (built-in engine runner)",
            "decode_engine",
            lambda: decode_engine_runner(model, shape, plan),
        ),
        ("decode (static KV, CUDA graph)", "decode_static", lambda: decode_static(model, shape, plan)),
        ("engine step (LLMEngine)", "engine_step", lambda: engine_steps(model, plan)),
        ("prefill", "prefill", lambda: prefill(model, plan)),
    ]
    for title, key, measure in steps:
        section = f"{shape.name}: {title}"
        _run_section(section, lambda k=key, m=measure: record.update({k: m()}), log, deadline, say)


def _run_section(
    name: str, measure: Callable[[], None], log: ProbeLog, deadline: Deadline, say: Callable[[str], None]
) -> bool:
    """Run one section; False (and a line in ``not_measured``) when out of time or it failed."""
    if deadline.left_s <= 0:
        log.not_measured.append(f"{name}: skipped, the time budget was spent")
        say(f"-- {name}: skipped (time budget spent)")
        return False
    started = time.monotonic()
    try:
        measure()
    except Exception as err:  # noqa: BLE001 - a failed section is recorded and the next one runs
        log.not_measured.append(f"{name}: failed: {type(err).__name__}: {err}")
        say(f"-- {name}: FAILED {type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}")
        log.save()
        return False
    say(f"-- {name}: {time.monotonic() - started:.1f} s")
    log.save()
    return True


def describe_device(device: torch.device) -> dict[str, Any]:
    import transformers

    info: dict[str, Any] = {
        "type": device.type,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {
            "name": props.name,
            "memory_bytes": props.total_memory,
            "multiprocessors": props.multi_processor_count,
            "l2_bytes": getattr(props, "L2_cache_size", None),
            "cuda": torch.version.cuda,
            "capability": f"{props.major}.{props.minor}",
        }
    else:
        info |= {"name": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    return info


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, *, warmup: int, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls after ``warmup`` untimed ones, each call synchronised."""
    for _ in range(warmup):
        fn()
    _sync(device)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        seconds.append(time.perf_counter() - start)
    return seconds


def _point(seconds: list[float], **fields_: Any) -> dict[str, Any]:
    return {**fields_, "median_s": statistics.median(seconds), "repeats_s": [round(s, 7) for s in seconds]}


def measure_gemm(plan: ProbePlan, device: torch.device) -> list[dict[str, Any]]:
    """Dense products: the large square ones give the matrix peak; the skinny ones (a decode step's rows times
    a weight) show how far decode GEMMs are bandwidth-bound."""
    dtype = _DTYPES[plan.dtype]
    shapes = list(plan.gemm_shapes)
    k, n = plan.decode_gemm_width
    shapes += [(m, k, n) for m in plan.decode_gemm_batches]
    points = []
    for m, k_, n_ in shapes:
        a = torch.randn(m, k_, device=device, dtype=dtype)
        b = torch.randn(k_, n_, device=device, dtype=dtype)
        seconds = timed(lambda a=a, b=b: a @ b, device, warmup=plan.warmup, repeats=plan.repeats)
        median = statistics.median(seconds)
        weight_bytes = k_ * n_ * a.element_size()
        points.append(
            _point(seconds, m=m, k=k_, n=n_, dtype=plan.dtype)
            | {"flops_per_s": 2 * m * k_ * n_ / median, "weight_bytes_per_s": weight_bytes / median}
        )
    return points


def measure_bandwidth(plan: ProbePlan, device: torch.device) -> dict[str, Any]:
    """Device memory: a copy (read + write) and a reduction (read only, as decode reads weights and KV);
    host link: pinned host-to-device and device-to-host copies (weight sync through host memory)."""
    numel = plan.bandwidth_bytes // 2
    src = torch.ones(numel, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy = timed(lambda: dst.copy_(src), device, warmup=plan.warmup, repeats=plan.repeats)
    read = timed(lambda: src.sum(dtype=torch.float32), device, warmup=plan.warmup, repeats=plan.repeats)
    result = {
        "bytes": plan.bandwidth_bytes,
        "copy": _point(copy) | {"bytes_per_s": 2 * plan.bandwidth_bytes / statistics.median(copy)},
        "read": _point(read) | {"bytes_per_s": plan.bandwidth_bytes / statistics.median(read)},
    }
    if device.type == "cuda":
        host = torch.empty(plan.host_link_bytes, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(plan.host_link_bytes, dtype=torch.uint8, device=device)
        h2d = timed(lambda: dev.copy_(host, non_blocking=True), device, warmup=1, repeats=plan.repeats)
        d2h = timed(lambda: host.copy_(dev, non_blocking=True), device, warmup=1, repeats=plan.repeats)
        result["host_to_device"] = _point(h2d) | {
            "bytes_per_s": plan.host_link_bytes / statistics.median(h2d)
        }
        result["device_to_host"] = _point(d2h) | {
            "bytes_per_s": plan.host_link_bytes / statistics.median(d2h)
        }
    return result


def hf_config(shape: ModelShape, num_layers: int | None = None) -> Any:
    """A transformers ``Qwen3Config`` of a dense ``shape`` (random weights are all the probe needs)."""
    import transformers

    if shape.is_moe:
        raise ValueError(
            f"model shape {shape.name!r} is a mixture of experts: the probe builds dense models only"
        )
    return transformers.Qwen3Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=num_layers or shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        tie_word_embeddings=shape.tied_embeddings,
        max_position_embeddings=40_960,
        rms_norm_eps=1e-6,
        eos_token_id=0,
    )


def build_model(
    shape: ModelShape, *, device: torch.device, dtype: torch.dtype, num_layers: int | None = None
) -> torch.nn.Module:
    """A randomly initialised ``shape`` built directly on ``device`` in ``dtype`` (no host copy)."""
    import transformers

    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(
            hf_config(shape, num_layers), dtype=dtype, attn_implementation="sdpa"
        )
    return model.eval()


def _free(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _kv_budget_bytes(plan: ProbePlan, device: torch.device) -> int:
    """Bytes one grid point's KV may take: a share of what is free now (the weights already loaded)."""
    from asyncrl.engine.kv_cache import available_bytes

    free = available_bytes(device) or 0
    return int(free * plan.kv_memory_fraction)


def decode_grid(plan: ProbePlan, shape: ModelShape, budget_bytes: int) -> dict[int, list[int]]:
    """KV lengths to measure per batch: those whose cache (batch x length x KV bytes) fits the budget."""
    per_token = shape.kv_bytes_per_token(torch.empty(0, dtype=_DTYPES[plan.dtype]).element_size())
    return {
        batch: [length for length in plan.kv_lengths if batch * (length + 1) * per_token <= budget_bytes]
        for batch in plan.batches
    }


@dataclass(frozen=True)
class _DecodingSequence:
    """What the model runner reads of a request in decode: its slot, its tokens and its length."""

    slot: int
    token_ids: range
    num_tokens: int


def decode_engine_runner(model: torch.nn.Module, shape: ModelShape, plan: ProbePlan) -> list[dict[str, Any]]:
    """Decode steps of the built-in engine's ``ModelRunner``: ``batch`` requests, each with ``kv_len`` tokens
    in its slot, advance one token (the engine's own KV pool, masks and gathers; sampling excluded), on the
    decode path ``plan.engine_decode_graphs`` picks (auto: captured static shapes on CUDA)."""
    device = next(model.parameters()).device
    grid = decode_grid(plan, shape, _kv_budget_bytes(plan, device))
    points = []
    for batch, lengths in grid.items():
        if lengths:
            points += _runner_points(model, batch, lengths, plan)
        else:
            points.append({"batch": batch, "skipped": "no KV length of the grid fits the memory budget"})
        _free(device)  # this batch's KV pool, before the next one is allocated
    return points


def _runner_points(
    model: torch.nn.Module, batch: int, lengths: list[int], plan: ProbePlan
) -> list[dict[str, Any]]:
    """One KV pool of ``batch`` slots long enough for every length; a decode step timed at each length."""
    device = next(model.parameters()).device
    runner = ModelRunner(
        model, num_slots=batch, max_len=max(lengths), decode_graphs=plan.engine_decode_graphs
    )
    points = []
    for length in lengths:
        chunks = [
            Chunk(_DecodingSequence(slot, range(length), length), start=length - 1, num_tokens=1)
            for slot in range(batch)
        ]
        step = lambda c=chunks: runner.run([], c, batch)  # noqa: E731
        seconds = timed(step, device, warmup=plan.warmup, repeats=plan.repeats)
        points.append(_point(seconds, batch=batch, kv_len=length))
    return points


class StaticDecode:
    """One greedy decode step of ``batch`` rows at context length ``kv_len`` over a preallocated KV cache,
    every shape fixed so that the step can be captured in a CUDA graph and replayed without Python.

    Grouped-query attention without copying KV: the query heads sharing a KV head are laid out as that head's
    "query positions" ([batch, kv_heads, group, head_dim]), which the plain attention kernel handles, and a
    decode query attends to every cached position, so no mask is needed.
    """

    def __init__(self, model: torch.nn.Module, *, batch: int, kv_len: int) -> None:
        dims = kv_dimensions(model)
        device = next(model.parameters()).device
        self.model = model
        self.architecture = architecture_of(model, kv_len)
        self.rotary = self.architecture.rotary
        self.head_dim = dims["head_dim"]
        self.num_kv_heads = dims["num_kv_heads"]
        self.scale = model.model.layers[0].self_attn.scaling
        self.position = kv_len - 1
        shape = (batch, self.num_kv_heads, kv_len, self.head_dim)
        self.keys = [
            torch.zeros(shape, dtype=dims["dtype"], device=device) for _ in range(dims["num_layers"])
        ]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        table = RotaryTable(model.model.rotary_emb, max_len=kv_len, dtype=dims["dtype"], device=device)
        positions = torch.full((batch, 1), self.position, device=device)
        self.cos, self.sin = table(self.keys[0], positions)
        self.logits: torch.Tensor | None = None

    @torch.inference_mode()
    def step(self) -> None:
        inner = self.model.model
        hidden = inner.embed_tokens(self.ids)  # [batch, 1, hidden]
        for index, layer in enumerate(inner.layers):
            hidden = hidden + self._attention(index, layer.self_attn, layer.input_layernorm(hidden))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        self.logits = self.model.lm_head(inner.norm(hidden[:, -1]))  # [batch, vocab]
        self.ids.copy_(self.logits.argmax(dim=-1, keepdim=True))

    def _attention(self, index: int, attn: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        batch = hidden.shape[0]
        q, k, v = (x.transpose(1, 2) for x in self.architecture.project(attn, hidden, self.head_dim))
        q, k = self.rotary(q, k, self.cos, self.sin)  # q [batch, heads, 1, head_dim]
        self.keys[index][:, :, self.position : self.position + 1] = k
        self.values[index][:, :, self.position : self.position + 1] = v
        grouped = q.reshape(batch, self.num_kv_heads, -1, self.head_dim)  # [batch, kv_heads, group, head_dim]
        out = F.scaled_dot_product_attention(grouped, self.keys[index], self.values[index], scale=self.scale)
        return attn.o_proj(out.reshape(batch, 1, -1))


def decode_static(model: torch.nn.Module, shape: ModelShape, plan: ProbePlan) -> list[dict[str, Any]]:
    """``StaticDecode`` steps over the same grid as the engine's, replayed from a CUDA graph on CUDA (eager
    elsewhere: the record says which)."""
    device = next(model.parameters()).device
    grid = decode_grid(plan, shape, _kv_budget_bytes(plan, device))
    points = []
    for batch, lengths in grid.items():
        for length in lengths:
            decode = StaticDecode(model, batch=batch, kv_len=length)
            step = _graphed(decode.step, device)
            seconds = timed(step, device, warmup=plan.warmup, repeats=plan.repeats)
            points.append(_point(seconds, batch=batch, kv_len=length, cuda_graph=device.type == "cuda"))
            del decode, step
            _free(device)
    return points


def _graphed(step: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """``step`` captured in a CUDA graph (replay runs it), or ``step`` itself off CUDA."""
    if device.type != "cuda":
        return step
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm the kernels' workspaces outside the capture
            step()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def engine_steps(model: torch.nn.Module, plan: ProbePlan) -> list[dict[str, Any]]:
    """Whole ``LLMEngine.step()`` calls in decode (scheduler, runner, sampler, bookkeeping): ``batch`` requests
    of a short prompt sampling ``engine_step_new_tokens`` tokens each; the steps after the prefill are timed."""
    from asyncrl.config.engine import EngineConfig
    from asyncrl.engine.llm_engine import LLMEngine
    from asyncrl.types import Request, SamplingParams

    device = next(model.parameters()).device
    prompt, new = plan.engine_step_prompt_tokens, plan.engine_step_new_tokens
    points = []
    for batch in plan.engine_step_batches:
        config = EngineConfig(
            max_running_requests=batch,
            max_kv_tokens=batch * (prompt + new),
            max_prefill_tokens_per_step=batch * prompt,
            max_model_len=prompt + new,
            decode_graphs=plan.engine_decode_graphs,
            decode_graph_min_uses=1,  # captured at the first decode step, which ``warmup`` leaves untimed
        )
        engine = LLMEngine(model, config=config)
        sampling = SamplingParams(max_new_tokens=new, ignore_eos=True)
        generator = torch.Generator().manual_seed(batch)
        for index in range(batch):
            ids = torch.randint(1, model.config.vocab_size, (prompt,), generator=generator).tolist()
            engine.add_request(Request(request_id=f"probe-{index}", prompt_token_ids=ids, sampling=sampling))
        engine.step()  # the prefill
        seconds = []
        while engine.has_work():
            start = time.perf_counter()
            engine.step()
            _sync(device)
            seconds.append(time.perf_counter() - start)
        timed_steps = seconds[plan.warmup : -1] or seconds  # the last step finishes every request
        point = _point(timed_steps, batch=batch, kv_len=prompt + new // 2)
        points.append(point | {"decode_path": decode_path(engine.runner.static)})
        del engine
        _free(device)
    return points


def decode_path(static: Any) -> dict[str, Any]:
    """How an engine's decode steps ran (``ModelRunner.static``, a ``StaticDecode`` or None): at their own shapes,
    at static shapes eagerly, or replayed from CUDA graphs, then with how many captures, their seconds, the
    steps run eagerly before their shape was captured (``engine.decode_graph_min_uses``) or after its capture
    failed, the error that turned capturing off, if one did, and how many shapes ran out of memory capturing
    (eager since).
    Recorded beside step times, which mean little without it."""
    if static is None:
        return {"path": "dynamic", "captures": 0}
    if not static.capture:
        return {"path": "static shapes, eager", "captures": 0}
    failed = static.capture_error is not None
    return {
        "path": "static shapes, eager after a failed capture" if failed else "static shapes, CUDA graphs",
        "captures": static.total.captures,
        "capture_s": round(static.total.capture_s, 4),
        "steps_eager": static.total.eager_steps,
        "live_graphs": len(static.graphs),
        "capture_error": static.capture_error,
        "shapes_eager_after_oom": len(static.eager_shapes),
    }


def prefill(model: torch.nn.Module, plan: ProbePlan) -> list[dict[str, Any]]:
    """Forward passes over whole prompts (causal attention, logits of the last position only), at
    ``prefill_tokens`` tokens per pass split into rows of each length in ``prefill_row_tokens``."""
    device = next(model.parameters()).device
    points = []
    for row_tokens in plan.prefill_row_tokens:
        rows = max(1, plan.prefill_tokens // row_tokens)
        ids = torch.randint(1, model.config.vocab_size, (rows, row_tokens), device=device)

        @torch.inference_mode()
        def forward(ids: torch.Tensor = ids) -> None:
            model(input_ids=ids, use_cache=False, logits_to_keep=1)

        seconds = timed(forward, device, warmup=plan.warmup, repeats=plan.repeats)
        tokens = rows * row_tokens
        points.append(
            _point(seconds, rows=rows, row_tokens=row_tokens, tokens=tokens)
            | {"tokens_per_s": tokens / statistics.median(seconds)}
        )
    return points


def train_layers(shape: ModelShape, plan: ProbePlan, free_bytes: int | None) -> int:
    """Layers of ``shape`` the training probe can hold: all if the estimate fits, else as many as do (>= 1).

    Estimate: float32 weights, gradients and AdamW's two moments plus autocast's bf16 copy (18 B per
    parameter), plus activations of
    about 64 B per token per layer per hidden unit under bf16 autocast (no checkpointing) — generous, so a
    run does not die of OOM half-way through the probe."""
    if free_bytes is None:
        return shape.num_layers
    budget = free_bytes * plan.train_memory_fraction
    tokens = plan.train_samples * plan.train_sample_tokens
    per_layer = (
        18 * (shape.attention_params_per_layer + shape.mlp_params_per_layer) + 64 * tokens * shape.hidden
    )
    fixed = 18 * shape.embedding_params + 4 * tokens * shape.vocab  # logits of a chunk, generously
    return max(1, min(shape.num_layers, int((budget - fixed) // per_layer)))


def train(shape: ModelShape, plan: ProbePlan, device: torch.device) -> dict[str, Any]:
    """Training steps as the trainer runs them: float32 weights, ``compute_dtype`` autocast, samples packed
    into rows (``compute_token_logprobs``), a policy-gradient-shaped loss, backward and an AdamW step; plus the
    no-grad log-prob pass the trainer runs before it (old/reference log-probs)."""
    from asyncrl.engine.kv_cache import available_bytes
    from asyncrl.trainer.logprobs import autocast, compute_token_logprobs

    num_layers = train_layers(shape, plan, available_bytes(device))
    model = build_model(shape, device=device, dtype=torch.float32, num_layers=num_layers).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(
        1, shape.vocab, (plan.train_samples, plan.train_sample_tokens), generator=generator
    ).to(device)
    mask = torch.ones_like(ids)
    compute = "float32" if plan.dtype == "float32" else plan.dtype

    def logprobs() -> torch.Tensor:
        with autocast(device, compute):
            out = compute_token_logprobs(
                model, ids, mask, mask, chunk_size=1024, packed_row_tokens=plan.train_row_tokens
            )
        return out.logprobs

    def step() -> None:
        loss = -logprobs().sum() / mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def no_grad_pass() -> None:
        with torch.no_grad():
            logprobs()

    step_s = timed(step, device, warmup=plan.warmup, repeats=plan.repeats)
    forward_s = timed(no_grad_pass, device, warmup=1, repeats=plan.repeats)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    tokens = int(mask.sum())
    measured = shape.with_layers(num_layers)
    return {
        "layers_measured": num_layers,
        "layers_total": shape.num_layers,
        "params_measured": measured.num_params,
        "tokens": tokens,
        "sample_tokens": plan.train_sample_tokens,
        "row_tokens": plan.train_row_tokens,
        "compute_dtype": compute,
        "step": _point(step_s) | {"tokens_per_s": tokens / statistics.median(step_s)},
        "logprob_pass": _point(forward_s) | {"tokens_per_s": tokens / statistics.median(forward_s)},
        "peak_memory_bytes": peak,
    }


def _plan_record(plan: ProbePlan) -> dict[str, Any]:
    record = asdict(plan)
    record["models"] = [shape.name for shape in plan.models]
    return record
