"""Colocated sync with the switch (``runtime.switch``): every step the engine sleeps (its KV pool measured
freed while the trainer trains) and wakes, the weights travel by the colocated transport, the phases are timed
in the metrics and the timeline, and the run ends bit-equal to the same seed's run without the switch."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from test_determinism import SYNC, assert_same_run, train_in_process

from asyncrl.config.run import load_run_config
from asyncrl.proxy.recovery import Superseded
from asyncrl.runtime.colocate import ColocatedTrainer
from asyncrl.runtime.inline import LocalTrainer
from asyncrl.runtime.republish import Republisher
from asyncrl.testing.gradients import trained_parameters
from asyncrl.weight_sync.colocated import SHM_DIR, ColocatedSync

STEPS = 3
SMALL = (*SYNC, "rollout.rollout_batch_size=2")
"""Three steps of two prompts x four samples (8 trained a step), the determinism tests' deterministic sync."""
SWITCH = ("runtime.switch.enabled=true", "runtime.switch.offload_master_weights=true")


def step_metrics(out) -> list[dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if "train/colocate/sleep_s" in line]


def versions_received(monkeypatch) -> list[int]:
    """The version of every update an engine receives through the colocated transport, in order."""
    received: list[int] = []
    receive = ColocatedSync.receive
    monkeypatch.setattr(
        ColocatedSync,
        "receive",
        lambda self, update: received.append(update.version) or receive(self, update),
    )
    return received


def held_at_each_step(monkeypatch) -> list[tuple[int, list[int], list[str]]]:
    """Per trained step, what every colocated publisher of the run still held as it began (bytes and blocks)
    and which of their shared-memory blocks were still in /dev/shm: filled as the run goes."""
    publishers, blocks, held = [], [], []
    publish, train_step = ColocatedSync.publish_buckets, ColocatedTrainer.train_step

    def published(self, version, buckets, **kwargs):
        update = publish(self, version, buckets, **kwargs)
        publishers.append(self)
        blocks.extend(b.ref for bucket in update.handle.buckets for b in bucket.blocks)
        return update

    def trained(self, groups, policy_version):
        kept = [sync.held_bytes for sync in publishers] + [len(sync._live) for sync in publishers]
        present = [name for name in blocks if (Path(SHM_DIR) / name).exists()]
        held.append((policy_version, kept, present))
        return train_step(self, groups, policy_version)

    monkeypatch.setattr(ColocatedSync, "publish_buckets", published)
    monkeypatch.setattr(ColocatedTrainer, "train_step", trained)
    return held


def gradient_bytes_as_engines_wake(monkeypatch) -> list[int]:
    """Per publication, the bytes of every gradient the trainer still holds once it offloaded and woke the
    engines, which then generate beside it: filled as the run goes."""
    held: list[int] = []
    state_for_sync = ColocatedTrainer.state_for_sync

    def published(self):
        update = state_for_sync(self)
        trainer = self.inner.trainer
        held.append(sum(p.grad.nbytes for _, p in trained_parameters(trainer) if p.grad is not None))
        return update

    monkeypatch.setattr(ColocatedTrainer, "state_for_sync", published)
    return held


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """The same seed's run without the switch, which every switched run ends bit-equal to."""
    out = tmp_path_factory.mktemp("colocated") / "plain"
    train_in_process(out, STEPS, *SMALL)
    return out


