"""A sharded checkpoint's files are fsynced and hashed by every rank, each a share dealt out by size, rather than
by rank 0 alone (the review of issue 45: ~88 s of hashing on rank 0 at Qwen3-8B while the others wait). The
marker is the one-process format whoever hashed which file, and a load verifies the hashes dealt out the same
way: a damaged file in any rank's share fails every rank with the same ``TornCheckpointError`` naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_fixtures import tiny_qwen2

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer import checkpoint
from asyncrl.trainer.checkpoint import MARKER_FILE, TornCheckpointError
from asyncrl.trainer.distributed.checkpoint import (
    deal_by_size,
    load_sharded_checkpoint,
    save_sharded_checkpoint,
)
from asyncrl.trainer.distributed.parallel import FullyShardedParallel
from asyncrl.trainer.trainer import Trainer


def _trainer() -> Trainer:
    return Trainer(
        tiny_qwen2(),
        TrainerConfig(lr=1e-3),
        LossConfig(name="ppo"),
        AdvantageConfig(name="grpo"),
        parallel=FullyShardedParallel("cpu"),
    )


def _save_recording_hashes(root: str) -> dict:
    """Rank body: save, returning the files this rank hashed (the state files rank 0 writes last included)."""
    hashed: list[str] = []
    original = checkpoint.hash_files

    def recording(directory: Path, names: list[str]) -> dict[str, str]:
        names = list(names)
        hashed.extend(names)
        return original(directory, names)

    checkpoint.hash_files = recording
    path = save_sharded_checkpoint(root, _trainer())
    return {"path": str(path), "hashed": hashed}


def _load_expecting_torn(path: str) -> str:
    with pytest.raises(TornCheckpointError) as caught:
        load_sharded_checkpoint(path, _trainer())
    return str(caught.value)


def test_deal_by_size_gives_every_file_once_in_shares_of_about_equal_bytes(tmp_path: Path) -> None:
    sizes = {"a": 10, "b": 9, "c": 5, "d": 4, "e": 1}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(b"x" * size)
    shares = deal_by_size(tmp_path, sorted(sizes), 2)
    assert sorted(n for share in shares for n in share) == sorted(sizes)
    assert sorted(sum(sizes[n] for n in share) for share in shares) == [14, 15]
    assert deal_by_size(tmp_path, sorted(sizes), 1) == [["a", "b", "c", "d", "e"]]


def test_every_rank_hashes_a_share_and_the_marker_is_the_one_process_format(tmp_path: Path) -> None:
    ranks = run_ranks(_save_recording_hashes, 2, str(tmp_path))
    path = Path(ranks[0]["path"])
    marker = json.loads((path / MARKER_FILE).read_text())
    assert marker == checkpoint.hash_files(path, checkpoint.checkpoint_files(path))  # as a one-process save
    shares = [set(rank["hashed"]) for rank in ranks]
    assert all(shares) and not shares[0] & shares[1]
    assert shares[0] | shares[1] == set(marker)
    checkpoint.verify_checkpoint(path)


def test_a_damaged_file_in_any_share_fails_every_rank_by_name(tmp_path: Path) -> None:
    path = Path(run_ranks(_save_recording_hashes, 2, str(tmp_path))[0]["path"])
    expected = json.loads((path / MARKER_FILE).read_text())
    damaged = deal_by_size(path, sorted(expected), 2)[1][0]  # rank 1 checks it
    with (path / damaged).open("r+b") as file:
        first = file.read(1)
        file.seek(0)
        file.write(bytes([first[0] ^ 0xFF]))
    errors = run_ranks(_load_expecting_torn, 2, str(path))
    assert errors[0] == errors[1]
    assert f"{damaged} does not match its hash" in errors[0]
