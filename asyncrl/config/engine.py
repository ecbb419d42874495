"""Configuration of one engine replica: the backend (built-in or vLLM), batching, KV budget, weight updates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ENGINE_BACKENDS = ("builtin", "vllm")
SERVING_DTYPES = ("auto", "float32", "bfloat16", "float16")
DECODE_GRAPHS = ("auto", "on", "off")
CUDA_STREAMS = ("own", "default")


def serving_dtype(engine_dtype: str, model_dtype: str, device: str) -> str:
    """The dtype an engine serves in: ``engine.dtype`` when set, else bfloat16 on CUDA and the model's dtype
    elsewhere. Apart from the master dtype because the trainer keeps fp32 masters (a 1e-6 update vanishes in
    bf16) while serving them in fp32 doubles weight and KV bytes and every update's size."""
    if engine_dtype != "auto":
        return engine_dtype
    return "bfloat16" if device == "cuda" else model_dtype


@dataclass(frozen=True, kw_only=True)
class VLLMConfig:
    """The vLLM backend: a worker process in vLLM's own Python environment (see docs/backends.md)."""

    python: str = ""
    """Interpreter of the vLLM environment; empty: ``$ASYNCRL_VLLM_PYTHON``, else the one
    ``asyncrl backends install vllm`` made (``~/.cache/asyncrl/vllm-venv/bin/python``)."""
    dtype: str = ""
    """The dtype the worker starts vLLM in. In a run config, leave it empty: vLLM then serves what
    ``engine.dtype`` resolves to (bfloat16 on CUDA, ``model.dtype`` on CPU), the dtype the trainer casts its
    updates to; a value that differs from ``engine.dtype`` is refused, since vLLM would convert every update on
    load (and the trainer would ship fp32 bytes to a bf16 engine). Set directly (``VLLMEngineClient.start``),
    it is the dtype of a worker started without a run."""
    kv_cache_gib: float = 1.0
    """KV cache size on CPU (``VLLM_CPU_KVCACHE_SPACE``)."""
    gpu_memory_utilization: float = 0.2
    """Share of device memory vLLM may take (on CPU it sees one NUMA node's memory: keep it low)."""
    max_num_seqs: int = 64
    """Most sequences one vLLM engine runs at once (vLLM's ``max_num_seqs``, the same with tensor parallelism:
    one scheduler per engine). The backend's ``engine.max_running_requests``: the proxy sends an engine at
    most this many calls and evaluation's share is of this many per engine (``EngineConfig.slots``)."""
    tensor_parallel_size: int = 1
    """GPUs one vLLM engine shards its model over (vLLM's ``tensor_parallel_size``); the Ray placement reserves
    them together in one bundle, on one node."""
    startup_timeout_s: float = 300.0
    """Longest the worker may take to start, build vLLM's engine (load the model, compile, capture CUDA graphs)
    and answer; past it the worker and vLLM's processes are killed and the start fails naming this key. On Ray
    the driver waits at least this (plus the engine actor's own start) for the engine to be ready, whatever
    ``runtime.startup_timeout_s`` says."""
    max_lora_rank: int = 0
    """Largest LoRA rank the worker serves adapters of through vLLM's LoRA support; 0: none. A run with
    ``trainer.lora`` sets it to ``trainer.lora.rank`` when left at 0."""
    engine_args: dict[str, int | float | str | bool] = field(default_factory=dict)
    """Further ``vllm.EngineArgs`` fields, passed through; each overrides the worker's default for it
    (``enforce_eager`` and ``enable_prefix_caching``: False and True on CUDA, True and False on CPU;
    ``enable_chunked_prefill``: False on CPU; ``seed``, ``skip_tokenizer_init``, ``logprobs_mode`` ...: see
    ``worker_main.engine_kwargs``). The worker refuses an unknown name, naming the closest valid one. Not
    ``model`` (``model.path``), ``dtype`` (``engine.dtype``, the dtype the trainer casts updates to) nor
    ``max_num_seqs`` (``engine.vllm.max_num_seqs``, which the proxy caps each engine at too)."""
    request_seeds: bool | None = None
    """Send each rollout request's own seed to vLLM, so its samples do not depend on its batch mates; vLLM
    then samples it through a per-request generator, which is slower. None: on exactly when the run is
    ``deterministic: true``."""

    def __post_init__(self) -> None:
        if self.kv_cache_gib <= 0 or not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("engine.vllm.kv_cache_gib must be > 0 and gpu_memory_utilization in (0, 1]")
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"engine.vllm.tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}"
            )
        if self.max_lora_rank < 0:
            raise ValueError(f"engine.vllm.max_lora_rank must be >= 0, got {self.max_lora_rank}")
        if self.max_num_seqs < 1 or self.startup_timeout_s <= 0:
            raise ValueError("engine.vllm.max_num_seqs must be >= 1 and startup_timeout_s > 0")
        if "model" in self.engine_args:
            raise ValueError("engine.vllm.engine_args.model cannot be set: vLLM serves model.path")
        if "max_num_seqs" in self.engine_args:
            raise ValueError(
                "engine.vllm.engine_args.max_num_seqs cannot be set: the proxy sends each engine at most "
                "engine.vllm.max_num_seqs calls; set engine.vllm.max_num_seqs instead"
            )
        if "dtype" in self.engine_args:
            raise ValueError(
                "engine.vllm.engine_args.dtype cannot be set: vLLM serves engine.dtype, the dtype the trainer "
                "casts its updates to; set engine.dtype instead"
            )