def test_the_switched_run_sleeps_each_step_and_ends_bit_equal_to_the_plain_one(tmp_path, monkeypatch, plain):
    received = versions_received(monkeypatch)
    held_while_training = held_at_each_step(monkeypatch)
    gradients_while_generating = gradient_bytes_as_engines_wake(monkeypatch)
    out = tmp_path / "switched"
    train_in_process(out, STEPS, *SMALL, *SWITCH)

    # every version through the colocated transport, each applied before the step ended
    assert received == list(range(1, STEPS + 1)), received
    # the trainer freed its gradients after each step: none beside the generating engine
    assert gradients_while_generating == [0] * STEPS, gradients_while_generating
    # the packed copy is let go once the engines applied it, not kept until the next publication
    assert [version for version, _, _ in held_while_training] == list(range(STEPS))
    assert all(not any(held) and not present for _, held, present in held_while_training), held_while_training
    steps = step_metrics(out)
    assert len(steps) == STEPS
    for line in steps:
        assert line["train/colocate/sleep_bytes"] > 0, line  # the KV pool let go each step ...
        assert line["train/colocate/kv_pool_bytes_while_training"] == 0, line  # ... and gone while training
        assert line["train/colocate/wake_bytes"] == line["train/colocate/sleep_bytes"], line
        assert line["train/colocate/offload_bytes"] > 0 and line["train/colocate/sync_bytes"] > 0, line
        assert line["train/colocate/released_bytes"] == line["train/colocate/sync_bytes"], line
        for phase in ("sleep", "reload", "sync", "offload", "wake"):
            assert line[f"train/colocate/{phase}_s"] >= 0
        # CPU: no static decode (``decode_graphs: auto``), so nothing captured, and the key is still logged
        assert line["train/colocate/decode_graph_captures"] == 0, line
    assert all(
        line["train/colocate/reload_bytes"] > 0 for line in steps[1:]
    )  # what the step before offloaded
    # into one host buffer, allocated at the first offload and reused (plain host memory on CPU)
    assert [line["train/colocate/trainer_host_allocations"] for line in steps[1:]] == [1] * (STEPS - 1), steps
    for line in steps[1:]:
        assert line["train/colocate/trainer_host_bytes"] >= line["train/colocate/offload_bytes"], line
        assert line["train/colocate/trainer_host_pinned_bytes"] == 0, line
    spans = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()]
    kinds = {span["kind"] for span in spans if span["worker"] == "colocate"}
    assert kinds <= {"sleep", "reload", "sync", "offload", "wake"} and "sync" in kinds

    assert_same_run(out, plain, STEPS, 8, "switched vs plain sync")


def test_an_engine_replaced_after_the_release_catches_up_from_a_copy_packed_again(
    tmp_path, monkeypatch, plain
):
    """The one engine dies once every engine applied v1 and the trainer let go of its copy: its replacement
    is sent v1 packed again (not refused), which is let go once applied, and the run ends as the plain one."""
    applied, lend = ColocatedTrainer.weights_applied, Republisher.lend
    lent = []

    def applied_then_killed(self, update):
        applied(self, update)
        if update.version == 1 and not lent:
            self.engines[0].shutdown()  # the next rollout finds it dead: the proxy replaces it

    def lent_of(self, update, engine):
        copy = lend(self, update, engine)
        lent.append((update.version, copy.version, copy is not update, self.inner._sync.held_bytes))
        return copy

    monkeypatch.setattr(ColocatedTrainer, "weights_applied", applied_then_killed)
    monkeypatch.setattr(Republisher, "lend", lent_of)
    received = versions_received(monkeypatch)
    held_while_training = held_at_each_step(monkeypatch)
    out = tmp_path / "switched"
    train_in_process(out, STEPS, *SMALL, *SWITCH)

    ((stored, version, fresh, held),) = lent  # one catch-up, to v1, from a copy packed again
    assert (stored, version, fresh) == (1, 1, True) and held > 0, lent
    assert received == [1, 1, 2, 3], received  # the replacement applied v1, then every engine v2 and v3
    # the copy packed again is let go once the replacement applied it, as every published one is
    assert all(not any(held) and not present for _, held, present in held_while_training), held_while_training
    last = step_metrics(out)[-1]
    assert (last["recovery/engine_restarts"], last["recovery/failed_restarts"]) == (1, 0), last
    assert_same_run(out, plain, STEPS, 8, "switched with a replaced engine vs plain sync")


def states_at_each_save(monkeypatch) -> list[tuple[list[int], bool, list[int]]]:
    """Per checkpoint the run saves, as the trainer's save begins: each engine's sleep level (0: awake), whether
    the trainer's state is offloaded, and each engine's sleeps and wakes so far: filled as the run goes."""
    switch_save, local_save = ColocatedTrainer.save_checkpoint, LocalTrainer.save_checkpoint
    current: list[ColocatedTrainer] = []
    seen: list[tuple[list[int], bool, list[int]]] = []

    def switched(self, root, **kwargs):
        current[:] = [self]
        return switch_save(self, root, **kwargs)

    def saved(self, root, **kwargs):
        engines = [engine.core for engine in current[0].engines]
        counts = [engine.num_sleeps - engine.num_wakes for engine in engines]
        seen.append(([engine.asleep for engine in engines], current[0].state.offloader.offloaded, counts))
        return local_save(self, root, **kwargs)

    monkeypatch.setattr(ColocatedTrainer, "save_checkpoint", switched)
    monkeypatch.setattr(LocalTrainer, "save_checkpoint", saved)
    return seen


