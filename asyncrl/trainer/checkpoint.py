"""Checkpoints: model weights (safetensors), optimizer, scheduler, step, policy version, RNG states, and an
opaque ``extra`` dict for the caller (data position, consumed prompt uids).

Key decision: a checkpoint is written into a hidden temporary directory and renamed into place
(``<root>/step_00000012``) in one atomic step, so a crash mid-save never leaves a directory that
``latest_checkpoint`` would pick up half-written.

    <root>/step_00000012/
        model/               save_pretrained: config.json + model.safetensors
        trainer_state.pt     optimizer, scheduler, step, version, RNG states (torch.load weights_only)
        extra.json           the caller's dict, as JSON
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn

from asyncrl.trainer.trainer import Trainer

_STEP_DIR = re.compile(r"^step_(\d+)$")
MODEL_DIR = "model"
STATE_FILE = "trainer_state.pt"
EXTRA_FILE = "extra.json"


def checkpoint_due(step: int, checkpoint_every: int) -> bool:
    """Whether a periodic checkpoint is due after train step ``step`` (1-based count of completed steps)."""
    return checkpoint_every > 0 and step > 0 and step % checkpoint_every == 0


def save_checkpoint(
    root: str | os.PathLike[str],
    trainer: Trainer,
    *,
    extra: dict[str, Any] | None = None,
    keep_last: int | None = None,
) -> Path:
    """Write ``trainer``'s full state to ``root/step_<step>`` atomically; return that directory.

    ``extra`` must be JSON-serialisable. With ``keep_last``, older step directories beyond that many are
    deleted afterwards.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{trainer.step:08d}"
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
    try:
        trainer.model.save_pretrained(staging / MODEL_DIR)
        torch.save({**trainer.state_dict(), "rng": _rng_state()}, staging / STATE_FILE)
        (staging / EXTRA_FILE).write_text(json.dumps(extra or {}, indent=1))
        _move_into_place(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if keep_last is not None:
        prune_checkpoints(root, keep_last)
    return final


def load_checkpoint(path: str | os.PathLike[str], trainer: Trainer) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler, step, version and RNG states into ``trainer``; return ``extra``."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{path} is not an asyncrl checkpoint (no {STATE_FILE})")
    load_model_weights(trainer.model, path / MODEL_DIR)
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    trainer.load_state_dict(state)
    _set_rng_state(state["rng"])
    return json.loads((path / EXTRA_FILE).read_text())


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint with the highest step under ``root``; None when there is none."""
    steps = _step_dirs(Path(root))
    return steps[-1][1] if steps else None


def prune_checkpoints(root: str | os.PathLike[str], keep_last: int) -> list[Path]:
    """Delete all but the ``keep_last`` newest checkpoints under ``root``; return the deleted directories."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    doomed = [path for _, path in _step_dirs(Path(root))[:-keep_last]]
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def load_model_weights(model: nn.Module, model_dir: Path) -> None:
    """Load every ``*.safetensors`` file of a save_pretrained directory into ``model`` in place.

    Keys absent from the files are accepted only when they are tied to a loaded tensor (save_pretrained
    drops ``lm_head.weight`` when it is the input embedding); any other missing or unexpected key is an error.
    """
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {model_dir}")
    state = {name: t for f in files for name, t in load_file(f).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tensors = model.state_dict()
    loaded_ptrs = {tensors[name].data_ptr() for name in state if name in tensors}
    untied = [name for name in missing if tensors[name].data_ptr() not in loaded_ptrs]
    if untied or unexpected:
        raise ValueError(
            f"checkpoint {model_dir} does not match the model: missing {untied}, unexpected {unexpected}"
        )


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of the complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.match(path.name)
        if match and (path / STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def _move_into_place(staging: Path, final: Path) -> None:
    """Rename ``staging`` to ``final``; an existing ``final`` (same step saved again) is replaced."""
    if final.exists():
        retired = final.with_name(f".old-{final.name}-{os.getpid()}")
        final.rename(retired)
        staging.rename(final)
        shutil.rmtree(retired)
    else:
        staging.rename(final)


def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.copy()), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
