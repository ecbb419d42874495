"""The expected step time of every recipe, from ``asyncrl plan``'s simulator, written into docs/recipes.md.

For each recipe: its own schedule (mode, α, train/infer split) simulated on the cost model ``asyncrl plan``
derives from the model's shape and the hardware profile, and, where the cluster can be split (2 GPUs or more),
``asyncrl plan``'s full search and its recommendation. The workload each recipe is planned with (response
lengths especially, which only a run measures) is stated in ``PLANS`` and printed in the docs beside the
numbers; ``asyncrl plan --from-run RUN_DIR`` re-plans from a real run's lengths. The engine's admission limits
are not stated there but read from the recipe itself (``engine_keys``), so the simulated engine runs as many
requests at once as the recipe's engine would admit, and follows the recipe when it changes.

    python scripts/recipe_plans.py           # simulate (minutes), write docs/recipe_plans.json, rewrite the table
    python scripts/recipe_plans.py --docs    # only rewrite the table from docs/recipe_plans.json
    python scripts/recipe_plans.py --check   # exit 1 if the table is out of sync with the JSON
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python scripts/recipe_plans.py` puts scripts/ first on sys.path: make the checkout the import root
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import re
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "asyncrl" / "examples" / "recipes"
RESULT = ROOT / "docs" / "recipe_plans.json"
DOC = ROOT / "docs" / "recipes.md"
BLOCK = re.compile(r"(<!-- recipe-plans -->\n).*?(<!-- /recipe-plans -->)", re.DOTALL)


@dataclass(frozen=True)
class RecipePlan:
    """How one recipe is planned: its cluster, its own schedule and the workload assumed."""

    gpus: int
    mode: str
    alpha: float
    train_gpus: int | None
    """None: colocated (trainer and engines share every GPU, taking turns)."""
    workload: tuple[str, ...]
    """``asyncrl plan`` keys: model shape, hardware profile, batch, lengths (assumed), cost assumptions; the
    engine's admission limits come from the recipe (``engine_keys``)."""
    assumed: str
    """What the workload assumes that the recipe does not fix, in words for the docs."""


GSM8K_1GPU = (
    "model=qwen3-1.7b",
    "hardware=h100",
    "prompt_tokens=200",
    "lengths.mean=600",
    "rollout.max_new_tokens=1280",
    "rollout.rollout_batch_size=32",
    "rollout.num_return_sequences=8",
)
DAPO = (
    "model=qwen3-8b",
    "hardware=h100",
    "prompt_tokens=256",
    "lengths.mean=2000",
    "rollout.max_new_tokens=8192",
    "rollout.num_return_sequences=16",
    "cost.logprob_passes=1",
)
GSM8K_ASSUMED = "mean response 600 tokens (lognormal, σ 1)"

PLANS: dict[str, RecipePlan | str] = {
    "gsm8k_1gpu.yaml": RecipePlan(
        gpus=1,
        mode="sync",
        alpha=0.0,
        train_gpus=None,
        workload=GSM8K_1GPU,
        assumed=GSM8K_ASSUMED,
    ),
    "gsm8k_1gpu_vllm.yaml": RecipePlan(
        gpus=1,
        mode="sync",
        alpha=0.0,
        train_gpus=None,
        workload=GSM8K_1GPU,
        assumed=GSM8K_ASSUMED,
    ),
    "dapo_math_8gpu.yaml": RecipePlan(
        gpus=8,
        mode="partial_rollout",
        alpha=2.0,
        train_gpus=4,
        workload=(*DAPO, "rollout.rollout_batch_size=64"),
        assumed="mean response 2,000 tokens (lognormal, σ 1: ROLL Flash's DAPO-Math figure for Qwen3-8B-Base); "
        "one proximal log-prob pass (decoupled PPO)",
    ),
    "dapo_math_2node.yaml": RecipePlan(
        gpus=16,
        mode="partial_rollout",
        alpha=2.0,
        train_gpus=8,
        workload=(*DAPO, "rollout.rollout_batch_size=128"),
        assumed="as dapo_math_8gpu, twice the batch on twice the GPUs; the network between nodes is not modelled",
    ),
    "agentic_endpoint.yaml": "not planned: the external harness (its turns, tool latency, episode length) sets "
    "the pace, and the simulator models built-in producers only",
}
"""Every recipe: how it is planned, or why it is not."""


