"""Checkpoints: model weights (safetensors), optimizer, scheduler, step, policy version, RNG states, and an
opaque ``extra`` dict for the caller (data position, consumed prompt uids).

Key decision: a checkpoint is written into a hidden temporary directory, every file fsynced, then a marker
holding the SHA-256 of every file is written and fsynced, the directory renamed into place
(``<root>/step_00000012``) and the parent fsynced. A loader trusts a checkpoint only when its marker exists and
every hash matches, so a crash (even SIGKILL or power loss) mid-save never leaves a checkpoint that is loaded
half-written; ``latest_checkpoint`` skips such directories and says why.

Every file is hashed once per use, where it is read: ``load_checkpoint`` (and a sharded load's ranks, each a
share) verify before they change anything. A training resume (``load_resume``) therefore only checks markers
and directory listings to choose its directory, and lets the load verify (the driver used to hash the whole
checkpoint alone first, and the ranks then again: ~88 s for Qwen3-8B's ~115 GB at ~1.3 GB/s, on every restart
too). ``asyncrl export`` and ``eval`` read the weights themselves, so they verify with ``resolve_resume_path``.

A save of the step a trainer's state was last saved or loaded as (``Trainer.saved_in``: no train step since, so
the same weights, optimizer, step and RNG states) rewrites only ``extra.json``: the staging directory gets hard
links to the saved files and the fresh ``extra``, and their hashes are the marker's (``relink_saved``). So a
run's final checkpoint after a periodic one of the same step costs a listing and the ``extra``, not the whole
state again (~115 GB for Qwen3-8B sharded).

What a killed save leaves is removed by the next save (``sweep_orphans``, run by the saver before it stages):
its staging directory (``.tmp-step_*``), and a retired copy (``.old-step_*``, ``_move_into_place``) once its
step is in place again. A retired copy whose step is not in place (a save killed between ``_move_into_place``'s
two renames) is that step's only copy: it is kept, and loaders take it for that step (``_step_dirs``).

    <root>/step_00000012/
        model/               save_pretrained: config.json + model.safetensors
        adapter/             instead of model/ with LoRA (trainer.lora): peft's adapter format, the base untouched
        critic/              a critic's weights (runs with one): model.safetensors of its value model or head
        trainer_state.pt     optimizer, scheduler, step, version, skipped-update count, RNG states (torch.load
                             weights_only)
        extra.json           the caller's dict, as compact JSON (data position, buffered groups, consumed prompts)
        COMPLETE.json        {relative path: sha256} of every file above, written last
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from asyncrl.trainer.lora import load_adapter, merge_adapter, save_adapter
from asyncrl.trainer.trainer import Trainer

_STEP_DIR = re.compile(r"^step_(\d+)$")
_STAGING, _RETIRED = ".tmp-", ".old-"
"""Name prefixes of a save's staging directory and of a step directory it replaces (``_move_into_place``)."""
_ORPHAN = re.compile(r"^(\.tmp-|\.old-)step_(\d+)-")
_RETIRED_DIR = re.compile(r"^\.old-step_(\d+)-")
MODEL_DIR = "model"
ADAPTER_DIR = "adapter"
"""A LoRA trainer's adapters (peft's format) in place of ``MODEL_DIR``: the base weights are the model's own."""
CRITIC_FILE = "critic/model.safetensors"
SHARDED_DIR = "sharded"
"""Model and optimizer shards of a checkpoint written by a sharded trainer (``trainer.distributed.checkpoint``)."""
STATE_FILE = "trainer_state.pt"
EXTRA_FILE = "extra.json"
MARKER_FILE = "COMPLETE.json"

logger = logging.getLogger(__name__)

T = TypeVar("T")


class TornCheckpointError(ValueError):
    """A checkpoint directory without a valid completion marker: written partly, or changed since."""


