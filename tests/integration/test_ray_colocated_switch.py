"""Colocated sync with the switch on Ray (``runtime.switch``): a trainer rank and an engine share one placement
bundle (the stand-in GPU of ``one_gpu_cluster``); every step the engine actor sleeps (its KV pool, as the actor
reports it, freed while the rank trains) and wakes, the rank actor offloads and reloads its optimizer state,
the weights travel by the colocated transport (shared memory, the CPU twin of CUDA IPC), and the run ends
bit-equal to the same seed's Ray run without the switch."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
import ray
from test_colocated_switch import SWITCH, step_metrics
from test_determinism import IN_PROCESS, SYNC, assert_same_run
from test_kill_resume import RUN

from asyncrl.app import train as training
from asyncrl.config.run import load_run_config
from asyncrl.proxy.recovery import Superseded
from asyncrl.runtime.colocate import PHASES, ColocatedTrainer
from asyncrl.runtime.ray_runtime import RayEngineClient
from asyncrl.runtime.republish import Republisher
from asyncrl.runtime.trainer_group import TrainerGroupClient
from asyncrl.weight_sync.colocated import SHM_DIR
from asyncrl.weight_sync.ipc_ledger import IpcLedger

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # three 3-step Ray runs: ~5 min on the loaded 2-core machine

STEPS = 3
SAMPLES = 8
SMALL = (*SYNC, "rollout.rollout_batch_size=2")


def shared_bundle(cluster, tiny_path) -> tuple[str, ...]:
    """A trainer rank and an engine in one bundle holding the cluster's one stand-in GPU."""
    return (
        f"model.path={tiny_path}",
        "runtime.type=cluster",
        f"runtime.address={cluster.address}",
        "runtime.accelerator_resource=fake_gpu",
        "runtime.accelerators_per_trainer_worker=1",
        "runtime.accelerators_per_engine=1",
        "runtime.placement_timeout_s=20",
        "engine.max_model_len=128",
    )


def train_on_ray(out, cluster, tiny_path, *overrides: str) -> None:
    config = load_run_config(
        None,
        [
            *RUN,
            *IN_PROCESS,
            *shared_bundle(cluster, tiny_path),
            *SMALL,
            *overrides,
            f"controller.num_steps={STEPS}",
            f"output_dir={out}",
        ],
    )
    asyncio.run(training.train(config, console=None))


def ledger_keys(monkeypatch) -> dict[str, list[str]]:
    """Every colocated publication the driver's IPC ledger was told of, the ones it settled as the run went and
    the ones it settled only at shutdown (``weight_sync.ipc_ledger``): filled as the run goes."""
    keys: dict[str, list[str]] = {"published": [], "settled": [], "at_shutdown": []}
    published, take, drain = IpcLedger.published, IpcLedger.take_settled, IpcLedger.drain

    def on_published(self, key, rank):
        keys["published"].append(key)
        published(self, key, rank)

    def recorded(into: str, settle):
        def settled(self):
            out = settle(self)
            keys[into].extend(key for rank_keys in out.values() for key in rank_keys)
            return out

        return settled

    monkeypatch.setattr(IpcLedger, "published", on_published)
    monkeypatch.setattr(IpcLedger, "take_settled", recorded("settled", take))
    monkeypatch.setattr(IpcLedger, "drain", recorded("at_shutdown", drain))
    return keys


def assert_every_publication_settled(keys: dict[str, list[str]]) -> None:
    """Each publication settled once; at shutdown at most the last one was left (held for the engine)."""
    settled = keys["settled"] + keys["at_shutdown"]
    assert keys["published"] and sorted(settled) == sorted(keys["published"]), keys
    assert set(keys["at_shutdown"]) <= {keys["published"][-1]}, keys


@pytest.fixture(scope="module")
def plain(one_gpu_cluster, tiny_path, tmp_path_factory) -> Path:
    """The same seed's Ray run without the switch, which every switched run ends bit-equal to."""
    out = tmp_path_factory.mktemp("ray_colocated") / "plain"
    train_on_ray(out, one_gpu_cluster, tiny_path)
    return out