def engine_keys(recipe: str) -> tuple[str, ...]:
    """Simulator keys for the recipe's engine as the runtime admits requests to it, read from the recipe by
    ``asyncrl.sim.run_engine`` (what ``memory.train_config`` carries into ``asyncrl plan``'s simulation too).

    The built-in engine (``cost.kv=reserved``) admits while a slot is free and the request's reservation fits
    ``max_kv_tokens`` (``asyncrl.engine.admission``, which the simulated engine shares), so its slots, budget and
    context cap are passed as they are and the simulation admits what the runtime would: the smaller of the
    slots and what the budget holds. vLLM (``cost.kv=paged``) runs up to ``max_num_seqs`` in the KV its
    ``gpu_memory_utilization`` leaves beside the weights, which ``asyncrl.sim.derive`` sizes from those two.
    """
    from asyncrl.config.run import load_run_config
    from asyncrl.sim.run_engine import simulated_engine_keys

    keys = simulated_engine_keys(load_run_config(RECIPES / recipe).engine)
    return tuple(f"{key}={value}" for key, value in keys.items())


def simulate_recipe(plan: RecipePlan, recipe: str) -> dict[str, Any]:
    """The recipe's own schedule through ``asyncrl plan``'s candidate simulation."""
    from asyncrl.app.planner import PLAN_STEADY, Candidate, candidate_overrides
    from asyncrl.app.simulate import simulate
    from asyncrl.sim.derive import load_sim_config

    candidate = Candidate(mode=plan.mode, alpha=plan.alpha, train_gpus=plan.train_gpus)
    keys = candidate_overrides(candidate, plan.gpus, 1)
    workload = [*PLAN_STEADY, *plan.workload, *engine_keys(recipe), *keys]
    totals = simulate(load_sim_config(None, workload)).totals
    return {
        "schedule": candidate.label(plan.gpus),
        "step_s": totals.get("steady_mean_step_s", totals["mean_step_s"]),
        "samples_per_s": totals.get("steady_samples_per_s", totals["samples_per_s"]),
        "mean_staleness": totals["mean_staleness"],
        "converged": bool(totals.get("steady_converged", 0.0)),
    }


def search(plan: RecipePlan, recipe: str, out: Path) -> dict[str, Any]:
    """``asyncrl plan --gpus N`` itself (a subprocess, as a user runs it), its memory filter planning the
    recipe's own trainer settings on each layout (``memory.train_config``); its plan.json."""
    memory = f"memory.train_config={RECIPES / recipe}"
    workload = [*plan.workload, *engine_keys(recipe)]
    command = [sys.executable, "-m", "asyncrl.cli.main", "plan", *workload, memory, f"output_dir={out}"]
    subprocess.run([*command, "--gpus", str(plan.gpus)], check=True, cwd=ROOT)
    return json.loads((out / "plan.json").read_text())


def measure() -> dict[str, Any]:
    import tempfile

    results: dict[str, Any] = {"commit": _commit(), "recipes": {}}
    for name, plan in PLANS.items():
        if isinstance(plan, str):
            results["recipes"][name] = {"not_planned": plan}
            continue
        print(f"{name}: simulating its schedule", flush=True)
        entry = {"plan": asdict(plan), "engine": engine_keys(name), "own": simulate_recipe(plan, name)}
        if plan.gpus >= 2:
            with tempfile.TemporaryDirectory() as tmp:
                full = search(plan, name, Path(tmp))
            entry["recommended"] = full["recommended"] | {"label": _label(full["recommended"], plan.gpus)}
            entry["colocated_sync_step_s"] = full["baseline"]["step_s"]
        results["recipes"][name] = entry
    return results


