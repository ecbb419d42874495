"""The shape of a decoder-only transformer, as the cost model needs it: named, or read from a HF ``config.json``.

Key decision: a shape is the handful of integers every cost derives from (parameters, FLOPs per token, KV bytes
per token), nothing more, so the simulator can cost a 235 B mixture of experts on a laptop without building it.
The named shapes are the public ``config.json`` values of the models the ROLL Flash / AReaL reports train.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """Layers, widths and vocabulary of a Llama-family decoder (dense, or a mixture of experts)."""

    name: str = ""
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    """Width of the gated MLP of a dense layer (unused by a layer of experts)."""
    vocab: int
    tied_embeddings: bool = False
    num_experts: int = 0
    """Routed experts per MoE layer; 0 for a dense model."""
    num_active_experts: int = 0
    """Experts each token is routed to."""
    expert_intermediate: int = 0
    """Width of one expert's gated MLP."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"model shape {self.name!r}: {name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model shape {self.name!r}: num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.is_moe and not (
            0 < self.num_active_experts <= self.num_experts and self.expert_intermediate > 0
        ):
            raise ValueError(
                f"model shape {self.name!r}: a mixture of experts needs 0 < num_active_experts <= num_experts "
                f"and expert_intermediate > 0"
            )
        if not self.is_moe and self.intermediate < 1:
            raise ValueError(f"model shape {self.name!r}: intermediate must be >= 1 for a dense model")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention_params_per_layer(self) -> int:
        """q, k, v and o projections (no biases: they are a rounding error in every count here)."""
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return self.hidden * (q_width + 2 * kv_width) + q_width * self.hidden

    @property
    def mlp_params_per_layer(self) -> int:
        """All MLP weights of a layer: gate, up and down of each expert plus the router, or the dense MLP."""
        if self.is_moe:
            return (
                3 * self.hidden * self.expert_intermediate * self.num_experts + self.hidden * self.num_experts
            )
        return 3 * self.hidden * self.intermediate

    @property
    def active_mlp_params_per_layer(self) -> int:
        """The MLP weights one token multiplies: its routed experts (and the router), or the dense MLP."""
        if self.is_moe:
            return (
                3 * self.hidden * self.expert_intermediate * self.num_active_experts
                + self.hidden * self.num_experts
            )
        return self.mlp_params_per_layer

    @property
    def embedding_params(self) -> int:
        """Input embeddings plus the output layer (counted once when tied)."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def num_params(self) -> int:
        """Every weight, norms aside."""
        per_layer = self.attention_params_per_layer + self.mlp_params_per_layer
        return self.num_layers * per_layer + self.embedding_params

    @property
    def active_params_per_token(self) -> int:
        """Weights one token's forward multiplies: its layers' attention and routed MLPs, and the output layer
        (the input embedding is a lookup)."""
        per_layer = self.attention_params_per_layer + self.active_mlp_params_per_layer
        return self.num_layers * per_layer + self.vocab * self.hidden

    @property
    def body_params(self) -> int:
        """A decoder body's weights (``AutoModel``: a separate critic's): every weight but an untied output
        layer (a tied one is the input embedding, which the body keeps)."""
        return self.num_params - (0 if self.tied_embeddings else self.vocab * self.hidden)

    def lora_params(self, rank: int) -> int:
        """LoRA adapter weights of ``rank`` on every linear of every layer (peft's ``all-linear``: q, k, v, o,
        gate, up, down of every expert; not the output layer): rank × (in + out) per linear."""
        return self.num_layers * rank * self._lora_widths_per_layer(self.num_experts)

    def active_lora_params(self, rank: int) -> int:
        """The adapter weights one token multiplies: its layers' attention and its routed experts' adapters."""
        return self.num_layers * rank * self._lora_widths_per_layer(self.num_active_experts)

    def _lora_widths_per_layer(self, num_experts: int) -> int:
        """Σ (in + out) over a layer's adapted linears, with ``num_experts`` experts' MLPs (a dense MLP when the
        shape has none)."""
        q, kv, h = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.hidden
        attention = (h + q) + 2 * (h + kv) + (q + h)
        mlp = 3 * (h + self.expert_intermediate) * num_experts if self.is_moe else 3 * (h + self.intermediate)
        return attention + mlp

    def forward_flops_per_token(self, context_tokens: float) -> float:
        """FLOPs of one token's forward when it attends to ``context_tokens`` positions: 2 per active weight
        plus QKᵀ and AV (2 · 2 · heads · head_dim per attended position, every layer)."""
        attention = 4 * self.num_layers * self.num_heads * self.head_dim * context_tokens
        return 2 * self.active_params_per_token + attention

    def kv_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """Keys and values one context token keeps in every layer's cache."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_element

    def with_layers(self, num_layers: int) -> ModelShape:
        """The same shape cut to ``num_layers`` layers (a model too big to measure whole)."""
        values = asdict(self) | {"num_layers": num_layers, "name": f"{self.name}[{num_layers} layers]"}
        return ModelShape(**values)