class CheckpointTimeout(TimeoutError):
    """Verifying a checkpoint's hashes in this process took longer than its deadline (``verify_checkpoint``'s
    ``timeout_for``): storage too slow for ``runtime.checkpoint_timeout_gbps``, or stalling."""


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
    deleted afterwards. A trainer whose state ``root/step_<step>`` holds already gets only ``extra`` rewritten
    there (module docstring).
    """
    staging, final = new_staging(root, trainer.step)
    try:
        relinked = relink_saved(trainer, final, staging)
        if relinked is None:
            _write_trainer_files(staging, trainer)
        write_extra(staging, extra)
        commit(staging, final, keep_last, relinked)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    trainer.saved_in = final
    return final


def _write_trainer_files(staging: Path, trainer: Trainer) -> None:
    """Everything of a one-process checkpoint but ``extra``: the weights (or adapters), a critic's, the state."""
    if trainer.peft_model is not None:
        save_adapter(trainer.peft_model, staging / ADAPTER_DIR)
    else:
        trainer.model.save_pretrained(staging / MODEL_DIR)
    if trainer.critic is not None:
        (staging / CRITIC_FILE).parent.mkdir()
        save_file(
            {n: t.contiguous() for n, t in trainer.critic.module.state_dict().items()},
            staging / CRITIC_FILE,
        )
    torch.save({**trainer.state_dict(), "rng": rng_state(trainer.device)}, staging / STATE_FILE)


def relink_saved(trainer: Trainer, final: Path, staging: Path) -> dict[str, str] | None:
    """When ``final`` is the complete checkpoint ``trainer``'s state was last saved or loaded as
    (``Trainer.saved_in``): every file of it but ``extra.json`` hard-linked into the empty ``staging``, and
    their hashes as its marker holds them (``commit``'s ``hashed``: not read again). None (``staging`` left
    empty) when the state is not saved there, the checkpoint is torn, or the filesystem refuses hard links:
    the caller writes the whole state. A link shares the file, so nothing may write into a linked file; nothing
    does, as a checkpoint's files are only written in staging and then read."""
    if trainer.saved_in is None or trainer.saved_in.resolve() != final.resolve():
        return None
    try:
        hashes = marker_hashes(final)
        for name in hashes:
            if name != EXTRA_FILE:
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                os.link(final / name, staging / name)
    except (TornCheckpointError, OSError) as error:
        logger.warning("checkpoint %s: writing the whole state again (%s)", final, error)
        shutil.rmtree(staging)
        staging.mkdir()
        return None
    return {name: digest for name, digest in hashes.items() if name != EXTRA_FILE}