def _label(outcome: dict[str, Any], gpus: int) -> str:
    from asyncrl.app.planner import Candidate

    return Candidate(**outcome["candidate"]).label(gpus)


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=ROOT).stdout
    return done.stdout.strip() + ("+dirty" if dirty.strip() else "")


def engine_text(keys: list[str], workload: list[str]) -> str:
    """``engine_keys``' keys in words for the table; for the built-in engine, how many of the workload's
    requests its admission runs at once (``AdmissionPolicy``, as the runtime and the simulation admit)."""
    from asyncrl.engine.admission import AdmissionPolicy

    values = dict(key.split("=", 1) for key in [*workload, *keys])
    cap = int(values["engine.max_model_len"]) if "engine.max_model_len" in values else None
    if values["cost.kv"] == "reserved":
        slots, budget = int(values["engine.max_running_requests"]), int(values["engine.max_kv_tokens"])
        policy = AdmissionPolicy(max_running_requests=slots, max_kv_tokens=budget, max_model_len=cap)
        each = policy.reservation(int(values["prompt_tokens"]), int(values["rollout.max_new_tokens"]))
        running = policy.num_admitted([each] * (slots + 1), num_running=0, kv_reserved=0)
        return f"built-in: {running} run at once ({slots} slots; {budget:,} KV tokens, {each:,} reserved by each)"
    cap_text = f", contexts ≤ {cap:,}" if cap else ""
    share = float(values["cost.memory_utilization"])
    return (
        f"vLLM: ≤ {values['cost.max_num_seqs']} running, paged KV in {share:.0%} of each engine GPU{cap_text}"
    )


def table(results: dict[str, Any]) -> str:
    rows = [
        f"Generated by `python scripts/recipe_plans.py` from `docs/recipe_plans.json` (commit "
        f"{results['commit']}): simulated steady state on H100 profiles, not measured on a GPU.\n",
        "| recipe | GPUs | its schedule: step time | `asyncrl plan` recommends | engine, as the recipe sets it | "
        "assumed |",
        "|---|---|---|---|---|---|",
    ]
    for name, entry in results["recipes"].items():
        if "not_planned" in entry:
            rows.append(f"| `{name}` | – | – | – | – | {entry['not_planned']} |")
            continue
        own, plan = entry["own"], entry["plan"]
        mark = "" if own["converged"] else " (not settled)"
        own_text = (
            f"{own['schedule']}: **{own['step_s']:.0f} s**{mark}, staleness {own['mean_staleness']:.2f}"
        )
        best = entry.get("recommended")
        best_text = (
            f"{best['label']}: {best['step_s']:.0f} s ({best['speedup']:.2f}× colocated sync's "
            f"{entry['colocated_sync_step_s']:.0f} s)"
            if best
            else "– (one GPU: nothing to split)"
        )
        engine = engine_text(entry["engine"], plan["workload"])
        rows.append(
            f"| `{name}` | {plan['gpus']} | {own_text} | {best_text} | {engine} | {plan['assumed']} |"
        )
    return "\n".join(rows) + "\n"


def render(doc: str, results: dict[str, Any]) -> str:
    if not BLOCK.search(doc):
        raise SystemExit(f"{DOC}: no <!-- recipe-plans --> block")
    return BLOCK.sub(lambda m: m.group(1) + table(results) + m.group(2), doc)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", action="store_true", help="only rewrite the table from the JSON")
    parser.add_argument("--check", action="store_true", help="exit 1 if the table differs from the JSON's")
    args = parser.parse_args()
    if not (args.docs or args.check):
        RESULT.write_text(json.dumps(measure(), indent=1) + "\n")
    results = json.loads(RESULT.read_text())
    doc = DOC.read_text()
    new = render(doc, results)
    if args.check:
        return int(new != doc)
    DOC.write_text(new)
    print(f"written: {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