DECODE_GRAPH_MIN_USES = 1
"""``engine.decode_graph_min_uses``' default, which the simulator's ``cost.decode_graph_min_uses`` repeats."""


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How one engine replica schedules requests and manages its KV cache."""

    backend: Literal["builtin", "vllm"] = "builtin"
    """builtin: asyncrl's own continuous-batching engine (CPU or CUDA, in process). vllm: a vLLM worker in
    vLLM's own environment (``engine.vllm``); the fields below that name the built-in scheduler do not apply
    to it. Modes, α, partial rollouts and routing are the same for both."""
    max_running_requests: int = 64
    """The built-in engine's slots: most requests decoding at once; further requests wait in the queue (vLLM's
    is ``engine.vllm.max_num_seqs``). The proxy sends an engine at most its slots (``EngineConfig.slots``)."""
    max_kv_tokens: int = 65536
    """KV tokens reserved across running requests: a request is admitted only when its worst-case length,
    min(prompt + max_new_tokens, max_model_len), fits in what is left (no preemption is ever needed)."""
    max_prefill_tokens_per_step: int = 2048
    """Prompt tokens prefilled per engine step, so prefill interleaves with decoding."""
    max_model_len: int | None = None
    """Longest prompt + output allowed. None: ``asyncrl train`` and ``eval`` set it to what the run can need
    (an RLVR task's longest prompt + rollout.max_new_tokens, an agentic run's env_manager.max_context_tokens;
    ``app/context_length.py``), else the model's max_position_embeddings. The KV pool holds
    max_running_requests slots of min(max_model_len, max_kv_tokens) positions each (a pool above 90 % of the
    device's free memory is refused, naming the length that fits)."""
    kv_on_update: Literal["keep", "recompute"] = "keep"
    """On a weight update, keep in-flight KV (computed by old weights) or recompute it under the new ones."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Dtype the engine serves in (weights and KV cache), apart from ``model.dtype`` (the trainer's master
    dtype): weight updates are cast to it once at publish. auto: bfloat16 on CUDA, ``model.dtype`` on CPU.
    The one serving dtype of both backends: vLLM serves it too (``engine.vllm.dtype`` may only repeat it)."""
    decode_graphs: Literal["auto", "on", "off"] = "auto"
    """How the built-in engine runs a decode step. on: at bucketed static shapes (batch 1, 2, 4, … up to
    max_running_requests; each row's KV length in powers of two, rows grouped by it), each bucket captured once as a CUDA graph on CUDA and
    replayed, run eagerly at the same shapes elsewhere. off: at the step's own shapes, eagerly. auto: on for
    CUDA, off on CPU (padding a CPU batch to its bucket costs compute that no launch overhead repays)."""
    decode_graph_min_uses: int = DECODE_GRAPH_MIN_USES
    """With CUDA graphs: a static decode shape is captured at its n-th step within a wake (the engine's life,
    or under ``runtime.switch`` one rollout: a sleep drops every graph), and runs eagerly at the same shape,
    to the same tokens, before that. A capture costs about three eager steps, repaid only by a shape run
    several steps. 1 (the default) captures every shape at first use: in simulated rollouts of the shipped
    recipes most shapes run tens to hundreds of steps and a few run one or two, and delaying every capture
    costs more than the few wasted ones (docs/backends.md, "Which shapes are captured"). Raise it where the
    GPU kit measures a capture at well over three eager steps. Not yet measured on a GPU."""
    cuda_stream: Literal["own", "default"] = "own"
    """Which CUDA stream the built-in engine's thread issues its kernels on (``engine.streams``). own: a
    stream of its own, so on one GPU its decode steps run beside the trainer's kernels (default stream) instead
    of queueing behind them, every hand-off of device memory between the two ordered; default: the device's
    default stream, shared with the trainer (serialised; kept so the GPU kit can measure both). Nothing
    changes on CPU or for vLLM."""
    seed: int = 0
    """Base seed; a request without its own seed is seeded from this and its request id."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """The vLLM backend's settings (``backend: vllm`` only)."""

    def slots(self) -> int:
        """Most requests one engine of this backend runs at once: ``max_running_requests`` for the built-in
        engine, ``vllm.max_num_seqs`` for vLLM. The one number the proxy caps each engine at and evaluation
        takes its share of, so neither is sized by a setting the engine ignores (a vLLM engine of 256 sequences
        capped at the built-in default of 64 runs a quarter full)."""
        return self.max_running_requests if self.backend == "builtin" else self.vllm.max_num_seqs

    def __post_init__(self) -> None:
        for name in ("max_running_requests", "max_kv_tokens", "max_prefill_tokens_per_step"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(
                f"engine.max_model_len must be >= 2 (a prompt token and an output token), got {self.max_model_len}"
            )
        if self.backend not in ENGINE_BACKENDS:
            raise ValueError(
                f"engine.backend must be one of {', '.join(map(repr, ENGINE_BACKENDS))}, got {self.backend!r}"
            )
        if self.dtype not in SERVING_DTYPES:
            raise ValueError(
                f"engine.dtype must be one of {', '.join(map(repr, SERVING_DTYPES))}, got {self.dtype!r}"
            )
        if self.decode_graphs not in DECODE_GRAPHS:
            raise ValueError(
                f"engine.decode_graphs must be one of {', '.join(map(repr, DECODE_GRAPHS))}, "
                f"got {self.decode_graphs!r}"
            )
        if self.decode_graph_min_uses < 1:
            raise ValueError(f"engine.decode_graph_min_uses must be >= 1, got {self.decode_graph_min_uses}")
        if self.cuda_stream not in CUDA_STREAMS:
            raise ValueError(
                f"engine.cuda_stream must be one of {', '.join(map(repr, CUDA_STREAMS))}, got {self.cuda_stream!r}"
            )
        if self.kv_on_update not in ("keep", "recompute"):
            raise ValueError(
                f"engine.kv_on_update must be one of 'keep', 'recompute', got {self.kv_on_update!r}"
            )
        if self.vllm.dtype and self.vllm.dtype != self.dtype:
            raise ValueError(
                f"engine.vllm.dtype={self.vllm.dtype!r} differs from engine.dtype={self.dtype!r}: the trainer "
                "casts every update to engine.dtype, so vLLM must serve that dtype, or it converts each "
                f"update on load; set engine.dtype={self.vllm.dtype} and leave engine.vllm.dtype empty"
            )