def new_staging(root: str | os.PathLike[str], step: int) -> tuple[Path, Path]:
    """(a fresh hidden staging directory under ``root``, the step directory it will become). Called by the
    process that saves (rank 0 of a sharded save), whose saves never overlap: what a killed save left under
    ``root`` goes first (``sweep_orphans``), so no more than the kept checkpoints and this one take disk."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    sweep_orphans(root)
    final = root / f"step_{step:08d}"
    return Path(tempfile.mkdtemp(prefix=f"{_STAGING}{final.name}-", dir=root)), final


def sweep_orphans(root: Path) -> list[Path]:
    """Delete what saves killed midway left under ``root``; return what was deleted. Every staging directory
    (``.tmp-step_*``: a save that never reached its rename, which is a checkpoint's commit), and every retired
    copy (``.old-step_*``) whose step is in place and complete. A retired copy whose step is not (the save was
    killed between ``_move_into_place``'s two renames) is that step's only complete copy: it is kept (logged),
    and loaders take it for its step until a later save of that step retires it for good."""
    deleted = []
    for path in sorted(root.iterdir()):
        match = _ORPHAN.match(path.name)
        if match is None or not path.is_dir():
            continue
        if match.group(1) == _STAGING or _is_complete(root / f"step_{match.group(2)}"):
            shutil.rmtree(path)
            deleted.append(path)
        else:
            logger.warning(
                "checkpoint: keeping %s: step_%s is not in place, so it may be its only copy",
                path,
                match.group(2),
            )
    if deleted:
        logger.warning("checkpoint: deleted what interrupted saves left: %s", [p.name for p in deleted])
    return deleted


def _is_complete(path: Path) -> bool:
    """Whether ``path`` is a checkpoint whose marker names exactly its files (``marker_hashes``)."""
    try:
        marker_hashes(path)
    except TornCheckpointError:
        return False
    return True


def write_state(staging: Path, state: dict[str, Any], extra: dict[str, Any] | None) -> None:
    """The trainer state file (``torch.save``) and the caller's ``extra`` (``write_extra``)."""
    torch.save(state, staging / STATE_FILE)
    write_extra(staging, extra)


def write_extra(staging: Path, extra: dict[str, Any] | None) -> None:
    """The caller's ``extra`` as compact JSON: it holds every buffered group's tokens (hundreds of MB at
    real shapes), which an indented dump makes larger and encodes in pure Python (``json`` uses its C encoder
    only without ``indent``). Older, indented files load the same."""
    (staging / EXTRA_FILE).write_text(json.dumps(extra or {}, separators=(",", ":")))


def commit(
    staging: Path, final: Path, keep_last: int | None, hashed: Mapping[str, str] | None = None
) -> None:
    """Make a fully written ``staging`` the checkpoint ``final``: marker, rename, fsync, then prune.
    ``hashed``: files already fsynced and hashed (``write_marker``)."""
    write_marker(staging, hashed)
    _move_into_place(staging, final)
    _fsync_dir(final.parent)
    if keep_last is not None:
        prune_checkpoints(final.parent, keep_last)


def read_state(path: Path) -> dict[str, Any]:
    """The trainer state of a verified checkpoint directory."""
    return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)


def read_extra(path: Path) -> dict[str, Any]:
    """The caller's ``extra`` of a verified checkpoint directory."""
    return json.loads((path / EXTRA_FILE).read_text())


def load_checkpoint(
    path: str | os.PathLike[str], trainer: Trainer, *, timeout_for: Callable[[int], float] | None = None
) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler, step, version and RNG states into ``trainer``; return ``extra``.
    Every file is verified first (``verify_checkpoint``, within ``timeout_for``), so a ``TornCheckpointError``
    leaves ``trainer`` untouched: ``load_resume`` may go on to an older checkpoint."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{path} is not an asyncrl checkpoint (no {STATE_FILE})")
    if (path / SHARDED_DIR).is_dir():  # said before hashing what could not be loaded anyway
        raise ValueError(
            f"{path} holds sharded weights (a trainer with num_workers > 1 wrote it): resume it with the Ray "
            "runtime, whose trainer ranks load sharded checkpoints at any num_workers"
        )
    verify_checkpoint(path, timeout_for)
    load_trained_weights(trainer, path)
    state = read_state(path)
    trainer.load_state_dict(state)  # first: it refuses a checkpoint whose critic does not match the run
    if trainer.critic is not None:
        trainer.critic.module.load_state_dict(load_file(path / CRITIC_FILE))
    set_rng_state(state["rng"], trainer.device)
    trainer.saved_in = path
    return read_extra(path)


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The verified checkpoint with the highest step under ``root``; None when there is none. Each newer
    directory that fails verification is skipped with a warning saying why."""
    found = _first_that_loads(complete_checkpoints(Path(root)), verify_checkpoint)
    return None if found is None else found[0]


def resolve_resume_path(path: str | os.PathLike[str]) -> Path:
    """The checkpoint ``PATH`` names, every file hashed here: a step directory itself (verified), or the newest
    verified one under a run directory (``PATH/checkpoints``) or a checkpoints directory. For callers that read
    the weights without ``load_checkpoint`` (``asyncrl export``, ``eval --checkpoint``); a training resume uses
    ``load_resume``, whose load verifies."""
    return load_resume(path, verify_checkpoint)[0]


def load_resume(path: str | os.PathLike[str], load: Callable[[Path], T]) -> tuple[Path, T]:
    """(the checkpoint ``resume=PATH`` names, what ``load`` returned for it). ``load`` must verify every hash
    before it changes anything and raise ``TornCheckpointError`` when one fails (``load_checkpoint``, a sharded
    load's ranks, ``verify_checkpoint``): the content is hashed once, there.

    Here only markers and directory listings are read (``marker_hashes``), so choosing the directory costs no
    hashing however large the checkpoint. ``PATH`` a step directory: that one, or the error naming its problem.
    Else the newest under ``PATH/checkpoints`` or ``PATH`` that loads: each newer one torn (no marker, a file
    missing or extra: skipped without a read; a wrong hash: when its load refuses it) is skipped with a warning
    saying why, as ``latest_checkpoint`` skips it; ``FileNotFoundError`` when none loads."""
    path = Path(path)
    if (path / STATE_FILE).is_file():
        marker_hashes(path)  # a torn named checkpoint is refused before anything loads
        return path, load(path)
    candidates = (found for root in (path / "checkpoints", path) for found in complete_checkpoints(root))
    loaded = _first_that_loads(candidates, load)
    if loaded is None:
        raise FileNotFoundError(f"resume: no verified checkpoint at or under {path}")
    return loaded


def complete_checkpoints(root: Path) -> Iterator[Path]:
    """The step directories under ``root``, newest first, whose marker names exactly the files present
    (``marker_hashes``: no file but the marker is read); each other one is skipped with a warning saying why."""
    for _, path in reversed(_step_dirs(root)):
        try:
            marker_hashes(path)
        except TornCheckpointError as err:
            logger.warning("skipping checkpoint %s: %s", path, err)
            continue
        yield path


def _first_that_loads(candidates: Iterable[Path], load: Callable[[Path], T]) -> tuple[Path, T] | None:
    """(the first of ``candidates`` that ``load`` accepts, its result); each refused as torn is skipped with a
    warning saying why."""
    for path in candidates:
        try:
            return path, load(path)
        except TornCheckpointError as err:
            logger.warning("skipping checkpoint %s: %s", path, err)
    return None


def write_marker(directory: Path, hashed: Mapping[str, str] | None = None) -> None:
    """fsync and hash every file under ``directory`` but those in ``hashed`` ({relative path: sha256}, fsynced
    and hashed by the caller: a sharded save's ranks, each its share), then write and fsync the marker with
    every file's hash. The marker is the same whoever hashed which file."""
    files = checkpoint_files(directory)
    hashed = dict(hashed or {})
    if not set(hashed) <= set(files):
        raise ValueError(
            f"{directory}: hashed files not in the directory: {sorted(set(hashed) - set(files))}"
        )
    hashed.update(hash_files(directory, [name for name in files if name not in hashed]))
    marker = directory / MARKER_FILE
    marker.write_text(json.dumps({name: hashed[name] for name in files}, indent=1))
    _fsync_file(marker)
    for sub in sorted({p.parent for p in directory.rglob("*")}, key=lambda p: -len(p.parts)):
        _fsync_dir(sub)


def checkpoint_files(directory: Path) -> list[str]:
    """Every file under ``directory`` but the marker, as the marker names them (relative, sorted)."""
    files = (p for p in sorted(directory.rglob("*")) if p.is_file())
    return [name for name in (p.relative_to(directory).as_posix() for p in files) if name != MARKER_FILE]


def hash_files(directory: Path, names: Iterable[str]) -> dict[str, str]:
    """fsync each of ``names`` (relative to ``directory``) and hash it: its marker entries."""
    hashes = {}
    for name in names:
        _fsync_file(directory / name)
        hashes[name] = _sha256(directory / name)
    return hashes


def verify_checkpoint(path: Path, timeout_for: Callable[[int], float] | None = None) -> None:
    """``TornCheckpointError`` naming the first problem: no marker, a missing or extra file, a wrong hash.
    ``timeout_for``: the seconds the hashing may take for the checkpoint's bytes (``runtime.
    checkpoint_timeout_s``), past which it stops with ``CheckpointTimeout``; None: no deadline."""
    expected = marker_hashes(path)
    deadline = None
    if timeout_for is not None:
        nbytes = sum((path / name).stat().st_size for name in expected)
        deadline = HashDeadline(timeout_for(nbytes), f"verifying {path} ({nbytes} bytes)")
    check_hashes(path, expected, expected, deadline)


class HashDeadline:
    """A monotonic-clock deadline for a loop of reads: ``check`` raises ``CheckpointTimeout`` naming ``what``
    and where it got to once ``timeout_s`` have passed since it was made. Checked between reads, it stops slow
    storage; a single read that never returns is not interrupted."""

    def __init__(self, timeout_s: float, what: str) -> None:
        self.timeout_s, self.what = timeout_s, what
        self._end = time.monotonic() + timeout_s

    def check(self, where: str) -> None:
        if time.monotonic() > self._end:
            raise CheckpointTimeout(f"{self.what}: past its deadline of {self.timeout_s:.1f} s, at {where}")


def check_hashes(
    path: Path, names: Iterable[str], expected: Mapping[str, str], deadline: HashDeadline | None = None
) -> None:
    """``TornCheckpointError`` naming the first of ``names`` whose hash is not ``expected``'s (within
    ``deadline``, checked between blocks)."""
    for name in names:
        if _sha256(path / name, deadline) != expected[name]:
            raise TornCheckpointError(f"{path}: {name} does not match its hash in {MARKER_FILE}")


def marker_hashes(path: Path) -> dict[str, str]:
    """The marker's {file: sha256}, once it is known to name exactly the files present; else
    ``TornCheckpointError`` (no marker, not JSON, a missing or extra file). The hashes are not checked here."""
    marker = path / MARKER_FILE
    if not marker.is_file():
        raise TornCheckpointError(f"{path}: no {MARKER_FILE} (the save did not finish)")
    try:
        expected = json.loads(marker.read_text())
    except json.JSONDecodeError as err:
        raise TornCheckpointError(f"{path}: {MARKER_FILE} is not valid JSON ({err.msg})") from err
    present = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {MARKER_FILE}
    if present != set(expected):
        raise TornCheckpointError(
            f"{path}: files differ from the marker (missing {sorted(set(expected) - present)}, "
            f"unexpected {sorted(present - set(expected))})"
        )
    return expected


def prune_checkpoints(root: str | os.PathLike[str], keep_last: int) -> list[Path]:
    """Delete all but the ``keep_last`` newest complete checkpoints under ``root`` (directories without a
    marker are left for a person to look at); return the deleted directories."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    complete = [path for _, path in _step_dirs(Path(root)) if (path / MARKER_FILE).is_file()]
    doomed = complete[:-keep_last]
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def load_trained_weights(trainer: Trainer, path: Path) -> None:
    """The weights a checkpoint trained into ``trainer``: its adapters (LoRA) or its model; ``ValueError`` when
    the checkpoint and ``trainer.lora`` disagree."""
    has_adapter = (path / ADAPTER_DIR).is_dir()
    if trainer.peft_model is not None and not has_adapter:
        raise ValueError(f"{path} holds full weights (no {ADAPTER_DIR}/): resume it without trainer.lora")
    if trainer.peft_model is None and has_adapter:
        raise ValueError(
            f"{path} holds LoRA adapters ({ADAPTER_DIR}/): resume it with its trainer.lora settings"
        )
    if has_adapter:
        load_adapter(trainer.peft_model, path / ADAPTER_DIR)
    else:
        load_model_weights(trainer.model, path / MODEL_DIR)


def served_model(model: nn.Module, path: str | os.PathLike[str]) -> nn.Module:
    """``model`` (the run's base model) with the weights checkpoint ``path`` trained: its ``model/`` loaded in
    place, or its LoRA ``adapter/`` merged in. For evaluation and export."""
    path = Path(path)
    if (path / ADAPTER_DIR).is_dir():
        return merge_adapter(model, path / ADAPTER_DIR)
    load_model_weights(model, path / MODEL_DIR)
    return model


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
    """(step, path) of the step directories under ``root``, oldest first (complete or not: see
    ``verify_checkpoint``). A retired copy (``.old-step_*``) stands for its step when no step directory
    does (``sweep_orphans``): a save killed between ``_move_into_place``'s renames leaves it the only copy."""
    if not root.is_dir():
        return []
    found, retired = {}, {}
    for path in sorted(root.iterdir()):
        step_dir, old = _STEP_DIR.match(path.name), _RETIRED_DIR.match(path.name)
        if step_dir and path.is_dir():
            found[int(step_dir.group(1))] = path
        elif old and path.is_dir():
            retired.setdefault(int(old.group(1)), path)
    return sorted({**retired, **found}.items())


def _move_into_place(staging: Path, final: Path) -> None:
    """Rename ``staging`` to ``final``; an existing ``final`` (same step saved again) is replaced."""
    if final.exists():
        retired = final.with_name(f"{_RETIRED}{final.name}-{os.getpid()}")
        final.rename(retired)
        staging.rename(final)
        shutil.rmtree(retired)
    else:
        staging.rename(final)


def _sha256(path: Path, deadline: HashDeadline | None = None) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            if deadline is not None:
                deadline.check(path.name)
            digest.update(block)
    return digest.hexdigest()


def _fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """The RNG states a resume restores: Python's, NumPy's, torch's CPU one, and the CUDA state of ``device``
    (the trainer's; not CUDA: the current device) as a list of one. One device only: a process seeing eight
    GPUs saved eight, and a resume seeing fewer failed on them (``IndexError``)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    cuda = [torch.cuda.get_rng_state(_cuda_index(device))] if torch.cuda.is_available() else []
    return {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.copy()), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
        "cuda": cuda,
    }


def set_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Restore ``rng_state``'s states; the CUDA one onto ``device`` (as ``rng_state``). An older checkpoint's
    list holds every visible device's state: ``device``'s own is taken, the first when it saw fewer."""
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    saved = state["cuda"]
    if saved and torch.cuda.is_available():
        index = _cuda_index(device)
        torch.cuda.set_rng_state(saved[index] if index < len(saved) else saved[0], index)


def _cuda_index(device: torch.device | None) -> int:
    """The CUDA device index ``device`` names; the current device's when it names none or is not CUDA."""
    if device is not None and device.type == "cuda" and device.index is not None:
        return device.index
    return torch.cuda.current_device()