def test_a_switched_run_that_saves_every_step_saves_with_its_engines_asleep_and_ends_bit_equal(
    tmp_path, monkeypatch, plain
):
    """Each checkpoint falls after the step's publication (engines awake, state offloaded): the engines sleep
    for it, so the state is reloaded with no KV pool beside it, then offloaded and the engines woken."""
    saves = states_at_each_save(monkeypatch)
    out = tmp_path / "switched"
    train_in_process(out, STEPS, *SMALL, *SWITCH, "trainer.checkpoint_every=1")

    assert len(saves) >= STEPS, saves
    level = 1  # runtime.switch.engine_sleep_level's default
    assert all(asleep == [level] and not offloaded and slept == [1] for asleep, offloaded, slept in saves), (
        saves
    )
    steps = step_metrics(out)
    for line in steps[1:]:  # the checkpoint after the step before, in the next step's metrics
        assert line["train/colocate/checkpoint_sleep_bytes"] > 0, line
        assert line["train/colocate/checkpoint_wake_bytes"] == line["train/colocate/checkpoint_sleep_bytes"]
        assert line["train/colocate/checkpoint_reload_bytes"] > 0, line
        assert line["train/colocate/checkpoint_engine_failures"] == 0, line
    assert "train/colocate/checkpoint_sleep_s" not in steps[0]
    assert_same_run(out, plain, STEPS, 8, "switched, saving every step, vs plain sync")


def test_a_resumed_switched_run_lets_go_of_the_resumed_weights_once_the_engine_holds_them(
    tmp_path, monkeypatch, plain
):
    """Stopped after one step (its final checkpoint saved with the engines asleep) and resumed: the resumed
    weights are let go once the engine holds them, and the run ends as the plain one."""
    out = tmp_path / "switched"
    saves = states_at_each_save(monkeypatch)
    train_in_process(out, 1, *SMALL, *SWITCH)
    assert saves and all(asleep == [1] and not offloaded for asleep, offloaded, _ in saves), saves
    held_while_training = held_at_each_step(monkeypatch)
    train_in_process(out, STEPS, *SMALL, *SWITCH, resume=True)
    assert [version for version, _, _ in held_while_training] == list(range(1, STEPS)), held_while_training
    assert all(not any(held) and not present for _, held, present in held_while_training), held_while_training
    assert_same_run(out, plain, STEPS, 8, "switched, stopped after step 1 and resumed, vs plain sync")


KL = ("loss.kl.beta=0.1", "trainer.checkpoint_every=1")
"""A KL term, so a frozen reference copy (offloaded by default under the switch), and a checkpoint every step."""


def resident_reference(trainer) -> int:
    """Bytes of the storages of ``trainer``'s reference model on its device now (0 while offloaded)."""
    storages = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in trainer.ref_model.parameters()
    }
    return sum(storages.values())


def reference_at_each_turn(monkeypatch) -> dict[str, list[int]]:
    """The reference model's resident bytes as each step trains (after the switch reloaded), once each
    publication offloaded and woke the engines, and as each checkpoint saves: filled as the run goes."""
    seen: dict[str, list[int]] = {"trains": [], "generates": [], "saves": []}
    local_step, local_save = LocalTrainer.train_step, LocalTrainer.save_checkpoint
    state_for_sync = ColocatedTrainer.state_for_sync

    def trained(self, groups, policy_version):
        seen["trains"].append(resident_reference(self.trainer))
        return local_step(self, groups, policy_version)

    def saved(self, root, **kwargs):
        seen["saves"].append(resident_reference(self.trainer))
        return local_save(self, root, **kwargs)

    def published(self):
        update = state_for_sync(self)
        seen["generates"].append(resident_reference(self.inner.trainer))
        return update

    monkeypatch.setattr(LocalTrainer, "train_step", trained)
    monkeypatch.setattr(LocalTrainer, "save_checkpoint", saved)
    monkeypatch.setattr(ColocatedTrainer, "state_for_sync", published)
    return seen