def test_on_ray_the_engine_actor_sleeps_each_step_and_the_run_ends_bit_equal(
    one_gpu_cluster, tiny_path, tmp_path, monkeypatch, plain
):
    sent, blocks = [], []
    update_weights = RayEngineClient.update_weights

    async def recorded(self, update, version):
        sent.append((update.transport, version))
        blocks.extend(b.ref for bucket in update.handle.buckets for b in bucket.blocks)
        await update_weights(self, update, version)

    monkeypatch.setattr(RayEngineClient, "update_weights", recorded)
    keys = ledger_keys(monkeypatch)
    out = tmp_path / "switched"
    train_on_ray(out, one_gpu_cluster, tiny_path, *SWITCH)
    assert_every_publication_settled(keys)

    placed = json.loads((out / "placement.json").read_text())
    assert placed["layout"].startswith("colocated on accelerators: 1 shared bundle(s)"), placed["layout"]
    # every version into the engine actor by the colocated transport (the last may come after the run stopped)
    assert sent[: STEPS - 1] == [("colocated", v) for v in range(1, STEPS)], sent
    steps = step_metrics(out)
    assert len(steps) == STEPS
    for step, line in enumerate(steps, start=1):
        # counted by the engine actor itself: slept once this step, and slept and woken once after each earlier
        # one and around each earlier one's checkpoint (``trainer.checkpoint_every=1``)
        assert line["train/colocate/engine_num_sleeps"] == 2 * step - 1, line
        assert line["train/colocate/engine_num_wakes"] == 2 * (step - 1), line
        assert line["train/colocate/sleep_bytes"] > 0, line  # the actor's KV pool let go ...
        assert line["train/colocate/kv_pool_bytes_while_training"] == 0, line  # ... and gone while training
        assert line["train/colocate/wake_bytes"] == line["train/colocate/sleep_bytes"], line
        assert line["train/colocate/offload_bytes"] > 0 and line["train/colocate/sync_bytes"] > 0, line
        # the rank let go of its packed copy once the engine applied it
        assert line["train/colocate/released_bytes"] == line["train/colocate/sync_bytes"], line
    assert all(
        line["train/colocate/reload_bytes"] == steps[0]["train/colocate/offload_bytes"] for line in steps[1:]
    )

    spans = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()]
    assert {span["kind"] for span in spans if span["worker"] == "colocate"} == set(
        PHASES
    )  # the timeline lane
    # the shared-memory blocks are gone, the last one's too (rank 0 releases them before it is killed)
    assert blocks and not [name for name in blocks if (Path(SHM_DIR) / name).exists()], blocks

    assert_same_run(out, plain, STEPS, SAMPLES, "switched vs plain sync on Ray")


def test_on_ray_an_engine_replaced_after_the_release_catches_up_from_a_copy_packed_again(
    one_gpu_cluster, tiny_path, tmp_path, monkeypatch, plain
):
    """The engine actor is killed once it applied v1 and the rank let go of its copy: the replacement (in the
    same bundle) is sent v1 packed again by the rank, and the run ends as the plain one."""
    applied, lend = ColocatedTrainer.weights_applied, Republisher.lend
    lent = []

    def applied_then_killed(self, update):
        applied(self, update)
        if update.version == 1 and not lent:
            ray.kill(self.engines[0].handle, no_restart=True)  # the next rollout finds it dead

    def lent_of(self, update, engine):
        copy = lend(self, update, engine)
        lent.append((update.version, copy.version, copy is not update))
        return copy

    monkeypatch.setattr(ColocatedTrainer, "weights_applied", applied_then_killed)
    monkeypatch.setattr(Republisher, "lend", lent_of)
    keys = ledger_keys(monkeypatch)
    out = tmp_path / "replaced"
    train_on_ray(out, one_gpu_cluster, tiny_path, *SWITCH)
    assert_every_publication_settled(keys)  # the copy packed again for the replacement too

    assert lent == [(1, 1, True)], lent  # one catch-up, to v1, from a copy the rank packed again
    last = step_metrics(out)[-1]
    assert (last["recovery/engine_restarts"], last["recovery/failed_restarts"]) == (1, 0), last
    assert_same_run(out, plain, STEPS, SAMPLES, "switched with a replaced engine actor vs plain sync on Ray")


