"""Activation checkpointing of a Hugging Face decoder: keep each layer's input, recompute the layer in backward.

Key decision: transformers checkpoints a layer only while that layer is in training mode, but the trainer keeps
the model in eval mode so dropout stays off (the step-start log-probs must equal the first forward's). So only
the checkpointed layer objects themselves are flagged as training; their submodules (attention, dropout) stay in
eval mode and compute exactly what they compute without checkpointing.
"""

from __future__ import annotations

from torch import nn

from asyncrl.trainer.distributed.parallel import decoder_layers


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Checkpoint every decoder layer of ``model`` (non-reentrant, so it composes with FSDP2)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers before the rename (the lent GPU machine's 5.17): same switch, older name
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    for layer in decoder_layers(model):
        layer.training = True  # this layer object only: see the module docstring
