"""A preallocated pool of KV slots: one slot per running request, each holding up to ``max_len`` positions.

Layout per layer: ``[num_slots, num_kv_heads, max_len + 1, head_dim]``. A request keeps its slot from
admission to finish, so joining, leaving, aborting or re-prefilling one request touches only its own slot and
never rebuilds a batch cache. The extra last position is scratch: idle rows of a decode batch write there, so
a decode step can span a range of slots with plain views instead of gathering the active ones.
"""

from __future__ import annotations

from pathlib import Path

import torch


class KVCache:
    """Key and value pools for every layer, plus the writes and reads the model runner needs."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        allocate: bool = True,
    ) -> None:
        """``allocate``: False leaves the pool released until ``restore`` (an engine started asleep)."""
        self._shape = (num_slots, num_kv_heads, max_len + 1, head_dim)
        self._layout = (num_layers, dtype, device)
        self.max_len = max_len
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        if allocate:
            self.restore()

    @property
    def released(self) -> bool:
        """Whether the pool is freed (``release``) and must be ``restore``d before the next write."""
        return not self.keys

    def release(self) -> int:
        """Drop every layer's key and value pool (a sleeping engine, colocated sync: the trainer gets the
        memory); the bytes let go. The caller must forget every request's KV first (nothing survives)."""
        freed = self.resident_bytes()
        self.keys, self.values = [], []
        return freed

    def restore(self) -> int:
        """Allocate the pools again, zeroed as at construction; the bytes allocated (0 if never released)."""
        if not self.released:
            return 0
        num_layers, dtype, device = self._layout
        self.keys = [torch.zeros(self._shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(self._shape, dtype=dtype, device=device) for _ in range(num_layers)]
        return self.resident_bytes()

    def resident_bytes(self) -> int:
        """Bytes the pools hold now (0 while released)."""
        return sum(t.nbytes for t in (*self.keys, *self.values))

    @property
    def scratch_position(self) -> int:
        return self.max_len

    def write_rows(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Decode write: row ``i`` of ``k``/``v`` ``[n, kv_heads, 1, head_dim]`` goes to slot ``i`` at ``positions[i]``."""
        rows = torch.arange(k.shape[0], device=k.device)
        self.keys[layer][rows, :, positions] = k[:, :, 0]
        self.values[layer][rows, :, positions] = v[:, :, 0]

    def write_chunk(self, layer: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Prefill write: ``k``/``v`` ``[1, kv_heads, T, head_dim]`` go to ``slot`` at ``[start, start + T)``."""
        end = start + k.shape[2]
        self.keys[layer][slot, :, start:end] = k[0]
        self.values[layer][slot, :, start:end] = v[0]

    def write_positions(
        self, layer: int, slots: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Batched prefill write: ``k``/``v`` ``[rows, kv_heads, T, head_dim]``; token ``j`` of row ``r`` goes
        to slot ``slots[r]`` at ``positions[r, j]`` (padding points at the scratch position)."""
        rows = slots[:, None].expand_as(positions)
        self.keys[layer][rows, :, positions] = k.transpose(1, 2)
        self.values[layer][rows, :, positions] = v.transpose(1, 2)

    def gather(self, layer: int, slots: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the listed ``slots`` (any order) over positions ``[0, length)``, copied."""
        return self.keys[layer][slots, :, :length], self.values[layer][slots, :, :length]

    def move(self, src: int, dst: int, num_positions: int) -> None:
        """Copy one request's KV to another slot (slot compaction); positions past ``num_positions`` are junk."""
        for pool in (*self.keys, *self.values):
            pool[dst, :, :num_positions] = pool[src, :, :num_positions]

    def swap(self, a: int, b: int, num_positions: int) -> None:
        """Exchange two requests' KV (slot ordering by length); positions past ``num_positions`` are junk."""
        pair, crossed = [a, b], [b, a]
        for pool in (*self.keys, *self.values):
            pool[pair, :, :num_positions] = pool[crossed, :, :num_positions]

    def view(self, layer: int, slots: slice, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``slots`` over positions ``[0, length)``, as views (no copy)."""
        return self.keys[layer][slots, :, :length], self.values[layer][slots, :, :length]


def pool_bytes(
    *, num_layers: int, num_slots: int, max_len: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes the keys and values of a ``KVCache`` with these dimensions take (scratch position included)."""
    element = torch.empty(0, dtype=dtype).element_size()
    return 2 * num_layers * num_slots * num_kv_heads * (max_len + 1) * head_dim * element


def available_bytes(device: torch.device) -> int | None:
    """Memory free for a new allocation on ``device``: on CUDA the device's free memory plus what this
    process's caching allocator holds reserved but unallocated there, else the host's ``MemAvailable``;
    None where it cannot be read (the pool is then allocated unchecked).

    Why the reserved-but-unallocated bytes: ``mem_get_info`` counts them as used, yet the allocator hands
    them to the next allocation. The inline runtime gives each engine a float32 copy of the trainer's model
    which the engine casts to bfloat16 in place: the float32 storage freed by the cast stays cached (6.9 GiB
    at 1.7B parameters, 16 at 4B, 32.8 at 8B, by the review's arithmetic), and a check on ``mem_get_info``
    alone would refuse a pool that fits, or size one that much too small. Counted rather than freed with
    ``empty_cache``: another thread of this process (the inline trainer on the same GPU) may be allocating
    meanwhile, and what it takes from the cache raises ``memory_allocated`` (process-wide, every thread) at
    once, so a block is never counted both as cached and as free. The cached part is an upper bound where a
    cached segment is partly in use (it cannot be handed out whole); the segments a cast frees are whole."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return free + max(cached, 0)
    meminfo = Path("/proc/meminfo")
    if device.type != "cpu" or not meminfo.is_file():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None
