"""Colocated sync with the switch on Ray, N pairs (``runtime.switch``, two here): trainer rank i (an FSDP2 shard,
gloo) and engine i share placement bundle i (a stand-in GPU of ``two_gpu_cluster``). Every step both engine
actors sleep and wake, every rank gathers the full weights and packs them for the engine in its own bundle (the
colocated transport's shared-memory twin), engine i applies rank i's blocks, and the run ends bit-equal to the
same seed's 2 x 2 Ray sync without the switch."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import pytest
import ray
from test_colocated_switch import SWITCH, step_metrics
from test_determinism import assert_same_run
from test_ray_colocated_switch import SAMPLES, STEPS, train_on_ray

from asyncrl.runtime.colocate import ColocatedTrainer
from asyncrl.runtime.ray_runtime import RayEngineClient
from asyncrl.runtime.trainer_group import TrainerGroupClient
from asyncrl.weight_sync.colocated import SHM_DIR, for_engine

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # two 3-step 2 x 2 Ray runs: minutes on the 2-core machine

PAIRS = ("trainer.num_workers=2", "rollout.num_engines=2")


def test_each_engine_sleeps_each_step_and_takes_its_own_ranks_blocks_bit_equal(
    two_gpu_cluster, tiny_path, tmp_path, monkeypatch
):
    plain = tmp_path / "plain"
    train_on_ray(plain, two_gpu_cluster, tiny_path, *PAIRS)
    applied, blocks, calls = [], [], Counter()
    update_weights, sleep, wake = RayEngineClient.update_weights, RayEngineClient.sleep, RayEngineClient.wake

    async def recorded(self, update, version):
        own = for_engine(update, self.index)
        applied.append((self.index, update.transport, version, own.handle.rank))
        blocks.extend(b.ref for bucket in own.handle.buckets for b in bucket.blocks)
        await update_weights(self, update, version)

    async def slept(self, level=1):
        calls["sleep", self.index] += 1
        return await sleep(self, level)

    async def woke(self):
        calls["wake", self.index] += 1
        return await wake(self)

    monkeypatch.setattr(RayEngineClient, "update_weights", recorded)
    monkeypatch.setattr(RayEngineClient, "sleep", slept)
    monkeypatch.setattr(RayEngineClient, "wake", woke)
    out = tmp_path / "switched"
    train_on_ray(out, two_gpu_cluster, tiny_path, *PAIRS, *SWITCH)

    placed = json.loads((out / "placement.json").read_text())
    assert placed["layout"].startswith("colocated on accelerators: 2 shared bundle(s)"), placed["layout"]
    # every version into each engine by the colocated transport, from the rank in its own bundle (the last
    # version may come after the run stopped)
    for engine in (0, 1):
        got = [(transport, v, rank) for index, transport, v, rank in applied if index == engine]
        assert got[: STEPS - 1] == [("colocated", v, engine) for v in range(1, STEPS)], applied
    # each rank packed its own blocks: the two engines never read the same memory
    assert len(set(blocks)) == len(blocks), blocks
    # every engine slept once per step and woke once after each step, and slept and woke around each checkpoint:
    # every step's (``trainer.checkpoint_every=1``) but the last's, which saves only the run's final one
    checkpoints = STEPS
    assert calls == {
        (call, engine): STEPS + checkpoints for call in ("sleep", "wake") for engine in (0, 1)
    }, calls
    steps = step_metrics(out)
    assert len(steps) == STEPS
    for step, line in enumerate(steps, start=1):
        # summed over the two engine actors, as each counts itself (each earlier step's checkpoint included)
        assert line["train/colocate/engine_num_sleeps"] == 2 * (2 * step - 1), line
        assert line["train/colocate/engine_num_wakes"] == 2 * 2 * (step - 1), line
        assert line["train/colocate/kv_pool_bytes_while_training"] == 0, line
        assert line["train/colocate/wake_bytes"] == line["train/colocate/sleep_bytes"] > 0, line
        assert line["train/colocate/offload_bytes"] > 0 and line["train/colocate/sync_bytes"] > 0, line
        # every rank let go of its packed copy once the engines applied it (summed over the ranks)
        assert line["train/colocate/released_bytes"] == 2 * line["train/colocate/sync_bytes"], line
    # each rank's offload allocated its host buffer once and reused it, checkpoints' round trips included
    assert [line["train/colocate/trainer_host_allocations"] for line in steps[1:]] == [2] * (STEPS - 1), steps
    # every rank unlinked its last blocks before it was killed
    assert blocks and not [name for name in blocks if (Path(SHM_DIR) / name).exists()], blocks

    assert_same_run(out, plain, STEPS, SAMPLES, "switched vs plain 2 x 2 sync on Ray")


def test_a_replaced_engine_is_packed_for_by_the_rank_in_its_bundle_alone(
    two_gpu_cluster, tiny_path, tmp_path, monkeypatch
):
    """Engine 1's actor is killed once both engines applied v1 and both ranks let go of their copies, and
    replaced by the proxy (its health probe) before the next step: its replacement catches up from a copy only rank 1 packs (rank 0 takes part in the gather, FSDP's all-gather
    being collective, and keeps nothing), so letting that copy go frees one rank's bytes, not two; the run
    ends bit-equal to the plain 2 x 2 run."""
    plain = tmp_path / "plain"
    train_on_ray(plain, two_gpu_cluster, tiny_path, *PAIRS)
    applied, pack_for, release = (
        ColocatedTrainer.weights_applied,
        TrainerGroupClient.pack_for,
        TrainerGroupClient.release_published,
    )
    packed: list[tuple[int, int, int]] = []
    released: list[int] = []

    caught_up = threading.Event()

    def applied_then_killed(self, update):
        applied(self, update)
        if update.version == 1 and not caught_up.is_set():
            ray.kill(self.engines[1].handle, no_restart=True)
            # the probe finds it dead and the proxy replaces it before the controller goes on (the schedule
            # under test: the rollout might not route a request to engine 1 before the next step)
            assert caught_up.wait(timeout=300), "engine 1 was not replaced while the trainer held v1"

    def packed_for(self, engine):
        update = pack_for(self, engine)
        packed.append((engine, update.handle.rank, update.shipped_bytes))
        caught_up.set()
        return update

    def released_bytes(self):
        nbytes = release(self)
        released.append(nbytes)
        return nbytes

    monkeypatch.setattr(ColocatedTrainer, "weights_applied", applied_then_killed)
    monkeypatch.setattr(TrainerGroupClient, "pack_for", packed_for)
    monkeypatch.setattr(TrainerGroupClient, "release_published", released_bytes)
    out = tmp_path / "replaced"
    train_on_ray(out, two_gpu_cluster, tiny_path, *PAIRS, *SWITCH, "proxy.health_check_interval_s=0.5")

    ((engine, rank, nbytes),) = packed  # one catch-up, packed by rank 1 for engine 1
    assert (engine, rank) == (1, 1) and nbytes > 0, packed
    steps = step_metrics(out)
    one_rank = steps[0]["train/colocate/sync_bytes"]  # what each rank packs per publication
    assert nbytes == one_rank and nbytes in released, (nbytes, released)  # its release: rank 1's bytes alone
    assert all(line["train/colocate/released_bytes"] == 2 * one_rank for line in steps), steps
    assert (steps[-1]["recovery/engine_restarts"], steps[-1]["recovery/failed_restarts"]) == (1, 0)
    assert_same_run(out, plain, STEPS, SAMPLES, "2 x 2 switched with engine 1 replaced vs plain sync on Ray")


def test_each_rank_offloads_its_reference_shards_and_a_kl_run_ends_bit_equal_to_one_that_keeps_them(
    two_gpu_cluster, tiny_path, tmp_path
):
    """With a KL term each rank actor holds its FSDP2 shards of the frozen reference: under the switch
    (``offload_reference``, on by default) they leave with the optimizer state at each publication, come back
    at the next step's reload, and stay in host memory through each checkpoint (whose reload moves the same
    bytes as in the run that keeps them); the run ends bit-equal to that run."""
    kl = ("loss.kl.beta=0.1",)
    kept = tmp_path / "kept"
    train_on_ray(
        kept, two_gpu_cluster, tiny_path, *PAIRS, *SWITCH, *kl, "runtime.switch.offload_reference=false"
    )
    out = tmp_path / "offloaded"
    train_on_ray(out, two_gpu_cluster, tiny_path, *PAIRS, *SWITCH, *kl)

    mine, theirs = step_metrics(out), step_metrics(kept)
    assert len(mine) == len(theirs) == STEPS

    def more(key: str, first: int = 0) -> list[float]:
        """How many more bytes the phase ``key`` moved in the offloading run, step by step from ``first``."""
        key = f"train/colocate/{key}"
        return [a[key] - b[key] for a, b in zip(mine[first:], theirs[first:], strict=True)]

    reference = more("offload_bytes")[0]  # both ranks' shards, summed
    assert reference > 0 and more("offload_bytes") == [reference] * STEPS, (mine, theirs)
    # from the second step: what the step before offloaded, and the checkpoint saved after it
    assert more("reload_bytes", 1) == [reference] * (STEPS - 1), (mine, theirs)
    assert more("checkpoint_reload_bytes", 1) == [0] * (STEPS - 1), (mine, theirs)
    assert_same_run(out, kept, STEPS, SAMPLES, "2 x 2 switched with kl, reference offloaded vs kept, on Ray")
