"""LoRA on the trainer's model through ``peft``: attach the adapters, name them for the engines, switch them off
for the reference policy, and let their dropout act only where gradients flow.

Key decision: the trainer computes with the Hugging Face model peft injected its layers into
(``PeftModel.get_base_model()``), so the decoder body and output layer are reached exactly as without LoRA
(``trainer.logprobs``), FSDP2 shards the same decoder layers, and parameter names stay the plain model's
(plus ``lora_A.default`` / ``lora_B.default``). The ``PeftModel`` wrapper is kept for what only it does:
``disable_adapter`` (the reference policy is the frozen base, no second copy of the weights),
``save_pretrained`` (a checkpoint's ``adapter/``) and ``merge_and_unload`` (merged export).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import peft
import torch
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file
from torch import nn

from asyncrl.config.trainer import ALL_LINEAR, LoraConfig
from asyncrl.weight_sync.protocol import LORA_A_SUFFIX, LORA_B_SUFFIX, LoraAdapter

ADAPTER_NAME = "default"
"""peft's name of the one adapter the trainer trains."""
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
"""The weights file of peft's adapter format."""


def attach_lora(model: nn.Module, config: LoraConfig, seed: int) -> peft.PeftModel:
    """``model`` with LoRA adapters on ``config.target_modules`` (in place); only the adapters require grad.

    The adapters are drawn from ``seed`` alone (``_draw_adapters``; the global generator is left as it was): a
    run and its resumed twin start alike, and every FSDP2 rank holds the same adapters before they are sharded,
    also on a model whose weights are still on the meta device (a sharded trainer's skeleton: the adapters are
    then real, on the host, and sharding keeps them, see ``sharded_load``)."""
    targets = ALL_LINEAR if config.target_modules == (ALL_LINEAR,) else list(config.target_modules)
    peft_config = peft.LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=targets,
        bias="none",
    )
    device = next(model.parameters()).device
    try:
        with (
            warnings.catch_warnings(),
            torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
        ):
            # peft asks transformers a deprecated question: nothing for users
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
            torch.manual_seed(seed)
            peft_model = peft.get_peft_model(model, peft_config, adapter_name=ADAPTER_NAME)
    except ValueError as error:  # peft names the modules it could not find
        raise ValueError(f"trainer.lora.target_modules={list(config.target_modules)}: {error}") from error
    _draw_adapters(peft_model, seed)
    return peft_model


def _draw_adapters(model: nn.Module, seed: int) -> None:
    """Every adapter pair drawn as peft's default initialisation draws it (A kaiming-uniform with a = √5, B
    zero, so a new adapter changes nothing), on the host from a generator seeded with ``seed``, layer by layer
    in module order: the same values whatever device the model is on. peft's own draw cannot be kept on a base
    on the meta device: it moves each adapter to its base's device, and a meta tensor holds no values."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in lora_layers(model):
            down, up = layer.lora_A[ADAPTER_NAME], layer.lora_B[ADAPTER_NAME]
            for linear in (down, up):
                if linear.weight.is_meta:
                    linear.to_empty(device="cpu")
            drawn = torch.empty(down.weight.shape)
            nn.init.kaiming_uniform_(drawn, a=math.sqrt(5), generator=generator)
            down.weight.copy_(drawn)
            up.weight.zero_()


def save_adapter(peft_model: peft.PeftModel, directory: Path, *, is_main_process: bool = True) -> None:
    """Every rank calls this: the adapters in peft's format (``adapter_config.json`` and
    ``adapter_model.safetensors``, loadable by ``PeftModel.from_pretrained`` and by vLLM), written by the main
    process. Under FSDP2 each adapter tensor is gathered first (a collective, in the same order on every rank).
    """
    trainable = {
        name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
        for name, p in peft_model.named_parameters()
        if p.requires_grad
    }
    peft_model.save_pretrained(str(directory), state_dict=trainable, is_main_process=is_main_process)


def load_adapter(peft_model: peft.PeftModel, directory: Path) -> None:
    """Copy the adapters saved in ``directory`` (``save_adapter``) into ``peft_model``; ``ValueError`` naming
    what does not fit (another rank or other target layers)."""
    state = load_file(directory / ADAPTER_WEIGHTS_FILE)
    try:
        result = peft.set_peft_model_state_dict(peft_model, state, adapter_name=ADAPTER_NAME)
    except RuntimeError as error:  # a shape mismatch: another rank
        raise ValueError(f"adapter {directory} does not fit trainer.lora: {error}") from error
    missing = [name for name in result.missing_keys if "lora_" in name]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"adapter {directory} does not fit trainer.lora: missing {missing[:5]}, unexpected "
            f"{list(result.unexpected_keys)[:5]} (other target_modules?)"
        )


def merge_adapter(model: nn.Module, directory: Path) -> nn.Module:
    """``model`` (the base) with the adapters saved in ``directory`` merged into its weights, as a plain model."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        wrapped = peft.PeftModel.from_pretrained(model, str(directory), adapter_name=ADAPTER_NAME)
    return wrapped.merge_and_unload()


def lora_layers(model: nn.Module) -> list[tuple[str, LoraLayer]]:
    """(name, layer) of every layer carrying the trained adapter, names as in ``model`` (the injected HF model:
    the plain model's module names)."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer) and ADAPTER_NAME in module.lora_A
    ]


def adapter_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter pairs by their weight-sync names (``<module>.lora_A.weight``, ``<module>.lora_B.weight``),
    as detached views (DTensors under FSDP2: gather them before use)."""
    tensors = {}
    for name, layer in lora_layers(model):
        tensors[f"{name}{LORA_A_SUFFIX}"] = layer.lora_A[ADAPTER_NAME].weight.detach()
        tensors[f"{name}{LORA_B_SUFFIX}"] = layer.lora_B[ADAPTER_NAME].weight.detach()
    return tensors


def adapter_spec(model: nn.Module) -> LoraAdapter:
    """The ``LoraAdapter`` record of ``model``'s adapters (one scaling for all layers, as ``LoraConfig`` sets)."""
    scalings = {float(layer.scaling[ADAPTER_NAME]) for _, layer in lora_layers(model)}
    if len(scalings) != 1:
        raise ValueError(
            f"LoRA layers with different scalings {sorted(scalings)}: one adapter update cannot carry them"
        )
    return LoraAdapter(scaling=scalings.pop())


@contextlib.contextmanager
def seeded_dropout(words: list[int], device: torch.device) -> Iterator[None]:
    """The global generator (which ``nn.Dropout`` draws from) seeded by ``words`` for the block, and put back
    after. A trainer seeds each step's adapter dropout by (seed, step, rank), so a resumed run draws what the
    uninterrupted one drew, whatever else drew from the generator in between."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(np.random.SeedSequence(words).generate_state(1)[0]))
        yield


@contextlib.contextmanager
def adapter_dropout(model: nn.Module) -> Iterator[None]:
    """Adapter dropout active for the block (a gradient forward and its backward, where activation
    checkpointing recomputes with the same random state); every other module keeps its mode (eval)."""
    dropouts = [
        layer.lora_dropout[ADAPTER_NAME]
        for _, layer in lora_layers(model)
        if isinstance(layer.lora_dropout[ADAPTER_NAME], nn.Dropout)
    ]
    for dropout in dropouts:
        dropout.train()
    try:
        yield
    finally:
        for dropout in dropouts:
            dropout.eval()