def test_on_ray_an_engine_killed_while_the_rank_trains_is_replaced_at_the_update_and_the_run_ends_bit_equal(
    one_gpu_cluster, tiny_path, tmp_path, monkeypatch, plain
):
    """The engine actor is killed once it slept and the rank began training on v1's batch: the switch's
    ``wake`` finds it dead and goes on, the update's ``update_weights`` fails on it, and the replacement (in
    the same bundle) applies that update, still held, before the next rollout."""
    switched, group_step = ColocatedTrainer.train_step, TrainerGroupClient.train_step
    current: list[ColocatedTrainer] = []
    killed: list[int] = []

    def switch_step(self, groups, policy_version):
        current[:] = [self]
        return switched(self, groups, policy_version)

    def rank_step(self, groups, policy_version):
        if policy_version == 1 and not killed:
            killed.append(policy_version)
            ray.kill(current[0].engines[0].handle, no_restart=True)
        return group_step(self, groups, policy_version)

    monkeypatch.setattr(ColocatedTrainer, "train_step", switch_step)
    monkeypatch.setattr(TrainerGroupClient, "train_step", rank_step)
    keys = ledger_keys(monkeypatch)
    out = tmp_path / "killed"
    train_on_ray(out, one_gpu_cluster, tiny_path, *SWITCH, "proxy.health_check_interval_s=null")
    assert_every_publication_settled(keys)  # the update sent to the dead actor too, once it was replaced

    steps = step_metrics(out)
    assert killed == [1] and [line["train/colocate/engine_failures"] for line in steps] == [0, 1, 0], steps
    assert (steps[-1]["recovery/engine_restarts"], steps[-1]["recovery/failed_restarts"]) == (1, 0)
    assert_same_run(
        out, plain, STEPS, SAMPLES, "switched, engine actor killed while training, vs plain on Ray"
    )


def test_on_ray_an_engine_replaced_while_the_rank_trains_waits_for_the_steps_update_bit_equal(
    one_gpu_cluster, tiny_path, tmp_path, monkeypatch, plain
):
    """The health probe finds the killed engine actor during the rank's step and the proxy replaces it then:
    v1 was let go and the rank is training, so the replacement is told to wait (``Superseded``) and applies
    v2 once it is published; the step trains only once that happened (the schedule under test, not a sleep).
    Started while the rank trains, the replacement actor starts asleep (no KV pool beside the rank's step in
    their bundle) and the switch wakes it with its peers for the next rollout."""
    switched, group_step, lend = ColocatedTrainer.train_step, TrainerGroupClient.train_step, Republisher.lend
    current: list[ColocatedTrainer] = []
    superseded = threading.Event()
    replacement: list[dict] = []

    def switch_step(self, groups, policy_version):
        current[:] = [self]
        return switched(self, groups, policy_version)

    def rank_step(self, groups, policy_version):
        if policy_version == 1 and not superseded.is_set():
            ray.kill(current[0].engines[0].handle, no_restart=True)
            assert superseded.wait(timeout=300), "the probe never replaced the engine during the step"
            # installed before its catch-up was told to wait
            replacement.append(current[0].engines[0].stats())
        return group_step(self, groups, policy_version)

    def lent_or_superseded(self, update, engine):
        try:
            return lend(self, update, engine)
        except Superseded:
            superseded.set()
            raise

    monkeypatch.setattr(ColocatedTrainer, "train_step", switch_step)
    monkeypatch.setattr(TrainerGroupClient, "train_step", rank_step)
    monkeypatch.setattr(Republisher, "lend", lent_or_superseded)
    out = tmp_path / "replaced_while_training"
    train_on_ray(out, one_gpu_cluster, tiny_path, *SWITCH, "proxy.health_check_interval_s=0.5")

    last = step_metrics(out)[-1]
    assert superseded.is_set()
    (started,) = replacement
    assert started["kv_pool_bytes"] == 0 and started["asleep"] == 1, started  # no KV pool mid-step
    # read as it slept for the last step: it started asleep, was woken for a rollout, slept and woken around
    # that step's checkpoint, slept again
    assert (last["train/colocate/engine_num_sleeps"], last["train/colocate/engine_num_wakes"]) == (3, 2), last
    assert last["train/colocate/kv_pool_bytes_while_training"] == 0, last
    assert (last["recovery/engine_restarts"], last["recovery/failed_restarts"]) == (1, 0), last
    assert_same_run(
        out, plain, STEPS, SAMPLES, "switched, engine actor replaced while training, vs plain on Ray"
    )
