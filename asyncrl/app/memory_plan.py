"""What each role of a run holds on each GPU, from the model's shape and the config alone (``asyncrl doctor``).

Key decision: the plan is a list of named terms per role, each a small pure function of the shape and the
config whose arithmetic a user can redo (the term says what it counts), summed per role and per device the
roles share. It plans for a hardware profile without that hardware present, so an impossible run is refused
on a laptop before it loads tens of GB on a rented GPU. The terms follow the code paths as they are:

- trainer rank (one per ``trainer.num_workers``, each on its own GPU; FSDP2 shards over them): master weights,
  gradients while a mini-batch accumulates and steps (sharded, or whole fp32 while an unsharded accumulation
  holds them; freed after every optimizer step, so never held between steps), AdamW's two moments and one
  foreach scratch of the optimizer step, a frozen reference copy when the loss needs one, the compute-dtype
  weight copies (autocast's cache, or FSDP's unsharded layers), activations of one micro-batch with or without
  checkpointing, the dense attention masks (and eager's softmax) of its rows under ``sdpa``/``eager``
  (``attention_square_bytes``; none under flex or flash attention), one logits chunk (checkpointed: the larger of it and one layer's recompute), the critic (at
  ``critic.model_path``'s own shape where its ``config.json`` is here, ``sim.critic_shape``, or at the shape
  the caller resolved: ``asyncrl plan``'s ``memory.critic_model``) or value head, and the copy a weight sync
  publishes;
- built-in engine: weights in the serving dtype (``engine.dtype``) plus its preallocated KV pool
  (``engine.max_running_requests`` slots of ``min(max_model_len, max_kv_tokens) + 1`` positions, as
  ``engine.kv_cache.pool_bytes``), a step's scratch (its padded prefill through one layer, the decode logits and
  the sampler's blocks: ``engine_step_terms``), and one update bucket being received (a staged broadcast keeps the
  whole update in host memory: counted when the plan is of host memory, ``device="cpu"``; a streamed one
  holds one bucket; the colocated transport none: its engine maps the trainer's packed blocks);
- vLLM engine: the ``gpu_memory_utilization`` share of each of its ``tensor_parallel_size`` GPUs, which must hold
  its weights shard and one longest request's KV, plus, with the broadcast transport, what its worker receives
  on the device beside that share: two buffers when staged (the one in flight, and room for the previous one
  while the allocator or the process group still holds it; each is copied to host memory as it arrives, where
  the whole update waits: counted when the plan is of host memory), two buckets when streamed (each bucket is loaded as it arrives; a
  layer still collecting its weights keeps its buckets alive, so a layer larger than a bucket counts whole). A
  bucket is ``weight_sync.bucket_mb``, or the embedding where that is larger (a tensor travels whole).

A role's peak is what it always holds (``HELD``) plus its heaviest transient phase: forward/backward, the
optimizer step and a weight sync never overlap, so their terms are not summed together. Roles sharing a device
(inline: the trainer and its engines; on Ray, colocated: a trainer rank and its engine) are summed at their
peaks when both stay resident; under ``runtime.switch`` they take turns, and the device is planned phase by phase
(``switch_devices``: the trainer training, publishing, the engine applying the update, generating), each phase
counting what is alive then: the device needs the heaviest phase, not the two peaks added.

Left out, and why the verdict keeps a margin: the CUDA context and NCCL buffers (``DEVICE_RESERVE``), the
allocator's fragmentation, and the built-in engine's per-step scratch beyond its prefill layer, decode logits and
sampling (``engine_step_terms``): its prefill attention mask (query group × prefill tokens × context bytes, and
the kernel's additive copy of it), the keys and values a prefill gathers per layer, and the decode graphs'
per-layer intermediates. No attention scores: the
engine's attention is laid out as plain multi-head attention so that CUDA's memory-efficient kernel takes it
(``engine.model_runner.grouped_attention``; read from torch's kernel selection, not measured).

LoRA adapters, their gradients and AdamW's moments are float32 whatever the master dtype (``LORA_BYTES``: peft
casts them). A GPU run's host RAM is planned per node (``host_plan``): the terms its roles keep there (a staged
broadcast's whole update, a switched trainer's offloaded state, a sleeping engine's weights, vLLM's bucket files,
Ray's object store), built from the GPU roles' own terms, with what it leaves out stated (``HOST_NOT_COUNTED``).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.config.engine import serving_dtype
from asyncrl.config.run import RunConfig
from asyncrl.config.runtime import SwitchConfig
from asyncrl.runtime.placement import is_colocated
from asyncrl.sim.critic_shape import CriticShape, resolve_critic_shape
from asyncrl.sim.model_shape import NAMED_SHAPES, ModelShape

if TYPE_CHECKING:  # resolved where a profile is named (``hardware_named``), as before
    from asyncrl.sim.hardware import HardwareProfile

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GB = 1e9
HOST_BYTES = int(2e12)
"""One node's host RAM where a profile names none: a DGX node's 2 TB (``HardwareProfile.host_memory_bytes``)."""
LORA_BYTES = 4
"""Bytes per LoRA adapter element whatever ``model.dtype`` is: ``peft.get_peft_model``'s default
``autocast_adapter_dtype=True`` (which ``trainer.lora.attach_lora`` keeps) casts bf16/fp16 adapters to float32,
so their gradients and AdamW moments are float32 too (measured: ``test_memory_plan``'s LoRA test)."""
DEVICE_RESERVE = int(1.5 * 2**30)
"""CUDA context, cuBLAS workspaces and NCCL buffers: not in any term, taken off every device before fitting."""
MARGIN = 0.9
"""A device whose plan exceeds this share of what is left after ``DEVICE_RESERVE`` is tight: allocator
fragmentation and the terms' roundings live in the rest."""
KV_POOL_SHARE = 0.9
"""The share of free device memory the built-in engine lets its KV pool take (``llm_engine``'s check)."""
FSDP_PREFETCHED_LAYERS = 2
"""Unsharded layers FSDP2 holds at once in the compute dtype: the one running and the one prefetched."""
LOGITS_COPIES = 4
"""fp32 ``[chunk, vocab]`` blocks alive while one checkpointed chunk runs backward: logits, log-softmax,
the softmax of its entropy, and the gradient flowing back. The projection makes no block of its own in the compute
dtype: it writes the float32 logits directly (``models.float32_projection``), from weight slices of
``SLICE_ROWS`` rows where the head must be cast (whole, with no copy, where it need not): their cast copies and
float32 products, ~0.2 GB at 8B's shape, are left out, being smaller
than what the projection no longer makes under autocast (the bf16 logits block, and a bf16 copy of the head's
gradient before its float32 cast: 1.2 GB at 8B). Measured on CPU under bf16 autocast (vocab 30,000, hidden 1,024,
chunk 1,024): the chunk's peak, the weight's gradient (one block at that shape) included, fell from 5.5 to 5.0
blocks when the bf16 logits went; unchanged without autocast. Not measured on CUDA (no GPU here)."""


PREFILL_PADDING = 2
"""A built-in engine step's prefill is padded to at most this many times its real tokens
(``engine.model_runner.padding_groups``' ``max_padding``), which ``max_prefill_tokens_per_step`` bounds."""
SAMPLING_BYTES = 16
"""Bytes per ``[rows, vocab]`` element at the sampler's peak (``engine.sampler._sample``): float32 blocks of the
logits the runner stacks, their log-probs, and the inverse-CDF draw's probabilities and cumulative sum."""
TRUNCATION_BYTES = 37
"""Bytes per sorted element a truncating draw adds while the logits and log-probs stay (``sampler._truncate``):
the sorted log-probs (4) and their int64 order (8), the mass before each (4), the drop mask (1), the kept and
the renormalised log-probs (4 + 4), and the sort's own temporary, taken as one more copy of values and order
(12: torch's CUDA sort is not read here, so an assumption)."""


HELD = "held"
"""A term's phase: alive the whole run (weights, optimizer state, KV pool)."""
PHASES = ("train", "step", "sync")
"""Transient phases that never overlap: forward/backward, the optimizer step, publishing weights."""
STEPPING = "train+step"
"""The phase of gradients: alive from a mini-batch's first backward through its optimizer step, freed after it
(``Trainer._free_gradients``), so counted in both phases and in neither a sync nor between steps (while a
switched engine generates)."""


@dataclass(frozen=True)
class Term:
    """One named quantity on one GPU, with the arithmetic that made it, and when it is alive."""

    name: str
    bytes: int
    how: str
    phase: str = HELD
    """``HELD``, one of ``PHASES``, or several joined by ``+`` (``STEPPING``)."""

    def alive_in(self, phase: str) -> bool:
        return phase in self.phase.split("+")

    def line(self) -> str:
        when = "" if self.phase == HELD else f", {self.phase}"
        return f"{self.name} {self.bytes / GB:.2f} ({self.how}{when})"


@dataclass(frozen=True)
class Role:
    """``count`` instances of one role, each spanning ``gpus_each`` GPUs; ``terms`` are per GPU."""

    name: str
    count: int
    gpus_each: int
    terms: tuple[Term, ...]

    def phase_bytes(self, phase: str) -> int:
        return sum(t.bytes for t in self.terms if t.alive_in(phase))

    @property
    def peak_phase(self) -> str:
        """The transient phase that weighs most (what the peak is held plus)."""
        return max(PHASES, key=self.phase_bytes)

    @property
    def total(self) -> int:
        """The peak: what is always held plus the heaviest transient phase."""
        return self.phase_bytes(HELD) + self.phase_bytes(self.peak_phase)

    @property
    def largest(self) -> Term:
        return max(self.terms, key=lambda t: t.bytes)


@dataclass(frozen=True)
class Device:
    """One GPU (or, inline, the one device) and the roles that share it."""

    name: str
    roles: tuple[tuple[Role, int], ...]
    """Each role with how many of its instances sit on this device."""

    @property
    def total(self) -> int:
        return sum(role.total * n for role, n in self.roles)

    def largest(self) -> tuple[Role, Term]:
        """The role and term that weigh most here (what a FAIL names)."""
        return max(((r, r.largest) for r, _ in self.roles), key=lambda pair: pair[1].bytes)


@dataclass(frozen=True)
class Hardware:
    """The GPUs a plan targets: named from a spec profile, given as JSON, or this machine's."""

    name: str
    device_bytes: int
    num_gpus: int
    gpus_per_node: int = 8
    reserve: int = DEVICE_RESERVE
    """Bytes no term may use: ``DEVICE_RESERVE`` on a profile, what is already taken on a live GPU."""
    host_bytes: int = HOST_BYTES
    """One node's host RAM (``host_plan``'s verdict)."""

    @property
    def usable_bytes(self) -> int:
        return self.device_bytes - self.reserve


@dataclass(frozen=True)
class Plan:
    """The run's roles (trainer rank, engine) and the devices they occupy, each with its colocated sum."""

    roles: tuple[Role, ...]
    devices: tuple[Device, ...]


# ---- hardware and shapes -----------------------------------------------------------------------------------


def hardware_named(spec: str, num_gpus: int | None = None, host_gb: float | None = None) -> Hardware:
    """``h100``, ``h200`` (any ``asyncrl.sim`` profile name), a JSON object, or a JSON file: ``{"name": ...,
    "memory_gb": 80, "gpus_per_node": 8, "host_memory_gb": 2000}`` (``hbm_bytes`` in place of ``memory_gb``
    and ``host_memory_bytes`` in place of ``host_memory_gb`` also read); ``host_gb`` (``--host-gb``) overrides
    the node's host RAM as ``num_gpus`` (``--gpus``) does the GPU count."""
    text = spec.strip()
    if text.startswith("{") or text.endswith(".json"):
        data = json.loads(text if text.startswith("{") else Path(text).read_text())
        if not isinstance(data, dict):
            raise ValueError(f"--hardware {spec!r}: a JSON object is needed")
        if "memory_gb" in data:
            device_bytes = int(float(data["memory_gb"]) * GB)
        elif "hbm_bytes" in data:
            device_bytes = int(float(data["hbm_bytes"]))
        else:
            raise ValueError(f"--hardware {spec!r}: give memory_gb (or hbm_bytes)")
        per_node = int(data.get("gpus_per_node", 8))
        name = str(data.get("name", "custom"))
        if "host_memory_gb" in data:
            host = int(float(data["host_memory_gb"]) * GB)
        else:
            host = int(float(data.get("host_memory_bytes", HOST_BYTES)))
    else:
        from asyncrl.sim.hardware import resolve_profile

        return profile_hardware(resolve_profile(text), spec, num_gpus, host_gb)
    return _hardware(spec, name, device_bytes, per_node, host, num_gpus, host_gb)


def profile_hardware(
    profile: HardwareProfile, spec: str, num_gpus: int | None = None, host_gb: float | None = None
) -> Hardware:
    """The GPUs and host RAM of a simulator profile (``spec``: how it was named, for errors): what
    ``hardware_named`` makes of a profile name, and what ``asyncrl plan`` plans its candidates on."""
    device_bytes, host = int(profile.hbm_bytes), int(profile.host_memory_bytes)
    return _hardware(spec, profile.name, device_bytes, profile.gpus_per_node, host, num_gpus, host_gb)


def _hardware(
    spec: str,
    name: str,
    device_bytes: int,
    per_node: int,
    host: int,
    num_gpus: int | None,
    host_gb: float | None,
) -> Hardware:
    """``Hardware`` with ``--gpus`` (``num_gpus``; default one node's) and ``--host-gb`` applied, refusing a
    device too small to plan in, no GPUs, or no host RAM."""
    if device_bytes <= DEVICE_RESERVE:
        raise ValueError(f"--hardware {spec!r}: {device_bytes} bytes per GPU leaves nothing to plan in")
    gpus = per_node if num_gpus is None else num_gpus
    if gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {gpus}")
    if host_gb is not None:
        host = int(host_gb * GB)
    if host <= 0:
        raise ValueError(f"--host-gb (host_memory_gb) must be > 0, got {host / GB:g} GB")
    return Hardware(name, device_bytes, gpus, per_node, host_bytes=host)


def shape_named_like(model_path: str) -> ModelShape | None:
    """The simulator's shape whose name the hub id ends with (``Qwen/Qwen3-8B-Base`` → ``qwen3-8b``)."""
    name = model_path.rsplit("/", 1)[-1].lower()
    for suffix in ("-base", "-instruct"):
        name = name.removesuffix(suffix)
    return NAMED_SHAPES.get(name)


# ---- terms: small pure functions ---------------------------------------------------------------------------


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def layer_activation_bytes_per_token(shape: ModelShape, element: int) -> int:
    """What one decoder layer saves for backward per token (HF Llama/Qwen layer, SDPA attention): each
    RMSNorm's input, normalised value and output (6·hidden); about six tensors each of q, k and v width (the
    projections, Qwen3's q/k norms, rotary's input and output, the attention's inputs, its output and o_proj's
    input: 6·(q + 2·kv)); and the MLP's gate, up, activation and product (4·intermediate). Counted from the
    layer's code and checked against the CPU allocator (``tests/unit/app/test_memory_measured.py``)."""
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    width = shape.intermediate if not shape.is_moe else shape.expert_intermediate * shape.num_active_experts
    return element * (6 * shape.hidden + 6 * (q + 2 * kv) + 4 * width)


def prefill_layer_bytes_per_token(shape: ModelShape, element: int) -> int:
    """What one decoder layer of the built-in engine's prefill holds at once per token, under inference mode
    (``engine.model_runner._forward``, nothing kept for backward): at the MLP, the heavier half of a Llama/Qwen
    layer at every shape here, the residual stream, its normed copy and the sum the residual add makes (3 ×
    hidden), and the activated gate, the up projection and their product (3 × intermediate); the attention
    half holds less (its projections, rotary's and the grouped query's copies: about 2 × hidden + 5 × q +
    4 × kv). Read from the code; the engine's total is checked against the CPU allocator
    (``tests/unit/app/test_memory_measured.py``)."""
    width = shape.intermediate if not shape.is_moe else shape.expert_intermediate * shape.num_active_experts
    return element * (3 * shape.hidden + 3 * width)


def activation_bytes(
    shape: ModelShape, tokens: int, element: int, residual_element: int, checkpointing: bool
) -> int:
    """One micro-batch's saved activations: every layer's (no checkpointing), or every layer's input in the
    residual dtype (checkpointing; the one layer recomputed at a time is ``recompute_bytes``)."""
    if not checkpointing:
        return shape.num_layers * tokens * layer_activation_bytes_per_token(shape, element)
    return shape.num_layers * tokens * shape.hidden * residual_element


SQUARE_ATTENTION = ("sdpa", "eager")
"""``model.attn_implementation``s whose packed or padded rows get a dense ``[rows, 1, W, W]`` mask
(``trainer.packing``); flex attention's block mask and flash-attn's variable-length kernels have no ``W²`` term."""


def mask_area(config: RunConfig, tokens: int, max_len: int | None) -> tuple[int, int]:
    """(rows × W², W) of one micro-batch's attention masks: packed, rows are filled up to ``W`` = the larger
    of ``trainer.packed_row_tokens`` and the longest sample (``max_len``; unknown: the micro-batch), padded they
    are as wide as the longest sample; never wider than the micro-batch's ``tokens``."""
    longest = tokens if max_len is None else max_len
    trainer = config.trainer
    width = max(trainer.packed_row_tokens, longest) if trainer.sequence_packing else longest
    width = min(width, tokens)
    return ceil_div(tokens, width) * width * width, width


def attention_square_bytes(
    config: RunConfig, shape: ModelShape, tokens: int, max_len: int | None, compute: int, residual: int
) -> tuple[int, int]:
    """(the mask, what each layer keeps for backward) in bytes, of a micro-batch's dense attention masks.

    ``sdpa`` builds a bool mask once per forward, and torch's sdpa converts it to an additive mask in the
    query's dtype in every layer and keeps that for backward; ``eager`` builds a float mask (the embeddings'
    dtype) once and keeps every head's softmax in float32 (and its copy in the compute dtype) per layer. The
    mask itself is freed after the forward, except under activation checkpointing, where it is the checkpointed
    layers' input. Measured on CPU against the allocator, to the byte (``tests/unit/app/test_memory_attention.py``);
    on CUDA the memory-efficient kernel that takes sdpa's mask is assumed to keep it the same way (not measured:
    no GPU here). (0, 0) under flex or flash attention."""
    attention = config.model.attn_implementation
    if attention not in SQUARE_ATTENTION:
        return 0, 0
    area, _ = mask_area(config, tokens, max_len)
    if attention == "sdpa":
        return area, area * compute
    softmax = 4 + (compute if compute != 4 else 0)
    return area * residual, area * shape.num_heads * softmax


def logits_chunk_bytes(shape: ModelShape, chunk: int, tokens: int) -> int:
    """One checkpointed ``[chunk, vocab]`` block in fp32, ``LOGITS_COPIES`` times (``trainer.logprobs``)."""
    return LOGITS_COPIES * min(chunk, tokens) * shape.vocab * 4


def kv_pool_bytes(shape: ModelShape, slots: int, positions: int, element: int) -> int:
    """The built-in engine's pool: K and V of every layer for ``slots`` × ``positions`` (scratch included)."""
    return slots * (positions + 1) * shape.kv_bytes_per_token(element)


# ---- roles -------------------------------------------------------------------------------------------------


def _gb(n: int) -> str:
    return f"{n / GB:.2f} GB"


def trainer_role(
    config: RunConfig,
    shape: ModelShape,
    device: str = "cuda",
    critic: CriticShape | None = None,
    max_len: int | None = None,
) -> Role:
    """One trainer rank's terms per GPU (``trainer.num_workers`` ranks, FSDP2-sharded when more than one);
    a separate critic at ``critic`` where given, else at ``critic.model_path``'s shape (``_critic_terms``);
    ``max_len`` (the longest sample) bounds the attention masks' rows (None: as wide as a micro-batch)."""
    ranks = config.trainer.num_workers
    master = DTYPE_BYTES[config.model.dtype]
    compute = _compute_bytes(config, master)
    residual = master if ranks == 1 else compute  # autocast keeps the residual stream in the master dtype
    tokens = config.trainer.max_tokens_per_microbatch
    terms = [
        *_state_terms(config, shape, master),
        *_weight_copy_terms(shape, ranks, master, compute),
        *_activation_terms(config, shape, tokens, compute, residual, max_len),
        *_critic_terms(config, shape, critic, master, ranks, tokens, compute, residual, max_len),
        _publish_term(config, shape, device),
        *_retained_update_terms(config, shape, device),
    ]
    return Role("trainer rank", ranks, 1, tuple(terms))


def _state_terms(config: RunConfig, shape: ModelShape, master: int) -> list[Term]:
    """What a rank holds between steps: its share of the weights, adapters, AdamW's moments and the reference
    policy; and its gradients while a mini-batch trains and steps (whole on every rank when accumulated
    unsharded)."""
    trainer = config.trainer
    ranks = trainer.num_workers
    params = shape.num_params
    lora = trainer.lora
    trainable = shape.lora_params(lora.rank) if lora is not None else params
    element = LORA_BYTES if lora is not None else master  # what the trained weights, grads and moments are in
    shard = f" / {ranks} ranks" if ranks > 1 else ""
    terms = [Term("master weights", ceil_div(params * master, ranks), f"{params:,} × {master} B{shard}")]
    if lora is not None:
        how = f"rank {lora.rank} on every linear, {trainable:,} × {element} B (peft's float32){shard}"
        terms.append(Term("LoRA adapters", ceil_div(trainable * element, ranks), how))
    grads = _gradient_term("gradients", trainable, element, ranks, trainer.fsdp_grad_accumulation)
    moments = ceil_div(2 * trainable * element, ranks)
    terms += [
        grads,
        Term("optimizer state", moments, f"AdamW's 2 moments × {trainable:,} × {element} B{shard}"),
        Term("optimizer scratch", moments // 2, "one foreach temporary, the size of a moment", "step"),
    ]
    if config.loss.needs_reference and lora is None:
        terms.append(
            Term("reference copy", ceil_div(params * master, ranks), "frozen policy for the KL term")
        )
    return terms


def _gradient_term(name: str, params: int, element: int, ranks: int, accumulation: str) -> Term:
    """Gradients sharded like the weights, or whole fp32 on every rank when FSDP2 accumulates them unsharded
    (``trainer.fsdp_grad_accumulation``: no reduce-scatter until the mini-batch's last pass); alive only while
    a mini-batch trains and steps (``STEPPING``)."""
    if ranks > 1 and accumulation != "sharded":
        return Term(name, params * 4, f"{params:,} × 4 B whole (unsharded fp32 accumulation)", STEPPING)
    shard = f" / {ranks} ranks" if ranks > 1 else ""
    return Term(name, ceil_div(params * element, ranks), f"{params:,} × {element} B{shard}", STEPPING)


def _weight_copy_terms(shape: ModelShape, ranks: int, master: int, compute: int) -> list[Term]:
    """The weights the forward runs on beside the masters: FSDP2's gathered layers, or autocast's copies."""
    if ranks > 1:  # FSDP2 all-gathers each layer (and the root's embeddings) before it runs
        per_layer = (shape.num_params - shape.embedding_params) // shape.num_layers
        return [
            Term(
                "unsharded layers",
                (FSDP_PREFETCHED_LAYERS * per_layer + shape.embedding_params) * compute,
                f"{FSDP_PREFETCHED_LAYERS} gathered layers + embeddings in {compute} B",
                "train",
            )
        ]
    if compute != master:
        return [
            Term(
                "compute copies",
                shape.num_params * compute,
                f"autocast's {compute} B copy of each weight",
                "train",
            )
        ]
    return []


def _activation_terms(
    config: RunConfig, shape: ModelShape, tokens: int, compute: int, residual: int, max_len: int | None
) -> list[Term]:
    """A micro-batch's activations, its attention masks and its logits chunk; with checkpointing, backward
    recomputes one layer (with its mask copy) or one logits chunk at a time, never both."""
    trainer = config.trainer
    ckpt = trainer.activation_checkpointing
    logits = logits_chunk_bytes(shape, trainer.logprob_chunk_size, tokens)
    logits_how = f"{LOGITS_COPIES} × {min(trainer.logprob_chunk_size, tokens)} × {shape.vocab:,} × 4 B"
    how = (
        f"{tokens:,} tokens/micro-batch: each layer's input (checkpointing)"
        if ckpt
        else f"{tokens:,} tokens/micro-batch, every layer's (no checkpointing)"
    )
    activations = Term("activations", activation_bytes(shape, tokens, compute, residual, ckpt), how, "train")
    mask, per_layer = attention_square_bytes(config, shape, tokens, max_len, compute, residual)
    masks = _mask_terms(config, shape, tokens, max_len, mask, per_layer, layers=0 if ckpt else None)
    if not ckpt:
        return [activations, *masks, Term("logits chunk", logits, logits_how, "train")]
    layer = tokens * layer_activation_bytes_per_token(shape, compute) + per_layer
    recompute = Term(
        "recompute",
        max(layer, logits),
        f"the larger of one layer's activations {layer / GB:.2f} (its attention mask copy included) and a "
        f"logits chunk ({logits_how})",
        "train",
    )
    return [activations, *masks, recompute]


def _mask_terms(
    config: RunConfig,
    shape: ModelShape,
    tokens: int,
    max_len: int | None,
    mask: int,
    per_layer: int,
    layers: int | None,
) -> list[Term]:
    """The attention masks' term (``attention_square_bytes``): every layer's copy kept for backward (``layers``
    None), or under checkpointing the mask the checkpointed layers keep as their input plus ``layers`` layers'
    copies (the policy's recomputed layer is counted in ``recompute`` instead: 0)."""
    if not mask:
        return []
    _, width = mask_area(config, tokens, max_len)
    attention = config.model.attn_implementation
    copy = "its float copy" if attention == "sdpa" else f"{shape.num_heads} heads' softmax"
    if layers is None:
        kept, what = shape.num_layers * per_layer, f"{copy} in each of {shape.num_layers} layers"
    else:
        kept = mask + layers * per_layer
        what = "the mask, the checkpointed layers' input" + (f" + {copy} in {layers} layer" if layers else "")
    how = f"{attention}: rows of {width:,} tokens, {tokens:,} tokens/micro-batch: {what}"
    return [Term("attention masks", kept, how, "train")]


def _compute_bytes(config: RunConfig, master: int) -> int:
    """Bytes per element the forward computes in: FSDP2's bf16 mixed precision, autocast's ``compute_dtype``
    (a no-op for float32, ``trainer.logprobs.autocast``), else the master dtype."""
    if config.trainer.num_workers > 1:
        return 2 if config.trainer.mixed_precision == "bf16" else master
    compute = config.trainer.compute_dtype
    return master if compute == "float32" else DTYPE_BYTES[compute]


def _critic_terms(
    config: RunConfig,
    shape: ModelShape,
    body: CriticShape | None,
    master: int,
    ranks: int,
    tokens: int,
    compute: int,
    residual: int,
    max_len: int | None = None,
) -> list[Term]:
    """The value head on the policy's trunk, or a separate critic at its own shape: ``body`` where the caller
    resolved one (``asyncrl plan``'s, from ``sim.trained``: one shape for memory and time), else
    ``critic.model_path``'s ``config.json`` where it can be read, else the policy's, the reason stated
    (``sim.critic_shape``); a separate critic's forward makes its own attention masks (``_mask_terms``)."""
    critic = config.critic
    if critic is None:
        return []
    if critic.type == "shared_trunk":
        head = shape.hidden + 1
        how = "weights, 2 moments and a step's gradients of hidden + 1 (tens of KB: one held term)"
        return [Term("value head", 4 * head * master, how)]
    if body is None:
        body = resolve_critic_shape(critic, shape)
    trainer = config.trainer
    ckpt = trainer.activation_checkpointing
    terms = separate_critic_terms(
        body, master, ranks, tokens, compute, residual, ckpt, trainer.fsdp_grad_accumulation
    )
    mask, per_layer = attention_square_bytes(config, body.shape, tokens, max_len, compute, residual)
    masks = _mask_terms(config, body.shape, tokens, max_len, mask, per_layer, layers=1 if ckpt else None)
    return terms + [replace(term, name=f"critic {term.name}") for term in masks]


def separate_critic_terms(
    critic: CriticShape,
    master: int,
    ranks: int,
    tokens: int,
    compute: int,
    residual: int,
    ckpt: bool,
    accumulation: str,
) -> list[Term]:
    """A separate critic's body (no output layer) trained in full beside the policy: its weights, gradients and
    AdamW's two moments (sharded like the policy's; its gradients accumulate like the policy's, the trainer
    syncing both modules the same way, and are freed after each step like the policy's), and one micro-batch's
    activations through its layers. The held terms are apart because ``runtime.switch`` offloads each with
    the policy's own (``trainer.offload.StateOffloader`` moves the critic's module and optimizer too:
    ``OFFLOADABLE``)."""
    params = critic.shape.body_params
    shard = f" / {ranks} ranks" if ranks > 1 else ""
    saved = "each layer's input (checkpointing)" if ckpt else "every layer's (no checkpointing)"
    each = ceil_div(params * master, ranks)
    return [
        Term("critic weights", each, f"{params:,} × {master} B{shard}, at {critic.source}"),
        _gradient_term("critic gradients", params, master, ranks, accumulation),
        Term(
            "critic optimizer state",
            ceil_div(2 * params * master, ranks),
            f"AdamW's 2 moments × {params:,} × {master} B{shard}",
        ),
        Term(
            "critic activations",
            activation_bytes(critic.shape, tokens, compute, residual, ckpt),
            f"{tokens:,} tokens/micro-batch, {saved}, at the critic's shape",
            "train",
        ),
    ]


def _published_params(config: RunConfig, shape: ModelShape) -> int:
    """What a publication carries: the LoRA adapter under ``trainer.lora``, else the whole model."""
    lora = config.trainer.lora
    return shape.lora_params(lora.rank) if lora is not None else shape.num_params


def packed_copy(config: RunConfig, shape: ModelShape, device: str = "cuda") -> Term:
    """What a switched trainer rank (``runtime.switch``, the colocated transport) packs for the engine in its
    bundle: the whole publication in the serving dtype, alive from publication until that engine applied it
    (``runtime.colocate.ColocatedTrainer.weights_applied``)."""
    serve = engine_serve_bytes(config, device)
    params = _published_params(config, shape)
    how = f"{params:,} × {serve} B packed for the engine, from publication until it applied them"
    return Term("packed copy", params * serve, how, "sync")


def _publish_term(config: RunConfig, shape: ModelShape, device: str) -> Term:
    """Inline: the transport's one copy of the served model (``in_process``'s update, ``colocated``'s blocks),
    fed one serving cast at a time (``Trainer.serving_tensors``), so no dict of casts beside it; the one
    tensor being cast at a time is left to the margin. On Ray: one gathered bucket."""
    serve = engine_serve_bytes(config, device)
    params = _published_params(config, shape)
    if config.runtime.type == "inline":
        how = f"the whole model in {serve} B at each sync (in process, cast a tensor at a time)"
        return Term("publish copy", params * serve, how, "sync")
    bucket = largest_bucket(config, shape, serve)
    return Term("staging copy", min(bucket, params * serve), "one gathered bucket (the largest)", "sync")


def _retained_update_terms(config: RunConfig, shape: ModelShape, device: str) -> list[Term]:
    """Inline with the ``in_process`` transport and recovery on (``proxy.max_engine_restarts``), no switch:
    the proxy keeps the last update (its cloned serving tensors, on the device) for a replaced engine to catch
    up from (``LLMProxy._latest_update``), from the first publication on and beside the next one's publish
    copy. Under the switch a replacement catches up from a copy packed again (``runtime.republish``); on Ray
    the kept update is an object-store reference, not device memory."""
    inline = config.runtime.type == "inline"
    if not inline or config.runtime.switch.enabled or config.proxy.max_engine_restarts == 0:
        return []
    if config.weight_sync.transport_for("inline") != "in_process":
        return []
    serve = engine_serve_bytes(config, device)
    params = _published_params(config, shape)
    how = f"{params:,} × {serve} B: the last update, kept by the proxy for a replaced engine's catch-up"
    return [Term("retained update", params * serve, how)]


def largest_bucket(config: RunConfig, shape: ModelShape, serve: int) -> int:
    """The largest bucket an update travels in: ``weight_sync.bucket_mb``, unless one tensor is larger (the
    embedding or output layer, at every real vocabulary), which travels alone in a bucket of its own size
    (``weight_sync.buckets``); a LoRA update's tensors are rank × width, far under a bucket."""
    bucket = int(config.weight_sync.bucket_mb * 2**20)
    if config.trainer.lora is not None:
        return bucket
    return max(bucket, shape.vocab * shape.hidden * serve)


def vllm_streamed_held(config: RunConfig, shape: ModelShape, serve: int) -> int:
    """What vLLM's worker holds while a broadcast streams in: the bucket being received and the one before,
    except that vLLM's layerwise reload keeps a layer's views alive until its last tensor arrives, so a layer
    spread over several buckets keeps all of them (at most the layer plus a partial bucket at each end)."""
    bucket = int(config.weight_sync.bucket_mb * 2**20)
    layer = (shape.attention_params_per_layer + shape.mlp_params_per_layer) * serve
    whole = shape.num_params * serve
    return min(whole, max(2 * largest_bucket(config, shape, serve), layer + 2 * bucket))


def vllm_broadcast_term(config: RunConfig, shape: ModelShape, serve: int, device: str) -> Term:
    """What vLLM's worker holds receiving a broadcast, beside its share. Streamed: ``vllm_streamed_held``.
    Staged (``worker_main._stage``): on the GPU, two received buffers (the one in flight, and room for the
    previous one while the allocator or the process group still holds it), each copied to host memory as it
    arrives; in a plan of host memory, the whole update waiting there plus those two."""
    whole = shape.num_params * serve
    in_flight = min(2 * largest_bucket(config, shape, serve), whole)
    if config.broadcast_apply() == "streamed":
        how = "two received buckets, or a layer's, loaded as they arrive (streamed)"
        return Term("broadcast staging", vllm_streamed_held(config, shape, serve), how, "sync")
    if device == "cpu":
        how = "the whole update staged in host memory until applied, and two buffers being received (staged)"
        return Term("broadcast staging", whole + in_flight, how, "sync")
    how = "two received buffers in flight; the whole update staged in host memory (staged)"
    return Term("broadcast staging", in_flight, how, "sync")


def max_kv_positions(config: RunConfig, max_len: int) -> int:
    """Positions per built-in slot, as the engine sizes them: ``engine.max_model_len`` when set (else the run's
    longest context, which ``asyncrl train`` sets it to), capped by ``engine.max_kv_tokens``."""
    return min(config.engine.max_model_len or max_len, config.engine.max_kv_tokens)


def engine_role(
    config: RunConfig, shape: ModelShape, max_len: int, hardware: Hardware, device: str = "cuda"
) -> Role:
    """One engine's terms per GPU: the built-in engine's weights and KV pool, or vLLM's memory share."""
    serve_name = serving_dtype(config.engine.dtype, config.model.dtype, device)
    serve = DTYPE_BYTES[serve_name]
    engines = config.rollout.num_engines
    lora = config.trainer.lora
    if config.engine.backend == "vllm":
        tp = config.engine.vllm.tensor_parallel_size
        share = config.engine.vllm.gpu_memory_utilization
        terms = [Term("gpu_memory_utilization", int(share * hardware.device_bytes), f"{share} of the GPU")]
        if _transport(config) == "broadcast":  # vLLM's worker receives a broadcast on its device
            terms.append(vllm_broadcast_term(config, shape, serve, device))
        return Role("vLLM engine", engines, tp, tuple(terms))
    slots = config.engine.max_running_requests
    positions = max_kv_positions(config, max_len)
    terms = [
        Term("weights", shape.num_params * serve, f"{shape.num_params:,} × {serve} B ({serve_name})"),
        Term(
            "KV pool",
            kv_pool_bytes(shape, slots, positions, serve),
            f"{slots} slots × {positions + 1} positions × {shape.kv_bytes_per_token(serve):,} B",
        ),
    ]
    if lora is not None:
        terms.append(Term("LoRA adapter", shape.lora_params(lora.rank) * serve, f"rank {lora.rank}"))
    terms += engine_step_terms(config, shape, serve, device)
    if config.runtime.type != "inline" and _transport(config) != "colocated":  # colocated: mapped, no bucket
        whole = shape.num_params * serve
        staging = Term(
            "update staging", min(largest_bucket(config, shape, serve), whole), "one received bucket", "sync"
        )
        if _transport(config) == "broadcast" and config.broadcast_apply() == "streamed":
            staging = replace(
                staging, how="one received bucket, applied as it arrives (broadcast_apply streamed)"
            )
        elif _transport(config) == "broadcast" and device == "cpu":  # host memory is where it stages
            staging = replace(
                staging, bytes=whole, how="the whole update, staged until applied (broadcast_apply staged)"
            )
        elif _transport(config) == "broadcast":
            staging = replace(
                staging,
                how="one received bucket; the whole update staged in host memory (broadcast_apply staged)",
            )
        terms.append(staging)
    return Role("engine", engines, 1, tuple(terms))


def engine_step_terms(config: RunConfig, shape: ModelShape, serve: int, device: str) -> list[Term]:
    """What one built-in engine step allocates beside its weights and pool, from the engine's settings (read
    from its code, not measured on a GPU; ``tests/unit/app/test_memory_measured.py`` checks the sum on CPU):

    - prefill scratch: one decoder layer's tensors (``prefill_layer_bytes_per_token``) over the step's padded
      prefill, up to ``PREFILL_PADDING`` × ``max_prefill_tokens_per_step`` tokens (``padding_groups``);
    - decode logits: float32 ``[slots, vocab]``, the decode step's output, alive through the step's prefill;
      with CUDA graphs (``engine.decode_graphs``, on by default on CUDA) the shared static buffer
      (``StaticDecode.logits``) and the graphs' memory pool, which keeps the captured step's own output: two;
    - sampling (``engine.sampler._sample``): float32 ``[rows, vocab]`` blocks for every running request at once,
      ``SAMPLING_BYTES`` per element, more where the run truncates (``rollout.top_p`` < 1 or ``top_k``):
      ``TRUNCATION_BYTES`` per sorted element (the whole vocabulary under top-p alone, ``top_k`` columns with
      a top-k)."""
    engine, vocab = config.engine, shape.vocab
    slots, prefill = engine.max_running_requests, engine.max_prefill_tokens_per_step
    padded = PREFILL_PADDING * prefill
    graphs = device == "cuda" and engine.decode_graphs != "off"
    blocks = 2 if graphs else 1
    rollout = config.rollout
    truncates = rollout.top_p < 1 or rollout.top_k > 0
    width = (min(rollout.top_k, vocab) if rollout.top_k > 0 else vocab) if truncates else 0
    held = SAMPLING_BYTES // 2 * vocab  # the stacked logits and the log-probs, through the whole call
    per_row = held + max(SAMPLING_BYTES // 2 * vocab, TRUNCATION_BYTES * width)
    sampled = f"{SAMPLING_BYTES} B an element of {vocab:,}"
    if truncates:
        sampled = (
            f"{SAMPLING_BYTES // 2} B an element of {vocab:,} + {TRUNCATION_BYTES} B of {width:,} sorted"
        )
    where = "the static buffer and the graphs' pool" if graphs else "eager decode"
    return [
        Term(
            "prefill scratch",
            padded * prefill_layer_bytes_per_token(shape, serve),
            f"one layer over {padded} padded prefill tokens ({PREFILL_PADDING} × max_prefill_tokens_per_step)",
            "train",
        ),
        Term(
            "decode logits",
            blocks * slots * vocab * 4,
            f"{blocks} × {slots} × {vocab:,} × 4 B ({where})",
            "train",
        ),
        Term("sampling", slots * per_row, f"{slots} rows × {per_row:,} B ({sampled})", "train"),
    ]


def _transport(config: RunConfig, switch: SwitchConfig | None = None) -> str:
    """The run's transport: under ``switch`` (default ``runtime.switch``) ``auto`` is ``colocated``."""
    switch = config.runtime.switch if switch is None else switch
    return config.weight_sync.transport_for(config.runtime.type, switch=switch.enabled)


def vllm_needs(config: RunConfig, shape: ModelShape, max_len: int) -> int:
    """What vLLM's share must hold per GPU: its weights shard and one longest request's KV."""
    serve = engine_serve_bytes(config, "cuda")
    tp = config.engine.vllm.tensor_parallel_size
    return ceil_div(shape.num_params * serve + max_len * shape.kv_bytes_per_token(serve), tp)


def plan(
    config: RunConfig,
    shape: ModelShape,
    max_len: int,
    hardware: Hardware,
    device: str = "cuda",
    critic: CriticShape | None = None,
) -> Plan:
    """Every role's terms and every device's colocated sum for ``config`` on ``hardware``; a separate critic
    at ``critic`` where given (``trainer_role``)."""
    trainer = trainer_role(config, shape, device, critic, max_len)
    engine = engine_role(config, shape, max_len, hardware, device)
    inline = config.runtime.type == "inline"
    if inline and device != "cuda":  # a CPU run's RAM: the switch's offload moves nothing off it
        devices = (
            Device("the one device (trainer + engines, inline)", ((trainer, 1), (engine, engine.count))),
        )
    elif device == "cuda" and (inline or shares_gpus(config)):
        devices = shared_gpu_devices(config, shape, trainer, engine)
    else:
        devices = (Device("each trainer GPU", ((trainer, 1),)), Device("each engine GPU", ((engine, 1),)))
    return Plan(roles=(trainer, engine), devices=devices)


def shares_gpus(config: RunConfig) -> bool:
    """Whether a Ray run puts trainer rank i and engine i on one GPU (one placement bundle), as its placement
    does: rollout and training colocated (``runtime.colocate``: ``sync``, or α = 0, under ``auto``)."""
    return is_colocated(config.runtime, config.controller.mode, config.buffer.async_ratio)


def shared_gpu_devices(
    config: RunConfig, shape: ModelShape, trainer: Role, engine: Role, switch: SwitchConfig | None = None
) -> tuple[Device, ...]:
    """The GPU a trainer rank and its engines share (on Ray one engine per rank; inline, the one GPU and every
    engine): in turns with ``switch`` (default ``runtime.switch``; what its settings move off the device),
    phase by phase (``switch_devices``), else both resident at their peaks.

    Under the switch weights travel by the colocated transport (``RunConfig._check_switch``), so nothing is
    counted twice: inline, the trainer's publish copy is the packed copy itself (each serving cast goes straight
    into its blocks); on Ray a rank gathers a bucket at a time (its staging copy) beside the packed copy, and
    the engine maps its rank's blocks and copies from them into its weights, receiving no bucket of its own
    (``runtime.ray_runtime``'s ``update_weights``)."""
    switch = config.runtime.switch if switch is None else switch
    inline = config.runtime.type == "inline"
    engines = engine.count if inline else 1
    if inline:
        resident, turns = "the one GPU (trainer + engines, inline)", "the one GPU (inline, runtime.switch)"
    else:
        resident, turns = "each shared GPU (trainer rank + engine, no runtime.switch)", "each shared GPU"
    if not switch.enabled:
        return (Device(resident, ((trainer, 1), (engine, engines))),)
    trainer = replace(trainer, terms=tuple(t for t in trainer.terms if t.name != "publish copy"))
    engine = replace(engine, terms=tuple(t for t in engine.terms if t.name != "update staging"))
    offloaded = offloaded_terms(switch)
    asleep = asleep_weights(config, shape) if switch.engine_sleep_level == 1 else None
    return switch_devices(trainer, engine, offloaded, asleep, packed_copy(config, shape), turns, engines)


def asleep_weights(config: RunConfig, shape: ModelShape) -> Term:
    """What a sleeping engine keeps at sleep level 1: its weights (its tensor-parallel shard)."""
    serve = engine_serve_bytes(config, "cuda")
    tp = config.engine.vllm.tensor_parallel_size if config.engine.backend == "vllm" else 1
    return Term("weights", ceil_div(shape.num_params * serve, tp), f"kept asleep (sleep level 1), {serve} B")


def engine_serve_bytes(config: RunConfig, device: str) -> int:
    """Bytes per element the engines on ``device`` serve in (``engine.dtype`` resolved: both backends' one
    serving dtype, the dtype the trainer casts its updates to)."""
    return DTYPE_BYTES[serving_dtype(config.engine.dtype, config.model.dtype, device)]


OFFLOADABLE = {
    "optimizer state": "offload_optimizer",
    "master weights": "offload_master_weights",
    "critic optimizer state": "offload_optimizer",
    "critic weights": "offload_master_weights",
    "reference copy": "offload_reference",
}
"""The trainer's held terms ``runtime.switch`` can move to host memory while the engines generate, each with
its switch key: the policy's and a separate critic's alike (``StateOffloader.for_trainer`` moves both), and
the frozen reference copy (a KL loss without LoRA; its whole weights in the master dtype, on by default: the
step reloads it before it reads the reference log-probs, so the trainer's phases still count it). A value
head's (``shared_trunk``: tens of KB) stays one term, counted on the device. Gradients are no held term (the
trainer frees them after every optimizer step), so there is nothing of theirs to offload."""


def offloaded_terms(switch: SwitchConfig) -> set[str]:
    """The names of the held trainer terms ``switch`` moves to host memory (``OFFLOADABLE``)."""
    return {name for name, key in OFFLOADABLE.items() if getattr(switch, key)}


SWITCH_PHASES = ("trainer trains", "trainer publishes", "engine applies the update", "engine generates")
"""The turns of a GPU under ``runtime.switch``, in the order ``runtime.colocate.ColocatedTrainer`` runs them
each step (the same wrapper inline and on Ray): the engines sleep, then the trainer reloads and trains; it
publishes (the packed copy made while it is whole, the engines still asleep); it offloads, the engines wake and
apply the copy; the copy is let go (``weights_applied``) and the engines generate.

A resume (``resume=``, a restart after a lost trainer) needs no phase of its own: the engines sleep before the
load (``ColocatedTrainer.load_checkpoint``), whose peak is the optimizer step's terms (torch builds the
optimizer's state with zero gradients and an AdamW step at learning rate 0, then fills it), so "trainer trains";
the resumed version's first publication is "trainer publishes", then the engines wake as after any step."""


def switch_devices(
    trainer: Role,
    engine: Role,
    offloaded: Collection[str],
    asleep: Term | None,
    packed: Term,
    name: str = "each shared GPU",
    engines: int = 1,
) -> tuple[Device, ...]:
    """A GPU one trainer rank and ``engines`` engines take turns on (``runtime.switch``), one ``Device`` per
    phase of ``SWITCH_PHASES``: the GPU needs the heaviest phase, not the trainer's peak plus the engine's.

    - trainer trains: its held terms and its heavier transient phase (forward/backward or the optimizer step),
      beside each sleeping engine's ``asleep`` (its weights at sleep level 1, None at level 2);
    - trainer publishes: its held terms, its own publication terms and ``packed`` (``packed_copy``: the whole
      model in the serving dtype), beside the sleeping engines;
    - engine applies the update: what the trainer keeps (its held terms less the ``offloaded`` ones, named as
      in ``OFFLOADABLE``) and ``packed``, beside each woken engine's held terms and its update terms;
    - engine generates: what the trainer keeps beside each engine's held terms and its step scratch; the packed
      copy was let go once every engine applied it.

    Gradients are no held term (freed after every optimizer step), so they appear in the first phase only."""
    kept = tuple(t for t in trainer.terms if t.phase == HELD and t.name not in offloaded)
    offloaded_trainer = Role(f"{trainer.name} (offloaded)", trainer.count, 1, kept)
    holding = replace(offloaded_trainer, terms=(*kept, replace(packed, phase=HELD)))
    sleeping = (
        ((Role(f"{engine.name} (asleep)", engine.count, engine.gpus_each, (asleep,)), engines),)
        if asleep is not None
        else ()
    )
    turns = (
        ((_during(trainer, ("train", "step")), 1), *sleeping),
        ((replace(trainer, terms=(*_during(trainer, ("sync",)).terms, packed)), 1), *sleeping),
        ((holding, 1), (_during(engine, ("sync",)), engines)),
        ((offloaded_trainer, 1), (_during(engine, ("train",)), engines)),
    )
    return tuple(
        Device(f"{name} while the {phase}", tuple((r, n) for r, n in roles if r.terms))
        for phase, roles in zip(SWITCH_PHASES, turns, strict=True)
    )


def _during(role: Role, phases: tuple[str, ...]) -> Role:
    """``role`` with only the terms alive in ``phases``: its held ones and those of any of ``phases`` (its
    total is then its held terms plus the heaviest of those phases)."""
    terms = tuple(t for t in role.terms if t.phase == HELD or any(t.alive_in(p) for p in phases))
    return replace(role, terms=terms)


# ---- host memory of a GPU run ------------------------------------------------------------------------------

HOST_NOT_COUNTED = (
    "the processes themselves (Python, torch and CUDA libraries, Ray's workers), data loading, rollout and "
    "replay buffers, the page cache, a trainer rank's transient load of the model at start, a second update "
    "version still being read from the object store, and the pinned allocator's rounding of each buffer (up to "
    "a power of two) and its cached blocks"
)
"""What ``host_plan`` leaves out (doctor prints it): none is small on a full node, so its verdict keeps the
plan's margin and says so."""
VLLM_BUCKET_FILES = 2
"""Bucket files in ``/dev/shm`` per vLLM engine at once (``engine.vllm.bucket_stream.IN_FLIGHT``)."""


def whole_update_bytes(config: RunConfig, shape: ModelShape, device: str) -> int:
    """One whole publication (the adapters under LoRA) in the serving dtype of engines on ``device``: what a
    staged broadcast holds until applied, and what rank 0 puts into Ray's object store."""
    return _published_params(config, shape) * engine_serve_bytes(config, device)


def trainer_host_role(trainer: Role, switch: SwitchConfig) -> Role:
    """What one trainer rank of a GPU run (``trainer``: its GPU role) keeps in pinned host memory: under
    ``switch`` (``runtime.switch``) the held terms its settings offload (``OFFLOADABLE``: a separate critic's
    with the policy's) while the engine generates. Their host buffers are kept across steps (``trainer.offload``:
    pinned once, at their exact size), so they are held throughout."""
    if not switch.enabled:
        return replace(trainer, terms=())
    offloaded = offloaded_terms(switch)
    terms = tuple(
        replace(t, name=f"offloaded {t.name}", how=f"{t.how}, pinned and kept across steps")
        for t in trainer.terms
        if t.phase == HELD and t.name in offloaded
    )
    return replace(trainer, terms=terms)


def bucket_file_bytes(
    config: RunConfig, shape: ModelShape, switch: SwitchConfig | None = None, device: str = "cuda"
) -> int:
    """What one vLLM engine on ``device`` holds at once in bucket files in ``/dev/shm`` while an update streams
    to its worker (``engine.vllm.bucket_stream``): ``VLLM_BUCKET_FILES`` of the largest bucket, never more than
    the whole update; 0 where no update travels that way (the built-in engine, a broadcast, a LoRA adapter).
    ``switch``: as ``host_plan``'s."""
    switch = config.runtime.switch if switch is None else switch
    broadcast = _transport(config, switch) == "broadcast" and config.runtime.type != "inline"
    if config.engine.backend != "vllm" or broadcast or config.trainer.lora is not None:
        return 0
    largest = largest_bucket(config, shape, engine_serve_bytes(config, device))
    return min(VLLM_BUCKET_FILES * largest, whole_update_bytes(config, shape, device))


def engine_host_role(config: RunConfig, shape: ModelShape, engine: Role, switch: SwitchConfig) -> Role:
    """What one engine of a GPU run (``engine``: its GPU role) keeps in host memory: a staged broadcast's whole
    update (pinned, until applied: the GPU role holds only the buffers in flight), vLLM's bucket files in
    ``/dev/shm`` for an update it is handed (object store), and a built-in engine's weights asleep at
    ``switch.engine_sleep_level`` 2 (level 1 keeps them on the GPU, ``asleep_weights``)."""
    terms = []
    whole = whole_update_bytes(config, shape, "cuda")
    transport = _transport(config, switch)
    broadcast = transport == "broadcast" and config.runtime.type != "inline"
    if broadcast and config.broadcast_apply() == "staged":
        how = "the whole update in the serving dtype, pinned until applied (broadcast_apply staged)"
        terms.append(Term("staged update", whole, how, "sync"))
    elif files := bucket_file_bytes(config, shape, switch):
        how = f"{VLLM_BUCKET_FILES} bucket files in /dev/shm streamed to the worker"
        terms.append(Term("bucket files", files, how, "sync"))
    if switch.enabled and switch.engine_sleep_level == 2:
        weights = asleep_weights(config, shape)
        how = weights.how.replace("kept asleep (sleep level 1)", "on the host asleep (sleep level 2)")
        terms.append(replace(weights, name="weights asleep", how=how))
    return replace(engine, terms=tuple(terms))


def object_store_role(config: RunConfig, shape: ModelShape, switch: SwitchConfig) -> Role:
    """Ray's object store on trainer rank 0's node under the ``object_store`` transport: the whole update rank
    0 puts there for the engines to read (zero-copy on its node). Its capacity is Ray's default share of the
    node's RAM (``runtime`` passes no ``object_store_memory``); beyond it Ray spills to disk."""
    if config.runtime.type == "inline" or _transport(config, switch) != "object_store":
        return Role("Ray object store", 1, 0, ())
    how = "the whole update rank 0 puts for the engines in the serving dtype, one version"
    return Role(
        "Ray object store", 1, 0, (Term("published update", whole_update_bytes(config, shape, "cuda"), how),)
    )


def host_plan(
    config: RunConfig, plan: Plan, shape: ModelShape, hardware: Hardware, switch: SwitchConfig | None = None
) -> Device:
    """One node's host RAM for a GPU run planned as ``plan``: the host terms of the roles on the node that holds
    the most. Inline: one process with every engine. Ray, colocated: one trainer rank and one engine per GPU.
    Ray, split: Ray may place any mix of ranks and engines on a node, so the mix of at most
    ``gpus_per_node`` GPUs (or ``num_gpus``, fewer) with the most host bytes (rank 0's object store with the
    ranks). ``switch`` is the run's ``runtime.switch`` unless given (``asyncrl plan``'s colocated layouts take
    turns by the switch it plans, as ``shared_gpu_devices``): what it offloads and puts to sleep, and the
    transport it implies. The one computation doctor's host line and ``asyncrl plan``'s host filter read."""
    switch = config.runtime.switch if switch is None else switch
    trainer, engine = plan.roles
    ranks = trainer_host_role(trainer, switch)
    engines = engine_host_role(config, shape, engine, switch)
    store = object_store_role(config, shape, switch)
    per_node = min(hardware.gpus_per_node, hardware.num_gpus)
    if config.runtime.type == "inline":
        mixes = [(1, engine.count)]
    elif shares_gpus(config):
        mixes = [(min(trainer.count, per_node), min(engine.count, per_node))]
    else:
        mixes = [
            (t, min(engine.count, (per_node - t) // engine.gpus_each))
            for t in range(min(trainer.count, per_node) + 1)
        ]

    def roles(mix: tuple[int, int]) -> tuple[tuple[Role, int], ...]:
        t, e = mix
        placed = ((ranks, t), (engines, e), (store, 1 if t else 0))
        return tuple((role, n) for role, n in placed if n and role.terms)

    def total(mix: tuple[int, int]) -> int:
        return sum(role.total * n for role, n in roles(mix))

    t, e = max(mixes, key=lambda mix: (total(mix), mix))
    name = f"each node's host RAM ({t} trainer rank(s) and {e} engine(s) on {per_node} GPU(s))"
    return Device(name, roles((t, e)))


@dataclass(frozen=True)
class CheckpointSize:
    """What one checkpoint writes (its parts, each a ``Term`` saying what it counts) and how many coexist."""

    parts: tuple[Term, ...]
    count: int
    """The kept ones plus the one being written (``trainer.keep_last_checkpoints`` + 1), or every one saved."""

    @property
    def each(self) -> int:
        return sum(t.bytes for t in self.parts)

    @property
    def total(self) -> int:
        return self.each * self.count


def writes_sharded_checkpoints(config: RunConfig) -> bool:
    """Whether the trainer writes DCP checkpoints (several ranks on Ray, ``runtime.trainer_group``) rather than
    one process's ``save_pretrained`` + ``trainer_state.pt``."""
    return config.runtime.type != "inline" and config.trainer.num_workers > 1


def checkpoint_bytes(config: RunConfig, shape: ModelShape, device: str = "cuda") -> CheckpointSize:
    """One checkpoint's bytes on disk, part by part, as ``trainer.checkpoint`` (one process) or
    ``trainer.distributed.checkpoint`` (sharded, on ``device``) writes it; config, tokenizer and index files
    (kilobytes) are left out.

    - One process: ``model/`` (``save_pretrained``, the master dtype; a tied output layer once) or, with LoRA,
      ``adapter/``; AdamW's two moments of the trainable weights in ``trainer_state.pt``.
    - Sharded: ``sharded/`` holds the master weights (DCP saves a tied output layer under both its names, so
      twice) or, with LoRA, the adapters, and the two moments; beside it ``model/``, the Hugging Face export in
      the serving dtype (``serving_dtype`` on the trainer's device, as ``runtime.trainer_group`` asks for), or
      the gathered ``adapter/`` with LoRA.
    - A critic adds its weights and two moments (a separate one at its own shape, as the memory plan costs it).

    Every part lives in the step directory that ``trainer.checkpoint.prune_checkpoints`` deletes whole, so each
    kept checkpoint holds all of them."""
    master = DTYPE_BYTES[config.model.dtype]
    params = shape.num_params
    lora = config.trainer.lora
    trainable = shape.lora_params(lora.rank) if lora is not None else params
    element = LORA_BYTES if lora is not None else master  # peft keeps adapters in float32
    moments = Term("AdamW moments", 2 * trainable * element, f"2 × {trainable:,} × {element} B")
    adapter = (
        Term("adapter/", trainable * element, f"{trainable:,} LoRA weights × {element} B (peft's float32)")
        if lora is not None
        else None
    )
    if not writes_sharded_checkpoints(config):
        weights = adapter or Term("model/", params * master, f"{params:,} × {master} B, save_pretrained")
        parts = [weights, moments]
    else:
        tied = shape.vocab * shape.hidden if shape.tied_embeddings and lora is None else 0
        saved = trainable + tied
        why = ", a tied output layer twice" if tied else ""
        serve_name = serving_dtype(config.engine.dtype, config.model.dtype, device)
        serve = DTYPE_BYTES[serve_name]
        export = adapter or Term(
            "model/", params * serve, f"{params:,} × {serve} B, the Hugging Face export in {serve_name}"
        )
        parts = [
            Term("sharded/ weights", saved * element, f"{saved:,} × {element} B in DCP{why}"),
            moments,
            export,
        ]
    parts += _critic_checkpoint_terms(config, shape, master)
    keep, every = config.trainer.keep_last_checkpoints, config.trainer.checkpoint_every
    num_saved = (config.controller.num_steps // every if every else 0) + 1  # the periodic ones and the final
    count = min(keep + 1, num_saved) if keep is not None else num_saved
    return CheckpointSize(tuple(parts), count)


def _critic_checkpoint_terms(config: RunConfig, shape: ModelShape, master: int) -> list[Term]:
    """A critic's weights and AdamW's two moments: the value head's, or a separate critic's body at its shape."""
    critic = config.critic
    if critic is None:
        return []
    if critic.type == "shared_trunk":
        params, name = shape.hidden + 1, "value head"
    else:
        body = resolve_critic_shape(critic, shape).shape
        params, name = body.body_params + body.hidden + 1, "critic"
    return [Term(name, 3 * params * master, f"weights + 2 moments of {params:,} × {master} B")]


def kv_slots_that_fit(free_bytes: int, engine_weights: int, kv_per_slot: int) -> int:
    """Request slots of ``kv_per_slot`` a built-in engine can preallocate in ``free_bytes`` after its weights."""
    if kv_per_slot <= 0:
        return 0
    return max(0, int((free_bytes - engine_weights) * KV_POOL_SHARE) // kv_per_slot)
