"""Every recipe in ``asyncrl/examples/recipes/`` resolves, its datasets load by their hub names (offline, from
stand-ins of the same shape the test writes in the hub-layout cache), and it runs 2 steps on CPU with the model
and data swapped for the shipped tiny ones by overrides: its modes, losses, filters and runtimes as written."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import threading
from pathlib import Path

import pytest

from asyncrl.app import train as training
from asyncrl.cli import main as cli
from asyncrl.config.run import load_run_config
from asyncrl.data import make_task
from asyncrl.examples.agents import frozen_lake_harness
from asyncrl.metrics.tracker import read_metrics
from asyncrl.rewards.builtin import math_equiv
from asyncrl.testing.hub_cache import use_offline_cache, write_hub_dataset

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "asyncrl" / "examples" / "recipes"
NAMES = sorted(path.name for path in RECIPES.glob("*.yaml"))

TINY = (
    "model.path=tiny-copy",
    "model.device=cpu",
    "model.dtype=float32",
    "engine.backend=builtin",
    "engine.max_model_len=null",
    "engine.max_running_requests=16",
    "task={type: copy, num_train: 64, num_eval: 16}",
    "reward.name=''",
    "rollout.num_engines=1",
    "rollout.rollout_batch_size=2",
    "rollout.num_return_sequences=2",
    "rollout.max_new_tokens=16",
    "trainer.num_mini_batches=1",
    "controller.num_steps=2",
    "controller.eval_prompts=4",
    "controller.eval_every=1",
    "controller.eval_sets=[{name: heldout, size: 4}]",
    "metrics.trackers=[jsonl]",
)
"""The shipped tiny model and task in place of the recipe's, sized to two quick steps."""
RAY_ON_CPU = (
    "trainer.num_workers=2",
    "trainer.mixed_precision=none",
    "runtime.type=local",
    "runtime.address=''",
    "runtime.train_num_cpus=1",
    "runtime.rollout_num_cpus=1",
)
"""The multi-GPU recipes on this machine: 2 FSDP2 ranks over gloo and one engine, each a Ray actor."""
PER_RECIPE = {
    "dapo_math_8gpu.yaml": (*RAY_ON_CPU, "rollout.max_additional_running_prompts=2"),
    "dapo_math_2node.yaml": (*RAY_ON_CPU, "rollout.max_additional_running_prompts=2"),
}


@pytest.mark.parametrize("name", NAMES)
def test_every_recipe_resolves(name: str, capsys) -> None:
    assert cli.main(["config", "show", str(RECIPES / name)]) == 0
    assert "model:" in capsys.readouterr().out


