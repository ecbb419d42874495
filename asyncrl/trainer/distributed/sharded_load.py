"""Each FSDP2 rank reads only its own shards of a model's weights from the safetensors files.

Why: loading the whole model on every rank before ``fully_shard`` needs the full model's bytes per rank (an 8B
fp32 model: 32.8 GB per GPU, and as much host RAM per rank), which caps the trainer's model size whatever
``num_workers`` is. Here the model is built with its parameters on the meta device
(``models.loading.load_configured_skeleton``), sharded, and only then given memory: each rank allocates its
shards and fills them with the rows it owns of each tensor, read from the files one tensor at a time, so a
rank's peak while loading is about its shard plus one tensor's rows.

Key decisions:
- The rows are read with plain file reads at offsets from the safetensors header (the format is an 8-byte
  header length, a JSON header of dtype, shape and byte range per tensor, then the raw row-major data).
  safetensors 0.8's ``safe_open(framework="pt").get_slice`` maps the whole file into one torch storage per
  open file, which torch's allocator reports as allocated (measured: one get_slice of 2 rows counted the whole
  file), so the shard-sized peak could not be measured, or relied on under a different mapping.
- FSDP2 shards every parameter on dim 0 into ``world_size`` chunks of ``ceil(rows / world_size)`` rows
  (``Shard(0)``, ``torch.chunk``'s split: the last chunks may be short or empty). The loader computes the rows
  from that rule and checks them against the local shard's shape, so a layout it does not know fails loudly
  instead of loading wrong rows.
- Buffers are not in the files (rotary ``inv_freq`` is computed from the config); the skeleton built them for
  real, and they are carried over the allocation unchanged.
- What the files hold is what the skeleton left on the meta device. Parameters built for real before sharding
  are the run's own and not in the files (LoRA adapters, drawn from the run's seed; a critic's zero value head):
  each rank keeps its shard of them over the allocation, as it keeps the buffers. A separate critic's body is a
  skeleton too: a copy of the policy's, read from the policy's files, or the body of ``critic.model_path``, read
  the same way from that checkpoint's files (the directory is an argument, ``FullyShardedParallel.shard``).
- Names: a module may hold Hugging Face models under any attribute (the log-prob wrapper, a reference copy, a
  critic's decoder body); each parameter is looked up under its name inside its outermost Hugging Face model,
  also with that model's ``base_model_prefix`` (a body ``layers.0...`` is the file's ``model.layers.0...``)
  and without peft's ``.base_layer`` (LoRA wraps ``q_proj`` and keeps its weight as ``q_proj.base_layer``).
  A tied output layer is one parameter, loaded once.
"""

from __future__ import annotations

import json
import struct
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME


def has_meta_parameters(module: nn.Module) -> bool:
    return any(p.is_meta for p in module.parameters())


def weight_files(directory: Path) -> dict[str, Path]:
    """{tensor name: safetensors file holding it} of a Hugging Face model directory (its index, else its one
    ``model.safetensors``)."""
    index = directory / SAFE_WEIGHTS_INDEX_NAME
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: directory / filename for name, filename in weight_map.items()}
    single = directory / SAFE_WEIGHTS_NAME
    if single.is_file():
        with _SafetensorsFile(single) as handle:
            return dict.fromkeys(handle.entries, single)
    raise FileNotFoundError(f"{directory}: no {SAFE_WEIGHTS_INDEX_NAME} or {SAFE_WEIGHTS_NAME} to load from")