def test_a_kl_run_that_offloads_its_reference_ends_bit_equal_to_one_that_keeps_it_and_never_saves_it(
    tmp_path, monkeypatch
):
    """``runtime.switch.offload_reference`` (on by default): the reference is in host memory from each
    publication until the next step's reload, and stays there through each checkpoint (whose reload is the
    state's alone: the same bytes as the run that keeps its reference); the run ends bit-equal to one that
    keeps the reference on the device all along, whose KL term reads the same reference log-probs."""
    seen = reference_at_each_turn(monkeypatch)
    kept = tmp_path / "kept"
    train_in_process(kept, STEPS, *SMALL, *SWITCH, *KL, "runtime.switch.offload_reference=false")
    resident = seen["trains"][0]
    assert resident > 0 and {v for turn in seen.values() for v in turn} == {resident}, seen
    for turn in seen.values():
        turn.clear()
    out = tmp_path / "offloaded"
    train_in_process(out, STEPS, *SMALL, *SWITCH, *KL)

    assert seen["trains"] == [resident] * STEPS and seen["generates"] == [0] * STEPS, seen
    assert len(seen["saves"]) >= STEPS and set(seen["saves"]) == {0}, seen
    offloaded_steps, kept_steps = step_metrics(out), step_metrics(kept)
    assert len(offloaded_steps) == len(kept_steps) == STEPS
    for step, (mine, theirs) in enumerate(zip(offloaded_steps, kept_steps, strict=True)):
        moved = mine["train/colocate/offload_bytes"] - theirs["train/colocate/offload_bytes"]
        assert moved == resident, (step, mine, theirs)
        if step:  # what the step before offloaded comes back; a checkpoint's reload leaves the reference
            reloaded = mine["train/colocate/reload_bytes"] - theirs["train/colocate/reload_bytes"]
            assert reloaded == resident, (step, mine, theirs)
            key = "train/colocate/checkpoint_reload_bytes"
            assert mine[key] == theirs[key] > 0, (step, mine, theirs)
        assert mine["train/kl"] != 0 or step == 0, mine
    assert_same_run(out, kept, STEPS, 8, "switched with kl, reference offloaded vs kept")


@pytest.mark.parametrize(
    ("override", "named"),
    [
        (("controller.mode=one_step_off", "buffer.async_ratio=1"), "controller.mode"),
        (("runtime.colocate=never",), "runtime.colocate"),
        (("weight_sync.type=in_process",), "weight_sync.type"),
        (("runtime.type=local", "rollout.num_engines=2"), "rollout.num_engines"),
        (("runtime.type=local", "trainer.num_workers=2"), "trainer.num_workers=2 on Ray"),
        (("runtime.switch.engine_sleep_level=3",), "engine_sleep_level"),
    ],
)
def test_the_switch_is_refused_where_it_is_not_correct_naming_the_field(override, named):
    with pytest.raises(ValueError, match=named):
        load_run_config(None, ["output_dir=/tmp/x", "runtime.switch.enabled=true", *SYNC, *override])


def test_the_switch_on_ray_takes_one_engine_per_trainer_rank():
    """N pairs on Ray: rank i publishes to engine i in its bundle (``test_ray_colocated_pairs``)."""
    pairs = ("runtime.type=local", "trainer.num_workers=2", "rollout.num_engines=2")
    config = load_run_config(None, ["output_dir=/tmp/x", "runtime.switch.enabled=true", *SYNC, *pairs])
    assert (
        config.runtime.switch.enabled
        and config.weight_sync.transport_for("local", switch=True) == "colocated"
    )