GSM8K_ROW = {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"}
DAPO_ROW = {
    "data_source": "math_dapo",
    "prompt": [{"role": "user", "content": "Solve 6*7. The last line should be of the form Answer: $Answer"}],
    "ability": "MATH",
    "reward_model": {"ground_truth": "42", "style": "rule"},
    "extra_info": {"index": "x"},
}
MATH500_ROW = {
    "problem": "Simplify $\\sqrt{8}$.",
    "solution": "$2\\sqrt{2}$",
    "answer": "2\\sqrt{2}",
    "level": 2,
}


def test_recipe_datasets_load_by_hub_name_and_verify(tmp_path: Path, monkeypatch) -> None:
    """The recipes' own task sections on stand-ins shaped like the real datasets (same names, configs,
    splits and columns): fields map, references come out, a right answer earns 1."""
    cache = use_offline_cache(monkeypatch, tmp_path)
    write_hub_dataset(cache, "openai/gsm8k", {"main": {"train": [GSM8K_ROW] * 4, "test": [GSM8K_ROW]}})
    dapo = [DAPO_ROW] + [  # distinct prompts, so a 1 % hold-out by prompt hash keeps some
        {**DAPO_ROW, "prompt": [{"role": "user", "content": f"Problem {i}. Answer: $Answer"}]}
        for i in range(400)
    ]
    write_hub_dataset(cache, "BytedTsinghua-SIA/DAPO-Math-17k", {"default": {"train": dapo}})
    write_hub_dataset(cache, "HuggingFaceH4/MATH-500", {"default": {"test": [MATH500_ROW] * 2}})
    answers = {"gsm8k": "so 7.\n#### 7", "dapo": "6*7=42\nAnswer: 42", "math500": "\\boxed{2\\sqrt 2}"}
    for name in NAMES:
        config = load_run_config(RECIPES / name)
        tasks = {"" if config.task.type == "copy" else name: config.task}
        tasks |= {s.name: s.task for s in config.controller.eval_sets if s.task is not None}
        for label, task_config in tasks.items():
            if task_config.type != "hf_dataset":
                continue
            sample = make_task(task_config).split("train")[0]
            kind = next(k for k in answers if k in label)
            reward = (
                math_equiv if config.reward.name == "math_equiv" or sample.reward == "math_equiv" else None
            )
            assert reward is not None, f"{name} {label}: verified by {sample.reward}"
            assert reward(answers[kind], sample)[0] == 1.0, (name, label, sample)


def train(out: Path, name: str, *extra: str) -> list[dict]:
    overrides = [*TINY, *PER_RECIPE.get(name, ()), *extra, f"output_dir={out}"]
    asyncio.run(training.train(load_run_config(RECIPES / name, overrides), console=None))
    return read_metrics(out / "metrics.jsonl")


@pytest.mark.parametrize(
    "name",
    [
        # the multi-GPU recipes start Ray, two FSDP2 ranks and an engine actor: 12 s each, so `slow`
        pytest.param(n, marks=pytest.mark.slow) if n in PER_RECIPE else n
        for n in NAMES
        if not n.startswith("agentic_endpoint")
    ],
)
def test_recipe_runs_two_cpu_steps_with_tiny_stand_ins(name: str, tmp_path: Path) -> None:
    lines = train(tmp_path / "run", name)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    recipe = load_run_config(RECIPES / name)
    assert [line["step"] for line in lines] == [1, 2]
    assert (
        config["controller"]["mode"] == recipe.controller.mode and config["loss"]["name"] == recipe.loss.name
    )
    assert any("eval/heldout/mean@1" in line for line in lines)


def test_the_agentic_endpoint_recipe_trains_two_steps_on_a_harness(tmp_path: Path) -> None:
    """The recipe serves the endpoint; the FrozenLake harness (only the openai client) plays through it."""
    out = tmp_path / "run"
    # plays until the run stops serving (the harness ends on the connection error)
    harness = threading.Thread(
        target=lambda: asyncio.run(frozen_lake_harness.main(out, 2, 2, 4, 4)), daemon=True
    )
    harness.start()
    lines = train(out, "agentic_endpoint.yaml", "serve.chat_format=plain", "controller.eval_every=0")
    harness.join(60)
    assert not harness.is_alive()
    assert [line["step"] for line in lines] == [1, 2]
    assert json.loads((out / "config.json").read_text())["producer"] == "external"


def _recipe_plans():
    spec = importlib.util.spec_from_file_location("recipe_plans", ROOT / "scripts" / "recipe_plans.py")
    plans = importlib.util.module_from_spec(spec)
    sys.modules["recipe_plans"] = plans  # its dataclasses look their module up there
    spec.loader.exec_module(plans)
    return plans


def test_every_recipe_has_its_step_time_generated_into_the_docs() -> None:
    """docs/recipes.md's table is what ``scripts/recipe_plans.py`` renders from docs/recipe_plans.json."""
    plans = _recipe_plans()
    assert set(plans.PLANS) == set(NAMES)
    results = json.loads(plans.RESULT.read_text())
    assert set(results["recipes"]) == set(NAMES)
    doc = plans.DOC.read_text()
    assert plans.render(doc, results) == doc


def test_each_published_step_time_simulates_the_engine_its_recipe_admits() -> None:
    """The simulated engine takes the recipe's own admission limits, over the ones the simulator would derive,
    and the published JSON was simulated with the recipe's current ones: ``gsm8k_1gpu`` was once published
    with 128 simulated slots where its ``max_kv_tokens`` admitted 44."""
    from asyncrl.sim.derive import load_sim_config

    plans = _recipe_plans()
    published = json.loads(plans.RESULT.read_text())["recipes"]
    for name, plan in plans.PLANS.items():
        if isinstance(plan, str):
            continue
        keys = plans.engine_keys(name)
        assert published[name]["engine"] == list(keys), (
            f"{name}'s engine changed: run scripts/recipe_plans.py"
        )
        sim = load_sim_config(None, [*plan.workload, *keys])
        engine = load_run_config(RECIPES / name).engine
        assert sim.engine.max_model_len == engine.max_model_len, name
        if engine.backend == "builtin":
            assert sim.engine.kv_allocation == "reserved", name
            assert sim.engine.max_running_requests == engine.max_running_requests, name
            assert sim.engine.max_kv_tokens == engine.max_kv_tokens, name
        else:
            assert sim.engine.kv_allocation == "paged", name
            assert sim.cost.max_num_seqs == engine.vllm.max_num_seqs, name
            assert sim.cost.memory_utilization == engine.vllm.gpu_memory_utilization, name
