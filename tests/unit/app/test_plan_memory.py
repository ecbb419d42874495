"""``asyncrl plan`` drops the layouts whose memory plan (``asyncrl doctor --hardware``'s) does not fit: an 8B
model's trainer on too few H100s and a colocated vLLM engine beside a trainer are dropped naming the role and
largest term, a 0.6B model fits everywhere, the critic and LoRA move the verdict, a node's host RAM drops a
layout its GPUs hold (naming the host term), a training config's settings are planned as the doctor plans them,
and a search never recommends a dropped layout and lists why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.app import memory_plan
from asyncrl.app.plan_memory import Layout, MemoryCheck, engine_keys
from asyncrl.app.planner import COLOCATED_SYNC, Candidate, Planner
from asyncrl.cli.main import main
from asyncrl.config.run import load_run_config
from asyncrl.sim.derive import load_sim_config
from asyncrl.sim.model_shape import NAMED_SHAPES
from tests.unit.sim.test_sim_planner import SMALL

RECIPES = Path(__file__).resolve().parents[3] / "asyncrl" / "examples" / "recipes"
WORKLOAD_8B = ["model=qwen3-8b", *SMALL[1:]]


def split(train: int) -> Candidate:
    return Candidate(mode="partial_rollout", alpha=2.0, train_gpus=train)


def verdicts(overrides: list[str], gpus: int, host_gb: float | None = None) -> dict[str, str]:
    """{candidate label: 'fits' or why it is dropped} for the colocated and every split layout."""
    planner = Planner(None, overrides, gpus, host_gb)
    assert planner.memory is not None
    candidates = [COLOCATED_SYNC, *(split(t) for t in range(1, gpus))]
    return {
        c.label(gpus): "fits" if (drop := planner.memory_drop(c)) is None else drop.text("h100")
        for c in candidates
    }


def test_an_8b_trainer_on_too_few_gpus_and_a_colocated_vllm_engine_are_dropped_naming_the_term() -> None:
    big = verdicts(WORKLOAD_8B, 8)
    # fp32 masters, gradients and AdamW's moments of 8.2 B parameters: 131 GB, sharded over the trainer GPUs
    assert "each trainer GPU needs 163.8 GB" in big["partial_rollout a=2 1T/7I"]
    assert big["partial_rollout a=2 1T/7I"].endswith("largest term: trainer rank's optimizer state 65.5 GB")
    assert "trainer rank's optimizer state" in big["partial_rollout a=2 2T/6I"]
    assert all(big[f"partial_rollout a=2 {t}T/{8 - t}I"] == "fits" for t in range(3, 8))
    # vLLM takes 0.9 of the GPU from its start, beside the trainer's un-offloaded shards and, until it applied
    # them, the weights the rank packed for it
    colocated = big["sync colocated on 8"]
    assert colocated.startswith("each shared GPU while the engine applies the update needs")
    assert "largest term: vLLM engine's gpu_memory_utilization 72.0 GB" in colocated
    small = verdicts(SMALL, 8)
    assert set(small.values()) == {"fits"}  # 0.6 B: every layout fits


def test_the_critic_and_lora_are_costed() -> None:
    critic = verdicts([*WORKLOAD_8B, "memory.critic=separate"], 8)
    # fits without it (above); its weights, gradients and moments are apart, so the policy's moments are largest
    assert critic["partial_rollout a=2 3T/5I"].startswith("each trainer GPU needs 95.0 GB")
    assert critic["partial_rollout a=2 4T/4I"] == "fits"
    full = verdicts(WORKLOAD_8B, 2)
    lora = verdicts([*WORKLOAD_8B, "memory.lora_rank=16"], 2)
    assert (
        "optimizer state" in full["partial_rollout a=2 1T/1I"] and lora["partial_rollout a=2 1T/1I"] == "fits"
    )
    check = MemoryCheck(
        load_sim_config(None, [*WORKLOAD_8B, "memory.lora_rank=16", "memory.critic=shared_trunk"])
    )
    config = check.run_config(Layout(1, 1, colocated=False))
    terms = {t.name for t in memory_plan.trainer_role(config, check.shape).terms}
    assert {"LoRA adapters", "value head"} <= terms and "reference copy" not in terms


def test_a_layout_that_fits_its_gpus_but_not_a_nodes_host_ram_is_dropped_naming_the_host_term() -> None:
    """A 0.6B model fits every GPU layout on 8 H100s, and the profile's 2 TB node holds every host plan. On a
    node of 3 GB (``--host-gb 3``) the object store's whole bf16 update (1.2 GB, with the ranks) and vLLM's two
    bucket files per engine (0.6 GB each) no longer fit beside five or more engines, and the colocated layout's
    offloaded optimizer state is there too; a split of 6 or 7 trainer GPUs still fits and is kept."""
    assert Planner(None, SMALL, 8).memory.hardware.host_bytes == memory_plan.HOST_BYTES  # the h100 profile's
    assert set(verdicts(SMALL, 8).values()) == {"fits"}
    small_node = verdicts(SMALL, 8, host_gb=3)
    assert small_node["partial_rollout a=2 1T/7I"] == (
        "each node's host RAM (1 trainer rank(s) and 7 engine(s) on 8 GPU(s)) needs 5.5 GB, 3.0 GB usable on "
        "h100; largest term: Ray object store's published update 1.2 GB"
    )
    for train in range(2, 6):
        assert (
            "largest term: Ray object store's published update"
            in small_node[f"partial_rollout a=2 {train}T/{8 - train}I"]
        )
    assert small_node["sync colocated on 8"].startswith(
        "each node's host RAM (8 trainer rank(s) and 8 engine(s) on 8 GPU(s)) needs 9.7 GB"
    )
    assert small_node["partial_rollout a=2 6T/2I"] == small_node["partial_rollout a=2 7T/1I"] == "fits"


def test_a_colocated_layouts_host_plan_holds_a_separate_critics_offloaded_state() -> None:
    """The simulated switch offloads AdamW's moments (``cost.switch_offload_bytes_per_param`` 8) of the policy
    and of a separate critic alike, as ``StateOffloader`` does: 9.7 GB per node without the critic fits 12 GB,
    14.5 GB with it does not."""
    assert verdicts(SMALL, 8, host_gb=12)["sync colocated on 8"] == "fits"
    with_critic = verdicts([*SMALL, "memory.critic=separate"], 8, host_gb=12)["sync colocated on 8"]
    assert with_critic.startswith(
        "each node's host RAM (8 trainer rank(s) and 8 engine(s) on 8 GPU(s)) needs 14.5"
    )


def test_host_gb_needs_the_memory_check(capsys) -> None:
    with pytest.raises(ValueError, match="--host-gb 3 sets the node's host RAM .* memory.check=false"):
        Planner(None, [*SMALL, "memory.check=false"], 8, host_gb=3)
    assert main(["plan", *SMALL, "memory.check=false", "--gpus", "8", "--host-gb", "3"]) == 2
    assert "memory.check=false" in capsys.readouterr().err


def test_a_training_config_is_planned_as_the_doctor_plans_it() -> None:
    recipe = RECIPES / "dapo_math_8gpu.yaml"
    check = MemoryCheck(load_sim_config(None, [*WORKLOAD_8B, f"memory.train_config={recipe}"]))
    config = check.run_config(Layout(4, 4, colocated=False))  # the recipe's own layout
    assert config.trainer.max_tokens_per_microbatch == 32768 and config.engine.backend == "vllm"
    assert check.drop(Layout(4, 4, colocated=False)) is None
    doctor = memory_plan.plan(
        load_run_config(recipe),
        NAMED_SHAPES["qwen3-8b"],
        check.longest,
        memory_plan.hardware_named("h100", 8),
    )
    planned = memory_plan.plan(config, check.shape, check.longest, check.hardware)
    assert [d.total for d in planned.devices] == [d.total for d in doctor.devices]
    one = check.drop(Layout(1, 7, colocated=False))
    assert one is not None and one.role == "trainer rank"
    two_nodes = MemoryCheck(
        load_sim_config(None, [*WORKLOAD_8B, f"memory.train_config={RECIPES / 'dapo_math_2node.yaml'}"])
    )
    assert two_nodes.drop(Layout(8, 8, colocated=False)) is None  # a cluster runtime stays one
    assert two_nodes.run_config(Layout(8, 8, colocated=False)).runtime.type == "cluster"
    no_check = Planner(None, [*WORKLOAD_8B, "memory.check=false"], 8)
    assert no_check.memory is None and no_check.memory_drop(split(1)) is None


def test_a_search_never_recommends_a_dropped_layout_and_lists_why() -> None:
    """On 2 H100s an 8B model trains only with LoRA on a GPU of its own: colocated sync is dropped (simulated
    as the yardstick only) and the split is recommended; without LoRA nothing fits, and the error says why."""
    planner = Planner(None, [*WORKLOAD_8B, "memory.lora_rank=16"], 2)
    result = planner.search(alphas=(1,), modes=("one_step_off",))
    assert [c for c, _ in result.dropped] == [COLOCATED_SYNC] and result.baseline.candidate == COLOCATED_SYNC
    assert result.recommended.candidate.train_gpus == 1
    assert result.engine[:2] == ("engine.backend=vllm", "engine.vllm.gpu_memory_utilization=0.9")
    assert result.to_json()["engine"] == list(result.engine)
    assert result.runner_up is not None and result.runner_up.candidate.train_gpus == 1
    why = result.to_json()["dropped_for_memory"]["sync colocated on 2"]
    assert why.startswith("each shared GPU while the engine applies the update needs")
    assert "on h100; largest term: vLLM engine's gpu_memory_utilization 72.0 GB" in why
    with pytest.raises(ValueError, match="no candidate on 2 GPU.* fits memory.*optimizer state"):
        Planner(None, WORKLOAD_8B, 2).search(alphas=(1,), modes=("one_step_off",))


@pytest.mark.slow
def test_plan_cli_prints_the_dropped_layouts(tmp_path, capsys) -> None:
    args = [*WORKLOAD_8B, "memory.lora_rank=16", f"output_dir={tmp_path}"]
    assert main(["plan", *args, "--gpus", "2", "--alphas", "1"]) == 0
    out = capsys.readouterr().out
    assert "dropped for memory: sync colocated on 2: each shared GPU while the engine applies" in out
    record = json.loads((tmp_path / "plan.json").read_text())
    assert list(record["dropped_for_memory"]) == ["sync colocated on 2"]
    assert record["recommended"]["candidate"]["train_gpus"] == 1
    assert main(["plan", *WORKLOAD_8B, "--gpus", "2"]) == 2  # nothing fits: a named error, not a traceback


LONG_RESERVED = [
    "model=qwen3-8b",
    "hardware=h100",
    "cost.kv=reserved",
    "prompt_tokens=200",
    "rollout.max_new_tokens=8192",
]


def test_a_reserved_engine_is_planned_with_the_slots_its_kv_admits_as_the_simulation_runs_it() -> None:
    """The built-in engine preallocates every slot at the longest context (8,392 tokens here). The simulated
    engine runs 377,191 // 8,392 = 44 at once (what fits an H100 at cost.memory_utilization 0.9 beside 16.4
    GB of weights), so the plan holds 44 slots (54.5 GB), not cost.max_num_seqs' 256 (316.8 GB, which once
    dropped every layout), and the run config it stands for, whose keys plan prints, sets those 44."""
    sim = load_sim_config(None, LONG_RESERVED)
    assert sim.engine.max_kv_tokens == 377_191 and sim.engine.max_running_requests == 377_191 // 8392 == 44
    check = MemoryCheck(sim, 8)
    assert check.drop(Layout(4, 4, False)) is None
    config = check.run_config(Layout(4, 4, False))
    pool = {t.name: t.bytes for t in memory_plan.engine_role(config, check.shape, 8392, check.hardware).terms}
    assert pool["KV pool"] == 44 * 8393 * 147_456
    assert engine_keys(config) == [
        "engine.backend=builtin",
        "engine.max_running_requests=44",
        "engine.max_kv_tokens=377191",
        "engine.max_model_len=8392",
    ]
    assert engine_keys(MemoryCheck(load_sim_config(None, SMALL), 8).run_config(Layout(4, 4, False))) == [
        "engine.backend=vllm",
        "engine.vllm.gpu_memory_utilization=0.9",
        "engine.vllm.max_num_seqs=256",
        "engine.vllm.tensor_parallel_size=1",
        "engine.max_model_len=2176",
    ]


def test_a_training_configs_oversized_engine_pool_is_named_with_its_keys(tmp_path) -> None:
    """A training config's built-in engine is planned (and simulated) as written: 256 slots of 2,177
    positions of Qwen3-8B's KV are 82.2 GB, more than an H100 holds, in every layout (its LoRA trainer in bf16
    would fit); the error says which engine keys shrink it, not only the trainer's."""
    run = tmp_path / "run.yaml"
    engine = "engine:\n  backend: builtin\n  max_running_requests: 256\n  max_kv_tokens: 600000\n"
    run.write_text(engine + "model:\n  dtype: bfloat16\ntrainer:\n  lora:\n    rank: 16\n")  # a light trainer
    planner = Planner(None, [*WORKLOAD_8B, f"memory.train_config={run}"], 2)
    assert planner.base.engine.max_running_requests == 256  # the training config's, simulated as it is
    drop = planner.memory_drop(split(1))
    assert drop is not None and (drop.role, drop.term) == ("engine", "KV pool")
    with pytest.raises(ValueError, match=r"smaller built-in engine pool \(fewer engine.max_running_requests"):
        planner.search(alphas=(1,), modes=("one_step_off",))


