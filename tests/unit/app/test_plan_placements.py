"""``asyncrl plan`` proposes only layouts the runtime places: its colocated candidates on 1 and 8 GPUs pass the
runtime's own placement check (the Ray role bundles of the same run), a layout the runtime refuses (colocated
with tensor-parallel engines) is simulated as the baseline but never recommended, and the reason is written."""

from __future__ import annotations

import json

import pytest

from asyncrl.app.planner import COLOCATED_SYNC, Planner, placement_of
from asyncrl.cli.main import main
from asyncrl.config.run import load_run_config
from asyncrl.runtime.placement import plan_placement
from asyncrl.runtime.placement_check import PlacementError, check_placement
from asyncrl.runtime.ray_placement import role_bundles
from asyncrl.runtime.ray_runtime import check_switch_layout
from tests.unit.sim.test_sim_planner import SMALL

WORKLOAD = SMALL  # the planner tests' small workload: a search in seconds


def runtime_places_colocated_sync(gpus: int) -> None:
    """The run ``asyncrl train`` would start for colocated sync on ``gpus`` GPUs, with the switch (engines
    sleeping while the trainer trains, as the simulator prices it), through the run config's checks and the
    Ray runtime's role bundles, placement and switch-layout checks (a ``PlacementError`` if it refused)."""
    config = load_run_config(
        None,
        [
            "controller.mode=sync",
            "buffer.async_ratio=0",
            "runtime.switch.enabled=true",
            "runtime.type=cluster",
            "runtime.address=auto",
            f"trainer.num_workers={gpus}",
            f"rollout.num_engines={gpus}",
            "runtime.accelerators_per_trainer_worker=1",
            "runtime.accelerators_per_engine=1",
        ],
    )
    placement = plan_placement(
        config.runtime,
        num_engines=gpus,
        mode="sync",
        num_trainer_workers=gpus,
        async_ratio=0.0,
    )
    nodes = [{"GPU": 8.0, "CPU": 64.0}] * max(1, gpus // 8)
    roles = role_bundles(config, config.runtime, placement)
    check_placement(roles, nodes)
    check_switch_layout(config, config.runtime, roles)


@pytest.mark.parametrize("gpus", [1, 8])
def test_colocated_candidates_are_ones_the_runtime_places(gpus, tmp_path, capsys):
    assert main(["plan", *WORKLOAD, f"output_dir={tmp_path}", "--gpus", str(gpus), "--alphas", "2"]) == 0
    record = json.loads((tmp_path / "plan.json").read_text())
    colocated = [label for label in record["placements"] if "colocated" in label]
    assert colocated == [f"sync colocated on {gpus}"]
    assert record["placements"][colocated[0]].startswith("colocated on accelerators")
    runtime_places_colocated_sync(gpus)
    recommended = record["recommended"]["candidate"]
    label = next(o for o in record["placements"] if o.startswith(recommended["mode"]))
    assert not record["placements"][label].startswith("refused"), record["placements"]
    if gpus == 1:
        assert record["runner_up"] is None and "runner-up: none" in capsys.readouterr().out


def test_a_colocated_layout_the_runtime_refuses_is_never_recommended():
    planner = Planner(None, [*WORKLOAD, "engine.gpus_per_engine=2"], gpus=8)
    with pytest.raises(PlacementError, match="accelerators_per_engine=2"):
        placement_of(COLOCATED_SYNC, 8, 2)
    assert not planner.placeable(COLOCATED_SYNC)
    result = planner.search(alphas=(2,), tolerance=0.02)
    assert result.baseline.candidate == COLOCATED_SYNC  # still the yardstick
    for chosen in (result.recommended, result.runner_up):
        assert chosen is not None and chosen.candidate.train_gpus is not None
        placement_of(chosen.candidate, 8, 2)  # the runtime's check passes
    assert result.to_json()["placements"]["sync colocated on 8"].startswith("refused by the runtime")