def killed_while_training(monkeypatch, version: int, then: Callable[[ColocatedTrainer], None]) -> list[int]:
    """The engine is shut down once the trainer slept it and began training on ``version``'s batch (after the
    switch's ``sleep``, inside the trainer's own step); ``then(switch)`` runs before the step trains. Returns
    the versions whose steps killed it (one)."""
    switched, local_step = ColocatedTrainer.train_step, LocalTrainer.train_step
    killed: list[int] = []
    current: list[ColocatedTrainer] = []

    def switch_step(self, groups, policy_version):
        current[:] = [self]
        return switched(self, groups, policy_version)

    def trainer_step(self, groups, policy_version):
        if policy_version == version and not killed:
            killed.append(policy_version)
            current[0].engines[0].shutdown()
            then(current[0])
        return local_step(self, groups, policy_version)

    monkeypatch.setattr(ColocatedTrainer, "train_step", switch_step)
    monkeypatch.setattr(LocalTrainer, "train_step", trainer_step)
    return killed


def test_an_engine_killed_while_the_trainer_trains_is_replaced_at_the_update_and_the_run_ends_bit_equal(
    tmp_path, monkeypatch, plain
):
    """No health probe runs during the step: the switch's ``wake`` finds the engine dead and goes on, the
    update's ``update_weights`` fails on it, the proxy replaces it and the replacement applies that update
    (still held: not yet released) before the next rollout."""
    killed = killed_while_training(monkeypatch, 1, then=lambda switch: None)
    received = versions_received(monkeypatch)
    held_while_training = held_at_each_step(monkeypatch)
    out = tmp_path / "switched"
    train_in_process(out, STEPS, *SMALL, *SWITCH, "proxy.health_check_interval_s=null")

    assert killed == [1]
    assert received == [1, 2, 3], received  # the replacement's first update is v2, the one the step published
    assert all(not any(held) and not present for _, held, present in held_while_training), held_while_training
    steps = step_metrics(out)
    assert [line["train/colocate/engine_failures"] for line in steps] == [0, 1, 0], steps  # its wake
    assert (steps[-1]["recovery/engine_restarts"], steps[-1]["recovery/failed_restarts"]) == (1, 0)
    assert_same_run(out, plain, STEPS, 8, "switched, engine killed while training, vs plain sync")


@pytest.mark.parametrize("level", [1, 2])
def test_an_engine_replaced_while_the_trainer_trains_waits_for_the_steps_update_and_the_run_ends_bit_equal(
    tmp_path, monkeypatch, plain, level
):
    """The health probe finds the engine dead during the step and the proxy replaces it then: v1 was let go
    and the trainer is training, so the replacement is told to wait (``Superseded``) and applies v2 once it is
    published; the step trains only once that happened (the schedule under test, not a sleep). The
    replacement starts asleep at the switch's level (no KV pool beside the trainer's step; at level 2 its
    weights loaded into host memory) and the switch wakes it with its peers for the next rollout."""
    lend = Republisher.lend
    superseded = threading.Event()

    def lent_or_superseded(self, update, engine):
        try:
            return lend(self, update, engine)
        except Superseded:
            superseded.set()
            raise

    replacement: list[dict] = []

    def replaced(switch: ColocatedTrainer) -> None:
        assert superseded.wait(timeout=120), "the probe never replaced the engine during the step"
        replacement.append(switch.engines[0].stats())  # installed before its catch-up was told to wait
        engines.append(switch.engines[0])

    monkeypatch.setattr(Republisher, "lend", lent_or_superseded)
    engines: list = []
    killed = killed_while_training(monkeypatch, 1, then=replaced)
    received = versions_received(monkeypatch)
    out = tmp_path / "switched"
    level_is = f"runtime.switch.engine_sleep_level={level}"
    train_in_process(out, STEPS, *SMALL, *SWITCH, level_is, "proxy.health_check_interval_s=0.2")

    assert killed == [1] and superseded.is_set()
    (started,) = replacement
    assert started["kv_pool_bytes"] == 0 and started["asleep"] == level, started  # no KV pool mid-step
    (engine,) = engines
    # started asleep, then woken for each rollout after its start and around each checkpoint since (every
    # step's; the last step's is the final one): asleep for step 3 and for the checkpoints after step 2 and
    # at the run's end
    assert (engine.core.num_sleeps, engine.core.num_wakes) == (4, 4), "woken at each rollout after its start"
    assert received == [1, 2, 3], received  # never v1 again: the replacement's first update is v2
    last = step_metrics(out)[-1]
    assert (last["recovery/engine_restarts"], last["recovery/failed_restarts"]) == (1, 0), last
    assert_same_run(out, plain, STEPS, 8, "switched, engine replaced while training, vs plain sync")