def test_a_small_models_reserved_slots_stay_within_what_the_engine_allocates() -> None:
    """Qwen3-0.6B's 1.2 GB of weights leave a simulated budget (0.9 of the H100 less the weights) that holds 73
    contexts of 8,392 tokens, 70.3 GB of pool, above the 69.5 GB the engine itself allocates (90 % of the GPU
    free beside its weights and the CUDA context): such a layout is dropped as doctor FAILs it, and the planner
    simulates and plans the 72 slots the engine starts with; slots given explicitly are kept, and dropped."""
    small = ["model=qwen3-0.6b", *LONG_RESERVED[1:]]
    sim = load_sim_config(None, small)
    assert sim.engine.max_running_requests == 73
    drop = MemoryCheck(sim, 8).drop(Layout(4, 4, False))
    assert drop is not None and (drop.role, drop.term) == ("engine", "KV pool")
    assert drop.text("h100").startswith(
        "the built-in engine's KV pool (90 % of its GPU free beside its weights)"
    )
    planner = Planner(None, small, 8)
    assert planner.base.engine.max_running_requests == 72
    assert planner.memory_drop(split(4)) is None
    explicit = Planner(None, [*small, "engine.max_running_requests=73"], 8)
    assert explicit.base.engine.max_running_requests == 73 and explicit.memory_drop(split(4)) is not None
    assert Planner(None, LONG_RESERVED, 8).base.engine.max_running_requests == 44  # 8B: the budget is tighter
