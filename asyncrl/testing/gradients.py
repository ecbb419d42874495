"""The gradients a ``Trainer`` stepped with, for tests and GPU checks that compare them.

Why: the trainer frees every gradient right after its mini-batch's optimizer step (``Trainer._free_gradients``:
none outlives it, so none sits beside a colocated engine), so reading ``param.grad`` after ``train_step``
finds nothing. ``stepped_gradients`` reads them where they still exist: after each mini-batch's clip and
optimizer step (what ``param.grad`` used to show after the step), before they are freed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch


def trained_parameters(trainer: Any) -> list[tuple[str, torch.nn.Parameter]]:
    """The policy's named parameters, then the critic module's (a separate critic, or a shared trunk's value
    head) as ``critic.<name>``."""
    named = list(trainer.model.named_parameters())
    critic = getattr(trainer, "critic", None)
    if critic is not None:
        named += [(f"critic.{name}", param) for name, param in critic.module.named_parameters()]
    return named


@contextlib.contextmanager
def stepped_gradients(
    trainer: Any, read: Callable[[torch.Tensor], torch.Tensor] = torch.Tensor.clone
) -> Iterator[list[dict[str, torch.Tensor]]]:
    """Within the block, each optimizer step of ``trainer`` appends ``{name: read(grad)}`` of every trained
    parameter holding a gradient (``trained_parameters``); the last entry is a ``train_step``'s last
    mini-batch. ``read`` runs on every rank of a sharded trainer, in the same order (``DTensor.full_tensor``
    is a collective)."""
    captured: list[dict[str, torch.Tensor]] = []
    step = trainer._step_optimizers

    def read_after(*args: Any, **kwargs: Any) -> Any:
        metrics = step(*args, **kwargs)
        captured.append({n: read(p.grad) for n, p in trained_parameters(trainer) if p.grad is not None})
        return metrics

    trainer._step_optimizers = read_after
    try:
        yield captured
    finally:
        del trainer._step_optimizers  # the class's method again
