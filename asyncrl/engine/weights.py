"""Validating a weight update against the served model before anything is copied.

Contract of ``update_weights(named_tensors, version, partial=False)``:
- names are the model's ``state_dict`` names (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``);
  an unknown name or a wrong shape is a ``ValueError`` naming the tensor;
- a full update (``partial=False``) must cover every parameter of ``model.named_parameters()``; a missing one
  is a ``ValueError`` naming it. ``partial=True`` updates only the tensors given;
- with tied embeddings ``lm_head.weight`` and ``model.embed_tokens.weight`` are one tensor: either name covers
  it, and giving both with different values is an error (which one should win is not ours to guess).
Nothing is copied unless the whole update is valid, so a rejected update leaves the old weights serving.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

NamedTensors = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]

TIED_ALIAS = ("lm_head.weight", "model.embed_tokens.weight")


def resolve_update(
    model: torch.nn.Module, named_tensors: NamedTensors, *, partial: bool
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pair each given tensor with the parameter it replaces, or raise ``ValueError`` naming the bad tensor."""
    params = dict(model.named_parameters())
    aliases = dict([TIED_ALIAS]) if _is_tied(model) else {}
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    resolved: dict[str, torch.Tensor] = {}
    for name, tensor in items:
        target = aliases.get(name, name)
        if target not in params:
            raise ValueError(f"update_weights: unknown tensor {name!r}")
        if tuple(tensor.shape) != tuple(params[target].shape):
            raise ValueError(
                f"update_weights: tensor {name!r} has shape {tuple(tensor.shape)}, "
                f"expected {tuple(params[target].shape)}"
            )
        if target in resolved and not torch.equal(resolved[target], tensor):
            raise ValueError(f"update_weights: tied tensors {TIED_ALIAS} were given different values")
        resolved[target] = tensor
    missing = sorted(params.keys() - resolved.keys())
    if missing and not partial:
        raise ValueError(
            f"update_weights: a full update is missing tensor(s) {missing[:5]} ({len(missing)} in all)"
        )
    return [(params[name], tensor) for name, tensor in resolved.items()]


@torch.no_grad()
def copy_into(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for param, tensor in pairs:
        param.copy_(tensor)


def _is_tied(model: torch.nn.Module) -> bool:
    return model.lm_head.weight is model.model.embed_tokens.weight