def materialise_shards(module: nn.Module, directory: Path, device: torch.device) -> None:
    """Give ``module``'s meta parameters (already ``fully_shard``-ed) memory on ``device`` and fill each with
    this rank's rows of the same-named tensor in ``directory`` (a meta parameter the files lack is an error);
    its real parameters and buffers keep their values (this rank's shard of them)."""
    files = weight_files(directory)
    buffers = {name: buffer.detach().clone() for name, buffer in module.named_buffers()}
    kept = {name: _local(p).detach().clone() for name, p in module.named_parameters() if not p.is_meta}
    loaded = {name for name, p in module.named_parameters() if p.is_meta}
    module.to_empty(device=device)
    names = _file_names(module, files, loaded)  # after: allocating may give a parameter a new object
    with torch.no_grad():
        for name, buffer in module.named_buffers():
            buffer.copy_(buffers[name])
        for name, param in module.named_parameters():
            if name in kept:
                _local(param).copy_(kept[name])
        with ExitStack() as stack:
            handles: dict[Path, _SafetensorsFile] = {}
            for param in module.parameters():
                if id(param) not in names:
                    continue
                key = names[id(param)]
                path = files[key]
                if path not in handles:
                    handles[path] = stack.enter_context(_SafetensorsFile(path))
                _fill_shard(param, handles[path], key)


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``param`` (the tensor itself when it is not sharded)."""
    return param.to_local() if hasattr(param, "to_local") else param


def _file_names(module: nn.Module, files: dict[str, Path], loaded: set[str]) -> dict[int, str]:
    """{id(parameter): its tensor's name in the files}, for every parameter of ``module`` named in ``loaded``
    (its names in ``module``)."""
    wanted = {id(p) for name, p in module.named_parameters() if name in loaded}
    names: dict[int, str] = {}
    for model in _outermost_hf_models(module):
        prefix = getattr(model, "base_model_prefix", "")
        for name, param in model.named_parameters():
            if id(param) not in wanted:
                continue
            plain = name.replace(".base_layer.", ".")
            candidates = [plain, f"{prefix}.{plain}"] if prefix else [plain]
            found = next((c for c in candidates if c in files), None)
            if found is None:
                raise KeyError(
                    f"{type(model).__name__}.{name}: not in the model files (looked for {candidates})"
                )
            names[id(param)] = found
    missing = [
        name for name, param in module.named_parameters() if id(param) in wanted and id(param) not in names
    ]
    if missing:
        raise KeyError(f"parameters outside any Hugging Face model cannot be loaded from files: {missing}")
    return names


def _outermost_hf_models(module: nn.Module) -> list[PreTrainedModel]:
    found: list[PreTrainedModel] = []
    inner: set[int] = set()
    for sub in module.modules():
        if isinstance(sub, PreTrainedModel) and id(sub) not in inner:
            found.append(sub)
            inner.update(id(m) for m in sub.modules())
    return found


def _fill_shard(param: torch.Tensor, source: _SafetensorsFile, key: str) -> None:
    """Copy this rank's rows of the tensor ``key`` of ``source`` into ``param``'s shard."""
    shape = source.shape(key)
    if shape != tuple(param.shape):
        raise ValueError(f"{key}: the files hold shape {shape}, the model expects {tuple(param.shape)}")
    rows = shape[0] if shape else 1
    if not hasattr(param, "to_local"):  # not sharded (one rank, or left out of FSDP2)
        param.copy_(source.rows(key, 0, rows).reshape(shape))
        return
    local = param.to_local()
    mesh = param.device_mesh
    chunk = -(-rows // mesh.size())
    start = min(mesh.get_local_rank() * chunk, rows)
    stop = min(start + chunk, rows)
    if (stop - start,) + shape[1:] != tuple(local.shape):
        raise ValueError(
            f"{key}: this rank's shard has shape {tuple(local.shape)}, expected rows {start}:{stop} of {shape} "
            "(an FSDP2 layout other than Shard(0))"
        )
    if stop > start:
        local.copy_(source.rows(key, start, stop))


_FILE_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class _SafetensorsFile:
    """One safetensors file read a row range at a time (see the module docstring for why not ``safe_open``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path.open("rb")
        (length,) = struct.unpack("<Q", self.file.read(8))
        header = json.loads(self.file.read(length))
        header.pop("__metadata__", None)
        self.entries: dict[str, dict[str, Any]] = header
        self.data_start = 8 + length

    def __enter__(self) -> _SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.entries[key]["shape"])

    def rows(self, key: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of tensor ``key`` (dim 0; a 0-d tensor is one row), read from disk alone."""
        entry = self.entries[key]
        dtype = _FILE_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{self.path}: {key} has dtype {entry['dtype']}, which the loader does not read")
        shape = tuple(entry["shape"])
        inner = shape[1:] if shape else ()
        out = torch.empty((stop - start, *inner), dtype=dtype)
        row_bytes = out[0].numel() * out.element_size() if len(out) else 0
        self.file.seek(self.data_start + entry["data_offsets"][0] + start * row_bytes)
        buffer = out.view(-1).view(torch.uint8).numpy()
        if self.file.readinto(buffer) != buffer.nbytes:
            raise ValueError(
                f"{self.path}: {key} is cut short (the file ends inside its rows {start}:{stop})"
            )
        return out
