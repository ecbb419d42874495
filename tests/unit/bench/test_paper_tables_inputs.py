"""bench/paper_tables.py predicts the ROLL Flash figures from hardware, model shape, workload and documented
defaults only (issue 48): no figure's config or arm sets a cost the model derives, every figure shares one model,
one profile and one ``cost`` section, the cost model's code names no figure, every workload states its length
assumption, and a colocated arm pays the colocated switch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from asyncrl.config.loader import read_yaml_file
from asyncrl.sim.derive import colocated_switch_parts, derived_keys, load_sim_config
from asyncrl.sim.hardware import resolve_profile
from asyncrl.sim.model_shape import resolve_shape
from bench.paper_tables import EXAMPLES, ROLL_FLASH_ASYNC, figures

ROOT = Path(__file__).resolve().parents[3]
COST_MODEL = [
    *sorted((ROOT / "asyncrl/sim").glob("*.py")),
    *sorted((ROOT / "asyncrl/sim/profiles").glob("*.json")),
    ROOT / "asyncrl/config/sim.py",
]
FIGURE_NAME = re.compile(r"\bfig(ure)?s?\.?\s*\d|\bfig\d|paper_tables|\bfrom bench\b|\bimport bench\b", re.I)
PLACEMENT = {"engine": {"gpus_per_engine", "recompute_kv_on_update"}, "trainer": {"num_gpus", "colocated"}}
"""The only engine and trainer keys a figure may set: where things run, and whether running requests are
prefilled again after an update (what the simulated system does, ROLL Flash's Async), not what anything costs."""


def figure_configs() -> dict[str, dict]:
    return {
        figure.config: read_yaml_file(str(ROOT / EXAMPLES / f"{figure.config}.yaml"))
        for figure in figures().values()
    }


def derived_names() -> dict[str, set[str]]:
    config = load_sim_config(str(ROOT / EXAMPLES / "roll_flash_think.yaml"))
    keys = derived_keys(config, resolve_shape(config.model), resolve_profile(config.hardware))
    return {section: set(values) for section, values in keys.items()}


def test_no_figure_sets_a_cost_the_model_derives():
    derived = derived_names()
    for name, data in figure_configs().items():
        for section in ("engine", "trainer"):
            set_here = set(data.get(section, {}))
            assert set_here <= PLACEMENT[section], (
                f"{name}.yaml sets {section} costs {set_here - PLACEMENT[section]}"
            )
            assert not set_here & derived[section]
    for name, figure in figures().items():
        for label, overrides in figure.arms.items():
            for override in overrides:
                key = override.partition("=")[0]
                section, _, field = key.partition(".")
                assert section != "cost", f"{name}/{label} overrides {key}"
                if section in PLACEMENT:
                    assert field in PLACEMENT[section], f"{name}/{label} overrides the cost {key}"


def test_every_figure_shares_one_model_profile_and_cost_section():
    configs = figure_configs()
    assert {(d["model"], d["hardware"]) for d in configs.values()} == {("qwen3-8b", "h800")}
    assert len({repr(sorted(d.get("cost", {}).items())) for d in configs.values()}) == 1


def test_the_cost_model_names_no_figure():
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in COST_MODEL
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if FIGURE_NAME.search(line)
    ]
    assert not hits, "the cost model must not read or name a figure:\n" + "\n".join(hits)


def test_every_figure_workload_states_its_length_assumption():
    for name, data in figure_configs().items():
        lengths = data["lengths"]
        assert lengths["distribution"].lower() in lengths["assumption"].lower(), name


@pytest.mark.parametrize("name", ["fig1b_think", "fig3a", "fig7", "fig8"])
def test_colocated_arms_pay_the_colocated_switch(name):
    figure = figures()[name]
    colocated = 0
    for overrides in figure.arms.values():
        config = load_sim_config(str(ROOT / EXAMPLES / f"{figure.config}.yaml"), list(overrides))
        if not config.trainer.colocated:
            continue
        colocated += 1
        shape, profile = resolve_shape(config.model), resolve_profile(config.hardware)
        parts = colocated_switch_parts(config, shape, profile)
        switch = sum(seconds for part, seconds in parts.items() if part != "sync")
        adam = (
            32
            * shape.num_params
            / (profile.hbm_bandwidth * profile.efficiency.decode_kv * config.num_train_gpus)
        )
        assert switch > 0 and config.trainer.step_overhead_s == pytest.approx(adam + switch)
        assert config.engine.weight_update_s == pytest.approx(parts["sync"] + config.cost.weight_reload_s)
    assert colocated


@pytest.mark.parametrize("name", ["fig1b_base", "fig8"])
def test_grouped_arms_keep_a_prompts_responses_on_one_engine(name):
    """With a small ``proxy.affinity_slack`` the proxy spreads a group over engines (replication in effect):
    a grouped arm's slack exceeds every request of its step, so affinity always wins."""
    figure = figures()[name]
    grouped = 0
    for overrides in figure.arms.values():
        config = load_sim_config(str(ROOT / EXAMPLES / f"{figure.config}.yaml"), list(overrides))
        if not config.rollout.prompt_replication:
            grouped += 1
            requests = config.rollout.rollout_batch_size * config.rollout.num_return_sequences
            assert config.proxy.affinity_slack > requests
    assert grouped


@pytest.mark.parametrize("name", ["fig1b_think", "fig1b_base", "fig3a", "async_ratio"])
def test_every_async_arm_runs_roll_flash_async_and_no_sync_arm_does(name):
    """Every arm that trains asynchronously wastes no admitted sample and recomputes at updates (the report's
    Async); a synchronous arm has neither in-flight work at an update nor older groups to wait for."""
    figure = figures()[name]
    modes = set()
    for label, overrides in figure.arms.items():
        config = load_sim_config(str(ROOT / EXAMPLES / f"{figure.config}.yaml"), list(overrides))
        modes.add(config.controller.mode)
        is_async = config.controller.mode != "sync"
        assert (set(ROLL_FLASH_ASYNC) <= set(overrides)) is is_async, f"{name}/{label}"
        assert config.controller.waits_for_older is is_async
        assert config.engine.recompute_kv_on_update is is_async
    assert modes == {"sync", "partial_rollout"}
