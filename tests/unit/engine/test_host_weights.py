"""A sleeping engine's host buffer (``engine.host_weights``): one flat buffer per layout, each tensor an aligned
view of it, pinned in place at its exact size on CUDA and unpinned before its memory can be freed. The CUDA
runtime is a fake here (no GPU); the GPU kit's sleep tests pin for real."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest
import torch

from asyncrl.engine.host_weights import ALIGNMENT, HostWeights


@pytest.fixture
def cudart(monkeypatch) -> SimpleNamespace:
    """A fake ``torch.cuda.cudart()``: its register and unregister calls in ``calls``; a register returns
    ``error`` (0: success)."""
    fake = SimpleNamespace(calls=[], error=0)
    fake.cudaHostRegister = lambda ptr, size, flags: fake.calls.append(("register", ptr, size)) or fake.error
    fake.cudaHostUnregister = lambda ptr: fake.calls.append(("unregister", ptr)) or 0
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    return fake


def test_one_buffer_holds_every_tensor_aligned_and_is_reused_while_the_layout_stays(cudart):
    host = HostWeights(pin=True)
    tensors = [torch.arange(3, dtype=torch.bfloat16), torch.arange(300.0).reshape(10, 30), torch.ones(0)]
    copies = host.hold(tensors)
    base = copies[0].data_ptr()
    assert copies[1].data_ptr() - base == ALIGNMENT and copies[2].shape == (0,)
    assert host.nbytes == 6 * ALIGNMENT  # 6 B → 256, 1,200 B → 1,280, 0 B → 0
    assert cudart.calls == [("register", base, 6 * ALIGNMENT)]  # the exact size, not a power of two
    assert all(torch.equal(c, t) and c.dtype == t.dtype for c, t in zip(copies, tensors, strict=True))
    again = host.hold([t + 1 for t in tensors])
    assert [c.data_ptr() for c in again] == [c.data_ptr() for c in copies] and len(cudart.calls) == 1
    assert torch.equal(again[1], tensors[1] + 1)


def test_a_new_layout_unpins_the_old_buffer_first_and_dropping_the_holder_unpins_the_last(cudart):
    host = HostWeights(pin=True)
    old = host.hold([torch.zeros(4)])[0].data_ptr()
    new = host.hold([torch.zeros(8, dtype=torch.float16)])[0].data_ptr()
    assert cudart.calls == [("register", old, ALIGNMENT), ("unregister", old), ("register", new, ALIGNMENT)]
    del host
    gc.collect()
    assert cudart.calls[3:] == [("unregister", new)]


def test_nothing_to_hold_allocates_nothing_and_unpinned_buffers_never_touch_cuda(cudart):
    assert HostWeights(pin=True).hold([]) == [] and cudart.calls == []
    host = HostWeights(pin=False)
    assert torch.equal(host.hold([torch.ones(2)])[0], torch.ones(2)) and cudart.calls == []


def test_a_failed_pin_is_raised_by_name(cudart):
    cudart.error = 2
    with pytest.raises(RuntimeError, match=r"cudaHostRegister: cudaError 2"):
        HostWeights(pin=True).hold([torch.ones(2)])
