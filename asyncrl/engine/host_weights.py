"""Where a sleeping engine's weights wait in host memory (sleep level 2): one flat buffer, allocated at the first
sleep and copied into at every later one.

Why: a fresh pinned copy per sleep was pinned again at every step of a colocated switch. Wake dropped the
copies into PyTorch's pinned host allocator's cache; ``torch.cuda.graph`` empties that cache on entry
(``torch._C._host_emptyCache``, torch 2.13 ``cuda/graphs.py``), and every wake is followed by decode captures;
so the next sleep pinned the whole model again (``cudaHostAlloc``), each tensor rounded up to a power of two
by that allocator: Qwen3-8B in bfloat16, 15.26 GiB of weights, took 20.31 GiB pinned, allocated and freed per
engine per step (read from the code, not measured: nothing here has a GPU).

Key decision: the buffer is ordinary host memory pinned in place (``cudaHostRegister``, as PyTorch's own
checkpoint stager pins its buffers, ``torch.cuda._pin_memory_utils``), outside that allocator: no capture
frees it and no rounding applies, the pinning is paid once at the exact size. The cost: the host memory stays
held while the engine is awake too (the model's bytes per engine, plus a 256-byte alignment per tensor), where
the copies were held only while it slept.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Sequence

import torch

logger = logging.getLogger(__name__)

ALIGNMENT = 256
"""Each tensor's byte offset in the buffer is a multiple of this, so every dtype's view of it is aligned."""

HOST_REGISTER_PORTABLE = 1
"""``cudaHostRegisterPortable``: pinned for every CUDA context of the process, as PyTorch's stager asks."""

Layout = tuple[tuple[torch.Size, torch.dtype], ...]


class HostWeights:
    """Host copies of a list of tensors, as views into one flat buffer, reused while the list's shapes and
    dtypes stay the same (``hold``); pinned in place when ``pin`` (the engine serves on CUDA). ``what`` the
    copies are, for errors and warnings (the trainer's offloaded state keeps its copies here too,
    ``trainer.offload``)."""

    def __init__(self, pin: bool, what: str = "a sleeping engine's weights") -> None:
        self.pin = pin
        self.what = what
        self.nbytes = 0
        """The buffer's size (0 before the first ``hold``)."""
        self.allocations = 0
        """How many buffers were allocated: one per layout change (1 while the layout never changes)."""
        self._layout: Layout | None = None
        self._views: list[torch.Tensor] = []
        self._unpin: Callable[[], object] = _nothing

    def hold(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Host copies of ``tensors``, in their order: views into the buffer, which is allocated at the first
        call and again only when the tensors' shapes or dtypes change (an adapter's layout, ``LLMEngine``)."""
        if not tensors:  # no adapter: nothing to allocate
            return []
        layout = tuple((tensor.shape, tensor.dtype) for tensor in tensors)
        if layout != self._layout:
            self._allocate(layout)
        for view, tensor in zip(self._views, tensors, strict=True):
            view.copy_(tensor)
        return list(self._views)

    def _allocate(self, layout: Layout) -> None:
        """A buffer for ``layout``, the previous one unpinned first (a view of it the engine still holds keeps
        its memory, unpinned)."""
        self._unpin()
        offsets, end = [], 0
        for shape, dtype in layout:
            offsets.append(end)
            end += -(-shape.numel() * dtype.itemsize // ALIGNMENT) * ALIGNMENT
        buffer = allocate_host(end)
        self._unpin = pin_in_place(self, buffer, self.what) if self.pin and end else _nothing
        self._views = [
            buffer[offset : offset + shape.numel() * dtype.itemsize].view(dtype).view(shape)
            for offset, (shape, dtype) in zip(offsets, layout, strict=True)
        ]
        self._layout = layout
        self.nbytes = end
        self.allocations += 1


def allocate_host(nbytes: int) -> torch.Tensor:
    """``nbytes`` of plain host memory (the one allocation ``HostWeights`` makes per layout)."""
    return torch.empty(nbytes, dtype=torch.uint8)


def pin_in_place(owner: object, buffer: torch.Tensor, what: str) -> Callable[[], object]:
    """Page-lock ``buffer`` where it lies (``cudaHostRegister``), so copies to and from the device run at full
    link speed; the returned call, or ``owner`` being collected, unpins it. That call holds ``buffer`` until it
    runs, so its memory is never freed while registered (CUDA's requirement). Not run at exit: the process's
    end releases both."""
    error = int(
        torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), buffer.nbytes, HOST_REGISTER_PORTABLE)
    )
    if error:
        raise RuntimeError(
            f"pinning {buffer.nbytes} bytes of host memory for {what} failed "
            f"(cudaHostRegister: cudaError {error})"
        )
    unpin = weakref.finalize(owner, _unregister, buffer, what)
    unpin.atexit = False
    return unpin


def _unregister(buffer: torch.Tensor, what: str) -> None:
    error = int(torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr()))
    if error:  # a finalizer cannot raise to anyone: the memory stays pinned until the process ends
        logger.warning("unpinning the host memory of %s failed (cudaError %d)", what, error)


def _nothing() -> None:
    """Unpinning a buffer that was never pinned."""