def _qwen3(name: str, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int, tied: bool):
    return ModelShape(
        name=name,
        num_layers=layers,
        hidden=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=128,
        intermediate=intermediate,
        vocab=151_936,
        tied_embeddings=tied,
    )


NAMED_SHAPES: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        _qwen3("qwen3-0.6b", 28, 1024, 16, 8, 3072, tied=True),
        _qwen3("qwen3-1.7b", 28, 2048, 16, 8, 6144, tied=True),
        _qwen3("qwen3-4b", 36, 2560, 32, 8, 9728, tied=True),
        _qwen3("qwen3-8b", 36, 4096, 32, 8, 12288, tied=False),
        _qwen3("qwen3-14b", 40, 5120, 40, 8, 17408, tied=False),
        _qwen3("qwen3-32b", 64, 5120, 64, 8, 25600, tied=False),
        ModelShape(
            name="qwen3-30b-a3b",
            num_layers=48,
            hidden=2048,
            num_heads=32,
            num_kv_heads=4,
            head_dim=128,
            intermediate=6144,
            vocab=151_936,
            num_experts=128,
            num_active_experts=8,
            expert_intermediate=768,
        ),
        ModelShape(
            name="qwen3-235b-a22b",
            num_layers=94,
            hidden=4096,
            num_heads=64,
            num_kv_heads=4,
            head_dim=128,
            intermediate=12288,
            vocab=151_936,
            num_experts=128,
            num_active_experts=8,
            expert_intermediate=1536,
        ),
        ModelShape(
            name="qwen2.5-7b",
            num_layers=28,
            hidden=3584,
            num_heads=28,
            num_kv_heads=4,
            head_dim=128,
            intermediate=18944,
            vocab=152_064,
        ),
        ModelShape(
            name="qwen2.5-32b",
            num_layers=64,
            hidden=5120,
            num_heads=40,
            num_kv_heads=8,
            head_dim=128,
            intermediate=27648,
            vocab=152_064,
        ),
    )
}
"""Shapes by name (lower case), from each model's public ``config.json``."""


def shape_from_hf_config(config: dict, name: str = "") -> ModelShape:
    """The shape of a HF ``config.json`` (dense or MoE Llama-family decoders: Qwen2/3, Llama, Mistral…)."""
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return ModelShape(
            name=name or str(config.get("_name_or_path") or config.get("model_type", "")),
            num_layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate=int(config.get("intermediate_size") or 0),
            vocab=int(config["vocab_size"]),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            num_experts=int(config.get("num_experts") or config.get("num_local_experts") or 0),
            num_active_experts=int(config.get("num_experts_per_tok") or 0),
            expert_intermediate=int(config.get("moe_intermediate_size") or 0),
        )
    except KeyError as err:
        raise ValueError(f"model config {name!r} has no {err.args[0]!r}: not a decoder config.json") from err


def resolve_shape(spec: str | dict | ModelShape) -> ModelShape:
    """A shape from a name in ``NAMED_SHAPES``, a path to a ``config.json`` (or its folder), or a mapping of
    ``ModelShape`` fields."""
    if isinstance(spec, ModelShape):
        return spec
    if isinstance(spec, dict):
        known = {f.name for f in fields(ModelShape)}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(f"model shape: unknown key(s) {unknown}; known: {sorted(known)}")
        return ModelShape(**spec)
    if spec.lower() in NAMED_SHAPES:
        return NAMED_SHAPES[spec.lower()]
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return shape_from_hf_config(json.loads(path.read_text()), name=str(spec))
    raise ValueError(
        f"model {spec!r} is neither a named shape ({', '.join(sorted(NAMED_SHAPES))}) nor a config.json or "
        f"a folder holding one"
    )
