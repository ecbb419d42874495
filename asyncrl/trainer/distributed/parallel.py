"""How the trainer spreads one train step over ranks: one process, or FSDP2 data parallelism over a process group.

The trainer runs the same code whatever the world size; this is the only piece that differs. It asks these
things of a ``Parallelism`` (``agreed_count`` below is derived from them; which rows a rank trains is
``row_split``'s, from ``rank`` and ``world_size``):

- ``shard(module, weights=None)``: prepare a log-prob module (no-op in one process; ``fully_shard`` on every
  decoder layer and the root under FSDP2, then a module on the meta device reads its shards from the model
  directory ``weights``, by default the run's model's);
- ``gather(obj)``: every rank's copy of a small picklable value, in rank order (denominators, micro-batch
  counts, metrics); one process returns ``[obj]``;
- ``sync_gradients(module, last)``: tells the coming backward whether it is the mini-batch's last pass; under
  FSDP2 with ``grad_accumulation="unsharded"`` only that pass reduces gradients across ranks (no-op in one
  process, and under the default sharded accumulation every pass reduces);
- ``reshard(module)``: after no-grad forwards, give back the whole parameters they gathered (no-op in one
  process; under FSDP2 the root's, which only a backward would otherwise free);
- ``rank`` and ``world_size``.

Key decision: every rank must make the same sequence of collective calls, or FSDP2 deadlocks. So ranks agree on
the number of micro-batches of each pass (the largest of any rank's) and a rank with fewer runs empty passes
whose loss is zero (``Trainer`` does this through ``agreed_count``); a rank with no rows at all still takes part.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn


class Parallelism(Protocol):
    """See the module docstring."""

    rank: int
    world_size: int

    def shard(self, module: nn.Module, weights: Path | None = None) -> None: ...

    def gather(self, obj: Any) -> list[Any]: ...

    def sync_gradients(self, module: nn.Module, last: bool) -> None: ...

    def reshard(self, module: nn.Module) -> None: ...


def agreed_count(parallel: Parallelism, count: int) -> int:
    """The largest ``count`` of any rank: how many passes every rank makes so that collectives line up."""
    return max(parallel.gather(count))


@dataclass(frozen=True)
class SingleProcess:
    """One process holds the whole model: nothing to shard, nothing to exchange."""

    rank: int = 0
    world_size: int = 1

    def shard(self, module: nn.Module, weights: Path | None = None) -> None:
        del module, weights

    def gather(self, obj: Any) -> list[Any]:
        return [obj]

    def sync_gradients(self, module: nn.Module, last: bool) -> None:
        del module, last

    def reshard(self, module: nn.Module) -> None:
        del module


class FullyShardedParallel:
    """FSDP2 over the default ``torch.distributed`` process group (gloo on CPU, NCCL on CUDA).

    Parameters are sharded over a 1-D device mesh of every rank; gradients are reduce-scattered (averaged over
    ranks, which the trainer's loss weights undo, see ``normalisation``). With ``mixed_precision`` the sharded
    parameters stay float32 while forward and backward compute in bfloat16 and gradients reduce in float32.
    Modules whose parameters are on the meta device get memory only after sharding: each rank reads its shards
    from the model directory ``weights`` (``sharded_load``). ``grad_accumulation`` is
    ``trainer.fsdp_grad_accumulation``: ``sharded`` reduce-scatters after every
    micro-batch (each rank accumulates only its gradient shard), ``unsharded`` only after the mini-batch's
    last (one reduction per mini-batch, a full-size gradient on every rank until then).
    """

    def __init__(
        self,
        device_type: str,
        *,
        mixed_precision: bool = False,
        grad_accumulation: str = "sharded",
        weights: Path | None = None,
    ) -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            raise RuntimeError("FullyShardedParallel needs torch.distributed.init_process_group first")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.mesh = init_device_mesh(device_type, (self.world_size,))
        self.mixed_precision = mixed_precision
        if grad_accumulation not in ("sharded", "unsharded"):
            raise ValueError(f"grad_accumulation must be 'sharded' or 'unsharded', got {grad_accumulation!r}")
        self.grad_accumulation = grad_accumulation
        self.weights = weights
        self.device = torch.device(device_type)
        if device_type == "cuda":
            self.device = torch.device("cuda", torch.cuda.current_device())

    def shard(self, module: nn.Module, weights: Path | None = None) -> None:
        """``fully_shard`` every decoder layer (one all-gather per layer), then the root (embeddings, norm, head).

        Decoder layers are the modules whose class the Hugging Face model names in ``_no_split_modules``.
        The shards keep the parameters' own dtype (``model.dtype``); gradients are reduced in float32 whatever it
        is. A module built on the meta device is then filled with this rank's shards of ``weights`` (a model
        directory; None: this parallelism's own, the run's model), e.g. a critic body of another checkpoint.
        """
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from asyncrl.trainer.distributed.sharded_load import has_meta_parameters, materialise_shards

        param_dtype = torch.bfloat16 if self.mixed_precision else None
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        for layer in decoder_layers(module):
            fully_shard(layer, mesh=self.mesh, mp_policy=policy)
        fully_shard(module, mesh=self.mesh, mp_policy=policy)
        if has_meta_parameters(module):
            directory = weights if weights is not None else self.weights
            if directory is None:
                raise ValueError(
                    "a module on the meta device needs the model directory to load its shards from"
                )
            materialise_shards(module, directory, self.device)

    def sync_gradients(self, module: nn.Module, last: bool) -> None:
        """Reduce-scatter gradients in the coming backward: always with sharded accumulation; with unsharded
        accumulation only in the mini-batch's last pass (the passes before keep a full-size gradient here)."""
        module.set_requires_gradient_sync(last or self.grad_accumulation == "sharded")

    def reshard(self, module: nn.Module) -> None:
        """Free the whole parameters that no-grad forwards of ``module`` left gathered, keeping only the shards.

        Why: FSDP2 never reshards the root (embeddings, final norm, output layer) after a forward, expecting the
        backward to follow and reshard it. A no-grad pass has no backward: a frozen reference model, which only
        runs no-grad, would hold its root whole on every rank for the whole run (Qwen3-8B: 2 x 151,936 x 4,096
        parameters, 2.5 GB in bf16), and the policy would until its first backward. Decoder layers reshard
        after their own forward already; resharding them again is a no-op.
        """
        from torch.distributed.fsdp import FSDPModule

        for sub in module.modules():
            if isinstance(sub, FSDPModule):
                sub.reshard()

    def gather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The repeated blocks of every Hugging Face model inside ``module`` (its ``_no_split_modules`` classes)."""
    names: set[str] = set()
    for sub in module.modules():
        names.update(getattr(sub, "_no_split_modules", None) or ())
    layers = [sub for sub in module.modules() if type(sub).__name__ in names]
    if not layers:
        raise TypeError(
            f"{type(module).__name__}: found no decoder layers to shard (no _no_split_modules classes)"
        )
    return layers
