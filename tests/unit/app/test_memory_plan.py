"""The memory plan per role on hardware that is not here: its terms' arithmetic with exact values, every shipped
recipe fitting the hardware its header's ``asyncrl doctor ... --hardware`` line declares (GPUs and one node's
host RAM, with the plan's margin), and the FAILs a user must see: the role and its largest term (on a GPU or in
host RAM), a relative multi-node ``output_dir``."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from asyncrl.app import memory_plan as mp
from asyncrl.app.doctor import Status, diagnose
from asyncrl.cli import main as cli
from asyncrl.config.run import load_run_config
from asyncrl.sim.model_shape import NAMED_SHAPES
from asyncrl.testing.hub_cache import use_offline_cache

RECIPES = Path(__file__).resolve().parents[3] / "asyncrl" / "examples" / "recipes"
QWEN3_1_7B = NAMED_SHAPES["qwen3-1.7b"]
H100 = mp.hardware_named("h100", 1)


def declared_plan(recipe: Path) -> list[str]:
    """The ``asyncrl doctor RECIPE --hardware ...`` command of the recipe's header, as arguments."""
    match = re.search(rf"asyncrl (doctor \S*{recipe.name} --hardware .*?)\s*\(", recipe.read_text())
    assert match, f"{recipe.name} declares no 'asyncrl doctor {recipe.name} --hardware ...' line"
    return shlex.split(match.group(1))


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_fits_its_declared_hardware_with_a_margin(recipe, tmp_path, monkeypatch, capsys) -> None:
    use_offline_cache(monkeypatch, tmp_path)  # the hub model is not here: sized by the simulator's shape
    assert cli.main(declared_plan(recipe)) == 0
    lines = capsys.readouterr().out.splitlines()
    verdicts = [line for line in lines if line.startswith(("OK", "WARN", "FAIL"))]
    memory = [
        line for line in verdicts if any(k in line for k in (" gpu memory: ", " gpus: ", " host memory: "))
    ]
    assert memory and all(line.startswith("OK") for line in memory), "\n".join(memory)
    assert any("per GPU at its peak" in line for line in memory), "\n".join(lines)  # roles, with their terms
    assert any(" host memory: each node's host RAM" in line for line in memory), "\n".join(lines)


def test_the_terms_are_the_arithmetic_they_state() -> None:
    shape = QWEN3_1_7B
    config = load_run_config(
        None,
        [
            "model.dtype=float32",
            "trainer.compute_dtype=bfloat16",
            "trainer.activation_checkpointing=true",
            "trainer.max_tokens_per_microbatch=1000",
            "engine.dtype=bfloat16",
            "engine.max_running_requests=4",
            "engine.max_model_len=99",
        ],
    )
    trainer = {t.name: t for t in mp.trainer_role(config, shape).terms}
    p = shape.num_params
    assert trainer["master weights"].bytes == trainer["gradients"].bytes == 4 * p
    assert trainer["optimizer state"].bytes == 8 * p and trainer["optimizer scratch"].bytes == 4 * p
    assert trainer["compute copies"].bytes == 2 * p  # autocast's bf16 copy of the fp32 weights
    per_token = 2 * (6 * 2048 + 6 * (2048 + 2 * 1024) + 4 * 6144)
    assert mp.layer_activation_bytes_per_token(shape, 2) == per_token
    assert trainer["activations"].bytes == 28 * 1000 * 2048 * 4  # each layer's input, fp32 residual
    assert trainer["recompute"].bytes == max(1000 * per_token, 4 * 1000 * 151_936 * 4)  # a layer or logits
    assert trainer["publish copy"].bytes == 2 * p
    role = mp.trainer_role(config, shape)
    # master weights and AdamW's moments (the gradients are freed after every step), and the last update the
    # proxy keeps for a replaced engine's catch-up (inline, in_process, recovery on)
    assert trainer["retained update"].bytes == 2 * p and trainer["retained update"].phase == mp.HELD
    held = 12 * p + 2 * p
    assert trainer["gradients"].phase == mp.STEPPING and role.phase_bytes(mp.HELD) == held
    grads = trainer["gradients"].bytes  # alive through backward and the optimizer step, never in a sync
    train = sum(t.bytes for t in trainer.values() if t.phase == "train") + grads
    assert train > trainer["compute copies"].bytes + trainer["activations"].bytes + grads
    step = trainer["optimizer scratch"].bytes + grads
    assert (role.phase_bytes("train"), role.phase_bytes("step")) == (train, step)
    assert role.phase_bytes("sync") == trainer["publish copy"].bytes
    assert train < step and role.peak_phase == "step" and role.total == held + step  # phases never overlap
    engine = {t.name: t for t in mp.engine_role(config, shape, 50, H100).terms}
    assert engine["weights"].bytes == 2 * p
    assert engine["KV pool"].bytes == 4 * 100 * (2 * 28 * 8 * 128 * 2)  # max_model_len + scratch position
    vocab = 151_936  # a step's scratch, from the engine's own settings (``engine_step_terms``)
    prefill = 2 * (3 * 2048 + 3 * 6144)  # residual, normed, sum; gate, up, product: nothing kept for backward
    assert engine["prefill scratch"].bytes == 2 * 2048 * prefill  # padded up to twice the prefill budget
    assert engine["decode logits"].bytes == 2 * 4 * vocab * 4  # CUDA graphs: static buffer and the pool's
    assert engine["sampling"].bytes == 4 * vocab * 16  # logits, log-probs, probabilities, their sum
    step = ("prefill scratch", "decode logits", "sampling")
    assert {engine[name].phase for name in step} == {"train"}  # while it generates, never while it sleeps

    def step_terms(*keys: str) -> dict[str, int]:
        keys = ("engine.max_running_requests=4", *keys)
        return {t.name: t.bytes for t in mp.engine_role(load_run_config(None, keys), shape, 50, H100).terms}

    assert step_terms("rollout.top_p=0.9")["sampling"] == 4 * vocab * (8 + 37)  # the whole vocabulary sorted
    assert step_terms("rollout.top_k=50")["sampling"] == 4 * vocab * 16  # 50 columns sorted: under the draw's
    assert step_terms("engine.decode_graphs=off")["decode logits"] == 4 * vocab * 4  # eager: one output
    sharded = mp.trainer_role(load_run_config(None, ["trainer.num_workers=4"]), shape)
    assert {t.name: t.bytes for t in sharded.terms}["gradients"] == -(-4 * p // 4)
    unsharded = load_run_config(None, ["trainer.num_workers=4", "trainer.fsdp_grad_accumulation=unsharded"])
    assert {t.name: t.bytes for t in mp.trainer_role(unsharded, shape).terms}["gradients"] == 4 * p
    critic = ["advantage.name=gae", "critic.type=separate"]  # the trainer syncs the critic as the policy
    for accumulation, grads in (
        ("sharded", -(-4 * shape.body_params // 4)),
        ("unsharded", 4 * shape.body_params),
    ):
        keys = ["trainer.num_workers=4", f"trainer.fsdp_grad_accumulation={accumulation}", *critic]
        terms = {t.name: t.bytes for t in mp.trainer_role(load_run_config(None, keys), shape).terms}
        assert terms["critic gradients"] == grads
    assert shape.lora_params(8) == 28 * 8 * ((2048 + 2048) + 2 * (2048 + 1024) + (2048 + 2048) + 3 * 8192)


def test_the_one_gpu_recipe_as_it_was_fails_naming_the_role_and_its_largest_term(
    tmp_path, monkeypatch
) -> None:
    use_offline_cache(monkeypatch, tmp_path)
    before = load_run_config(
        RECIPES / "gsm8k_1gpu.yaml", ["engine.dtype=float32", "engine.max_running_requests=128"]
    )
    findings = diagnose(before, hardware=H100)
    failed = [f for f in findings if f.status is Status.FAIL]
    assert [f.topic for f in failed] == ["gpu memory"]
    assert "does not fit" in failed[0].detail and "largest term: engine's KV pool 45.1 GB" in failed[0].fix
    on_h200 = diagnose(before, hardware=mp.hardware_named("h200", 1))
    assert not [f for f in on_h200 if f.status is Status.FAIL]


def test_a_multi_node_run_needs_an_absolute_output_dir(tmp_path, monkeypatch) -> None:
    use_offline_cache(monkeypatch, tmp_path)
    recipe = RECIPES / "dapo_math_2node.yaml"
    hardware = mp.hardware_named("h100", 16)
    relative = diagnose(load_run_config(recipe, ["output_dir=runs/x"]), hardware=hardware)
    out = next(f for f in relative if f.topic == "output_dir")
    assert out.status is Status.FAIL and "absolute path" in out.fix
    one_node = diagnose(
        load_run_config(RECIPES / "dapo_math_8gpu.yaml"), hardware=mp.hardware_named("h100", 8)
    )
    assert [f for f in one_node if f.topic == "output_dir"] == []


def test_hardware_from_json_and_bad_input_name_the_field(tmp_path) -> None:
    inline = mp.hardware_named('{"name": "l40s", "memory_gb": 48}', 2)
    assert (inline.name, inline.device_bytes, inline.num_gpus) == ("l40s", 48_000_000_000, 2)
    path = tmp_path / "hw.json"
    path.write_text('{"hbm_bytes": 2e10, "gpus_per_node": 4}')
    assert mp.hardware_named(str(path)).num_gpus == 4
    with pytest.raises(ValueError, match="memory_gb"):
        mp.hardware_named('{"name": "x"}')
    with pytest.raises(ValueError, match="--gpus"):
        mp.hardware_named("h100", 0)
    assert mp.hardware_named("h100").host_bytes == 2_000_000_000_000  # a DGX node's RAM, the profile's
    assert mp.hardware_named('{"memory_gb": 48, "host_memory_gb": 512}').host_bytes == 512_000_000_000
    assert mp.hardware_named("h100", host_gb=256).host_bytes == 256_000_000_000
    with pytest.raises(ValueError, match="--host-gb"):
        mp.hardware_named("h100", host_gb=0)
    assert mp.shape_named_like("Qwen/Qwen3-8B-Base") is NAMED_SHAPES["qwen3-8b"]
    assert mp.shape_named_like("someone/else") is None


def test_a_ray_sync_run_plans_trainer_rank_and_engine_on_one_gpu_as_its_placement_puts_them() -> None:
    """Ray colocates sync (one bundle per pair), so the plan sums the pair on one GPU: both resident without
    ``runtime.switch``; with it, in turns (the offloaded trainer beside the engine, the asleep engine beside
    the trainer). An async run keeps each role on its own GPUs."""
    keys = ["runtime.type=local", "trainer.num_workers=2", "rollout.num_engines=2", "controller.mode=sync"]
    resident = mp.plan(load_run_config(None, keys), QWEN3_1_7B, 512, H100)
    trainer, engine = resident.roles
    [shared] = resident.devices
    assert shared.roles == ((trainer, 1), (engine, 1)) and shared.total == trainer.total + engine.total
    switched = mp.plan(load_run_config(None, [*keys, "runtime.switch.enabled=true"]), QWEN3_1_7B, 512, H100)
    training, publishing, applying, generating = switched.devices
    assert [[role.name for role, _ in device.roles] for device in switched.devices] == [
        ["trainer rank", "engine (asleep)"],
        ["trainer rank", "engine (asleep)"],
        ["trainer rank (offloaded)", "engine"],
        ["trainer rank (offloaded)", "engine"],
    ]
    assert max(device.total for device in switched.devices) < shared.total
    # the whole model each rank packs for its engine (bf16 on CUDA): made while the rank is resident, alive
    # until the woken engine applied it, let go before it generates
    copy = QWEN3_1_7B.num_params * 2
    (packed,) = [t for t in applying.roles[0][0].terms if t.name == "packed copy"]
    assert (packed.bytes, packed.phase) == (copy, mp.HELD)
    assert publishing.roles[0][0].phase_bytes("sync") == copy + trainer.phase_bytes("sync")
    assert not [t for role, _ in generating.roles for t in role.terms if t.name == "packed copy"]
    # on Ray a rank gathers a bucket at a time beside the packed copy; its engine maps the packed blocks and
    # copies from them, receiving no bucket of its own (without the switch it does)
    assert {t.name for t in publishing.roles[0][0].terms} >= {"staging copy", "packed copy"}
    assert applying.roles[1][0].phase_bytes("sync") == 0 < engine.phase_bytes("sync")
    split = mp.plan(
        load_run_config(None, [*keys[:-1], "controller.mode=async", "buffer.async_ratio=1"]),
        QWEN3_1_7B,
        512,
        H100,
    )
    assert [device.name for device in split.devices] == ["each trainer GPU", "each engine GPU"]


SWITCHED_INLINE = [
    "model.dtype=float32",
    "engine.dtype=bfloat16",
    "controller.mode=sync",
    "runtime.switch.enabled=true",
]
"""One fp32 trainer and one bf16 built-in engine in one process, under the colocated switch."""


def test_an_inline_switched_gpu_needs_its_heaviest_phase_not_the_trainers_peak_plus_the_engines() -> None:
    """Inline under ``runtime.switch`` the trainer and the engine take turns on the one GPU in the order
    ``runtime.colocate`` runs them: each phase counts what is alive then, and the GPU needs the heaviest. The
    plan once summed both roles' peaks there (the engine's KV pool beside the trainer's step, which the switch
    exists to avoid). Inline, the trainer's publish copy is the colocated transport's packed copy: once."""
    config = load_run_config(None, SWITCHED_INLINE)
    plan = mp.plan(config, QWEN3_1_7B, 512, H100)
    trainer, engine = plan.roles
    t = {term.name: term.bytes for term in trainer.terms}
    e = {term.name: term.bytes for term in engine.terms}
    copy = QWEN3_1_7B.num_params * 2  # the packed copy, bf16
    assert t["publish copy"] == copy and set(t) >= {"master weights", "optimizer state", "gradients"}
    held = trainer.phase_bytes(mp.HELD)
    assert held == t["master weights"] + t["optimizer state"]
    trains = held + max(trainer.phase_bytes("train"), trainer.phase_bytes("step")) + e["weights"]
    publishes = held + copy + e["weights"]
    applies = t["master weights"] + copy + e["weights"] + e["KV pool"]  # the optimizer state offloaded
    generates = t["master weights"] + e["weights"] + e["KV pool"] + engine.phase_bytes("train")
    assert [d.name.rsplit(" while the ", 1)[1] for d in plan.devices] == list(mp.SWITCH_PHASES)
    assert [d.total for d in plan.devices] == [trains, publishes, applies, generates]
    assert max(d.total for d in plan.devices) == trains < trainer.total + engine.total
    # level 2 and the master weights offloaded: nothing of the engine's stays beside the trainer, nothing of
    # the trainer's beside the engine but the copy it packed, until the engine applied it
    lighter = ["runtime.switch.engine_sleep_level=2", "runtime.switch.offload_master_weights=true"]
    plan = mp.plan(load_run_config(None, [*SWITCHED_INLINE, *lighter]), QWEN3_1_7B, 512, H100)
    assert [d.total for d in plan.devices] == [
        trains - e["weights"],
        publishes - e["weights"],
        copy + e["weights"] + e["KV pool"],
        engine.total,
    ]
    resident = mp.plan(load_run_config(None, SWITCHED_INLINE[:-1]), QWEN3_1_7B, 512, H100)
    [both] = resident.devices  # without the switch both stay resident, at their peaks, and the proxy keeps
    assert both.total == trainer.total + engine.total + copy  # the last update for a catch-up, in_process


KL_SWITCHED_8B = [
    "model.dtype=bfloat16",
    "engine.dtype=bfloat16",
    "controller.mode=sync",
    "runtime.switch.enabled=true",
    "loss.kl.beta=0.1",
]
"""Qwen3-8B in bf16 on one GPU under the colocated switch, with a KL term: a frozen reference copy of 16 GB,
offloaded by default (``runtime.switch.offload_reference``)."""
KL_SWITCHED_8B_KEPT = [*KL_SWITCHED_8B, "runtime.switch.offload_reference=false"]
"""The same with the reference kept on the GPU."""


def test_an_offloaded_reference_leaves_the_gpu_once_the_trainer_published_and_stays_counted_while_it_trains():
    """The reference copy moves to host memory with the optimizer state, after the publication: the phases the
    engine runs in (applying the update, generating) drop by exactly its bytes, the trainer's (training,
    publishing) keep them, and the host holds them."""
    offloaded, kept = load_run_config(None, KL_SWITCHED_8B), load_run_config(None, KL_SWITCHED_8B_KEPT)
    assert offloaded.runtime.switch.offload_reference and not kept.runtime.switch.offload_reference
    resident, moved = (mp.plan(config, QWEN3_8B, 512, H100) for config in (kept, offloaded))
    reference = {t.name: t.bytes for t in resident.roles[0].terms}["reference copy"]
    assert reference == QWEN3_8B.num_params * 2 and round(reference / mp.GB, 1) == 16.4
    drops = [a.total - b.total for a, b in zip(resident.devices, moved.devices, strict=True)]
    assert drops == [0, 0, reference, reference], (
        drops
    )  # SWITCH_PHASES: trains, publishes, applies, generates
    *_, generating = moved.devices
    assert all("reference copy" not in {t.name for t in role.terms} for role, _ in generating.roles)

    def hosted(keys: list[str]) -> dict[str, int]:
        return {t.name: t.bytes for role, _ in _host(keys, QWEN3_8B, H100).roles for t in role.terms}

    assert hosted(KL_SWITCHED_8B)["offloaded reference copy"] == reference
    assert "offloaded reference copy" not in hosted(KL_SWITCHED_8B_KEPT)


def test_doctor_counts_an_offloaded_reference_on_the_host_and_not_beside_the_generating_engine() -> None:
    """``asyncrl doctor --hardware``'s phase lines are the plan's: the one GPU while the engine generates needs
    the reference's 16.4 GB less once it is offloaded, while the trainer trains the same; the host line names
    it."""

    def lines(keys: list[str]) -> dict[str, str]:
        """Each phase's line by its phase (``engine generates``, ...), and the host line as ``host``."""
        findings = diagnose(load_run_config(None, keys), hardware=H100, shape=QWEN3_8B)
        by_phase = {f.detail.split(":")[0].rsplit(" while the ", 1)[-1]: f.detail for f in findings}
        return by_phase | {"host": next(f.detail for f in findings if f.topic == "host memory")}

    def needs(line: str) -> float:
        return float(re.search(r": ([0-9.]+) GB on ", line).group(1))

    offloaded, kept = lines(KL_SWITCHED_8B), lines(KL_SWITCHED_8B_KEPT)
    reference = QWEN3_8B.num_params * 2 / mp.GB
    generating = needs(kept["engine generates"]) - needs(offloaded["engine generates"])
    assert generating == pytest.approx(reference, abs=0.11)  # each line rounds to 0.1 GB
    assert needs(kept["trainer trains"]) == needs(offloaded["trainer trains"])
    assert f"offloaded reference copy {reference:.2f}" in offloaded["host"], offloaded["host"]
    assert "reference" not in kept["host"], kept["host"]


def test_doctor_names_the_phase_that_binds_a_switched_gpu(tmp_path, monkeypatch, capsys) -> None:
    """``asyncrl doctor --hardware`` prints each phase of the one GPU with what each role holds then, and
    marks the heaviest: the GPU's need."""
    use_offline_cache(monkeypatch, tmp_path)
    recipe = RECIPES / "gsm8k_1gpu.yaml"
    args = ["doctor", str(recipe), "runtime.switch.enabled=true", "--hardware", "h100", "--gpus", "1"]
    assert cli.main(args) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "the one GPU" in line]
    assert len(lines) == len(mp.SWITCH_PHASES)
    (binds,) = [line for line in lines if "the phase that binds" in line]
    assert "while the trainer trains" in binds and "= trainer rank " in binds and "engine (asleep) " in binds


def test_a_broadcast_plans_the_staging_its_apply_path_holds() -> None:
    """vLLM's worker receives a broadcast on its GPU beside its share: staged, two buffers in flight (each
    copied to host memory as it arrives, where the whole update waits: counted in a plan of host memory);
    streamed, two buckets (a layer still collecting keeps the previous one). The built-in engine receives one
    bucket on the GPU either way and says which path it runs (a staged one keeps the whole update in host
    memory, a streamed one only the bucket). At Qwen3-1.7B's vocabulary the embedding (151,936 × 2,048 in
    bf16, 622 MB) is larger than a 256 MiB bucket and travels alone, so it is the largest bucket."""
    broadcast = ["runtime.type=local", "weight_sync.type=broadcast"]
    staged = ["controller.mode=async", "buffer.async_ratio=1"]
    embedding = 151_936 * 2_048 * 2
    for mode, held in (
        (staged, 2 * embedding),  # the embedding's buffer and the one before it, never the whole update
        (["controller.mode=sync"], 2 * embedding),  # the embedding's bucket and the next
        (["controller.mode=sync", "weight_sync.bucket_mb=16"], 2 * embedding),
    ):
        vllm = load_run_config(None, [*broadcast, *mode, "engine.backend=vllm"])
        terms = {t.name: t for t in mp.engine_role(vllm, QWEN3_1_7B, 512, H100).terms}
        assert terms["broadcast staging"].bytes == held < QWEN3_1_7B.num_params * 2
        assert terms["broadcast staging"].phase == "sync"
    vllm_staged = load_run_config(None, [*broadcast, *staged, "engine.backend=vllm"])
    [on_host] = [
        t
        for t in mp.engine_role(vllm_staged, QWEN3_1_7B, 512, H100, device="cpu").terms
        if t.name == "broadcast staging"
    ]  # a plan of host memory counts the whole staged update there (fp32 on CPU) and the buffers in flight
    assert on_host.bytes == QWEN3_1_7B.num_params * 4 + 2 * 2 * embedding
    by_object_store = load_run_config(None, ["runtime.type=local", "engine.backend=vllm"])
    assert "broadcast staging" not in {
        t.name for t in mp.engine_role(by_object_store, QWEN3_1_7B, 512, H100).terms
    }
    for mode, path in (("sync", "streamed"), ("multi_version", "staged")):
        config = load_run_config(None, [*broadcast, f"controller.mode={mode}"])
        [staging] = [
            t for t in mp.engine_role(config, QWEN3_1_7B, 512, H100).terms if t.name == "update staging"
        ]
        assert f"broadcast_apply {path}" in staging.how
        assert staging.bytes == embedding
        [on_host] = [
            t
            for t in mp.engine_role(config, QWEN3_1_7B, 512, H100, device="cpu").terms
            if t.name == "update staging"
        ]  # a plan of host memory counts where the staged path keeps the whole update
        whole = QWEN3_1_7B.num_params * 4  # the model's dtype on CPU (float32)
        assert on_host.bytes == (whole if path == "staged" else 151_936 * 2_048 * 4)


def test_vllm_streaming_holds_a_layer_spread_over_small_buckets() -> None:
    """vLLM's layerwise reload keeps a layer's tensors until its last one arrives, so with buckets far smaller
    than a layer its worker holds the whole layer and a partial bucket at each end, not two buckets."""
    config = load_run_config(
        None,
        ["runtime.type=local", "weight_sync.type=broadcast", "controller.mode=sync", "engine.backend=vllm"]
        + ["weight_sync.bucket_mb=1", "model.dtype=bfloat16"],
    )
    shape = NAMED_SHAPES["qwen3-235b-a22b"]
    layer = (shape.attention_params_per_layer + shape.mlp_params_per_layer) * 2
    assert layer > 2 * shape.vocab * shape.hidden * 2  # 128 experts a layer outweigh two embedding buckets
    [staging] = [t for t in mp.engine_role(config, shape, 512, H100).terms if t.name == "broadcast staging"]
    assert staging.bytes == layer + 2 * 2**20


def _checkpoint(overrides: list[str], shape=QWEN3_1_7B, device: str = "cuda") -> dict[str, int]:
    size = mp.checkpoint_bytes(load_run_config(None, overrides), shape, device)
    return {t.name: t.bytes for t in size.parts} | {"each": size.each, "count": size.count}


def test_a_checkpoint_counts_every_part_it_writes_the_sharded_model_export_included() -> None:
    """A sharded trainer's step directory holds DCP's weights (a tied output layer under both names) and
    moments, and a Hugging Face ``model/`` in the serving dtype beside them; one process writes its master
    weights once. Every part is kept for each retained checkpoint (the step directory is pruned whole)."""
    shape, p = QWEN3_1_7B, QWEN3_1_7B.num_params
    tied = shape.vocab * shape.hidden
    sharded = ["runtime.type=local", "trainer.num_workers=4", "rollout.num_engines=4", "model.dtype=float32"]
    retained = ["controller.num_steps=300", "trainer.checkpoint_every=20", "trainer.keep_last_checkpoints=3"]
    on_gpus = _checkpoint([*sharded, *retained])
    assert on_gpus == {
        "sharded/ weights": 4 * (p + tied),
        "AdamW moments": 8 * p,
        "model/": 2 * p,  # bfloat16: what the engines serve on CUDA
        "each": 4 * (p + tied) + 8 * p + 2 * p,
        "count": 4,  # 3 kept and the one being written
    }
    assert _checkpoint([*sharded, *retained], device="cpu")["model/"] == 4 * p  # served as trained on CPU
    assert _checkpoint([*sharded, *retained, "engine.dtype=float16"])["model/"] == 2 * p
    one_process = _checkpoint(["trainer.num_workers=4", *retained])  # inline: one trainer process
    assert one_process == {"model/": 4 * p, "AdamW moments": 8 * p, "each": 12 * p, "count": 4}
    lora = _checkpoint([*sharded, "trainer.lora.rank=8"])
    adapters = shape.lora_params(8)
    assert lora == {
        "sharded/ weights": 4 * adapters,
        "AdamW moments": 8 * adapters,
        "adapter/": 4 * adapters,
        "each": 16 * adapters,
        "count": 1,  # no periodic checkpoints: the final one
    }
    assert _checkpoint([*sharded, "trainer.checkpoint_every=10", "controller.num_steps=25"])["count"] == 3
    keep_all = _checkpoint([*sharded, *retained, "trainer.keep_last_checkpoints=null"])
    assert keep_all["count"] == 300 // 20 + 1
    gae = [*sharded, "advantage.name=gae"]
    critic = _checkpoint([*gae, "critic.type=separate"])["critic"]
    assert critic == 3 * 4 * (shape.body_params + shape.hidden + 1)  # a copy of the policy's body + its head
    assert _checkpoint([*gae, "critic.type=shared_trunk"])["value head"] == 3 * 4 * (shape.hidden + 1)


def test_the_8gpu_recipe_fits_vllms_gpus_with_a_staged_broadcast_waiting_in_host_memory() -> None:
    """Staged whole on the GPU, Qwen3-8B's bf16 update (16.4 GB) beside vLLM's 85 % of an H100 was 84.4 GB
    per engine GPU and did not fit; staged in host memory, the GPU holds two buffers (the 1.24 GB embedding's
    and one more) beside the share."""
    recipe = RECIPES / "dapo_math_8gpu.yaml"
    config = load_run_config(recipe, ["controller.mode=async", "weight_sync.type=broadcast"])
    assert config.broadcast_apply() == "staged"
    shape = NAMED_SHAPES["qwen3-8b"]
    hardware = mp.hardware_named("h100", 8)
    engine_gpu = mp.plan(config, shape, 9216, hardware).devices[-1]
    assert engine_gpu.name == "each engine GPU"
    embedding = shape.vocab * shape.hidden * 2
    assert engine_gpu.total == int(0.85 * hardware.device_bytes) + 2 * embedding
    assert engine_gpu.total <= hardware.usable_bytes


QWEN3_8B = NAMED_SHAPES["qwen3-8b"]
STAGED_BROADCAST = [
    "runtime.type=local",
    "weight_sync.type=broadcast",
    "controller.mode=async",
    "buffer.async_ratio=1",
    "engine.dtype=bfloat16",
    "trainer.num_workers=8",
    "rollout.num_engines=8",
]


def _host(overrides: list[str], shape, hardware: mp.Hardware) -> mp.Device:
    config = load_run_config(None, overrides)
    return mp.host_plan(config, mp.plan(config, shape, 512, hardware), shape, hardware)


def test_a_staged_broadcast_waits_whole_in_each_engines_host_memory_eight_engines_to_a_node() -> None:
    """Staged, every engine (vLLM or built-in) keeps the whole bf16 update in pinned host memory until it
    applies it: Qwen3-8B's 16.4 GB each, 131 GB for the eight engines of a node (the node Ray may fill with
    engines alone: the trainer ranks hold nothing on the host under a broadcast). Streamed, nothing waits."""
    whole = QWEN3_8B.num_params * 2
    assert round(whole / mp.GB, 1) == 16.4
    two_nodes = mp.hardware_named("h100", 16)
    for backend, role in (("vllm", "vLLM engine"), ("builtin", "engine")):
        node = _host([*STAGED_BROADCAST, f"engine.backend={backend}"], QWEN3_8B, two_nodes)
        [(engines, count)] = node.roles
        assert (engines.name, count) == (role, 8)
        assert [(t.name, t.bytes, t.phase) for t in engines.terms] == [("staged update", whole, "sync")]
        assert node.total == 8 * whole and round(node.total / mp.GB) == 131
    sync = [k for k in STAGED_BROADCAST if not k.startswith(("controller", "buffer"))]
    streamed = _host([*sync, "controller.mode=sync", "engine.backend=builtin"], QWEN3_8B, two_nodes)
    assert streamed.roles == () and streamed.total == 0
    one_gpu = mp.hardware_named("h100", 2)  # a node of 2 planned GPUs holds what fits on them
    assert _host([*STAGED_BROADCAST, "engine.backend=vllm"], QWEN3_8B, one_gpu).total == 2 * whole


SWITCHED_TWO_RANKS = [
    "runtime.type=local",
    "controller.mode=sync",
    "trainer.num_workers=2",
    "rollout.num_engines=2",
    "model.dtype=float32",
    "engine.dtype=bfloat16",
    "runtime.switch.enabled=true",
]
"""Two fp32 trainer ranks and two bf16 engines on Ray, under the colocated switch."""


def test_a_colocated_switch_plans_the_offloaded_state_and_the_sleeping_engines_weights_on_the_host() -> None:
    """Under ``runtime.switch`` each rank moves what its settings offload to pinned host memory while its
    engine generates; at sleep level 2 each built-in engine keeps its bf16 weights there while the trainer
    trains, and the two coexist between the engines falling asleep and the trainer reloading."""
    p = QWEN3_1_7B.num_params
    keys = SWITCHED_TWO_RANKS
    h100 = mp.hardware_named("h100", 8)
    node = _host(keys, QWEN3_1_7B, h100)  # defaults: the optimizer offloaded, sleep level 1
    [(ranks, count)] = node.roles
    assert count == 2 and [t.name for t in ranks.terms] == ["offloaded optimizer state"]
    assert node.total == 2 * mp.ceil_div(2 * p * 4, 2)  # each rank's shard of AdamW's two fp32 moments
    more = ["runtime.switch.offload_master_weights=true", "runtime.switch.engine_sleep_level=2"]
    node = _host([*keys, *more], QWEN3_1_7B, h100)
    by_role = {role.name: ({t.name: t.bytes for t in role.terms}, n) for role, n in node.roles}
    assert by_role == {
        "trainer rank": (
            {"offloaded master weights": mp.ceil_div(4 * p, 2), "offloaded optimizer state": 4 * p},
            2,
        ),
        "engine": ({"weights asleep": 2 * p}, 2),
    }
    assert node.total == 2 * (2 * p + 4 * p) + 2 * 2 * p


def test_a_separate_critics_offloaded_state_is_on_the_host_beside_the_policys() -> None:
    """``StateOffloader.for_trainer`` moves a separate critic's optimizer state (and, when asked, its weights
    and gradients) with the policy's: the host plan counts them on each rank, and the GPU they left no longer
    holds them while the engine generates. A value head's (tens of KB) stays on the GPU."""
    p = QWEN3_1_7B.num_params
    body = QWEN3_1_7B.body_params  # a critic without critic.model_path is a copy of the policy's body
    keys = [
        *SWITCHED_TWO_RANKS,
        "advantage.name=gae",
        "critic.type=separate",
    ]
    h100 = mp.hardware_named("h100", 8)
    [(ranks, count)] = _host(keys, QWEN3_1_7B, h100).roles
    offloaded = {t.name: t.bytes for t in ranks.terms}
    assert count == 2 and offloaded == {
        "offloaded optimizer state": mp.ceil_div(2 * p * 4, 2),
        "offloaded critic optimizer state": mp.ceil_div(2 * body * 4, 2),
    }
    config = load_run_config(None, keys)
    *_, generating = mp.plan(config, QWEN3_1_7B, 512, h100).devices
    kept = {t.name for role, _ in generating.roles if role.name.endswith("(offloaded)") for t in role.terms}
    # gradients (the critic's too) are freed after every step: not on the GPU while the engine generates
    assert "critic weights" in kept and not {"critic optimizer state", "critic gradients", "gradients"} & kept
    everything = ["runtime.switch.offload_master_weights=true"]
    [(ranks, _)] = _host([*keys, *everything], QWEN3_1_7B, h100).roles
    critic = {t.name: t.bytes for t in ranks.terms if "critic" in t.name}
    assert critic == {
        "offloaded critic weights": mp.ceil_div(body * 4, 2),
        "offloaded critic optimizer state": mp.ceil_div(2 * body * 4, 2),
    }
    head = [k for k in keys if not k.startswith("critic.")] + ["critic.type=shared_trunk"]
    [(ranks, _)] = _host(head, QWEN3_1_7B, h100).roles
    assert [t.name for t in ranks.terms] == ["offloaded optimizer state"]


def test_a_node_with_too_little_ram_fails_naming_the_largest_host_term(capsys) -> None:
    """``--host-gb`` sets the node's RAM as ``--gpus`` sets the GPU count: eight staged Qwen3-8B updates
    (131 GB) do not fit 100 GB, and the FAIL names the term; the same plan fits a 2 TB DGX node."""
    config = load_run_config(None, [*STAGED_BROADCAST, "engine.backend=vllm", "output_dir=/shared/x"])
    small = mp.hardware_named("h100", 16, host_gb=100)
    [host] = [f for f in diagnose(config, hardware=small, shape=QWEN3_8B) if f.topic == "host memory"]
    assert host.status is Status.FAIL and "131.0 GB" in host.detail and "not counted: " in host.detail
    assert "largest term: vLLM engine's staged update 16.4 GB" in host.fix
    dgx = mp.hardware_named("h100", 16)
    [host] = [f for f in diagnose(config, hardware=dgx, shape=QWEN3_8B) if f.topic == "host memory"]
    assert host.status is Status.OK and "2000.0 GB free" in host.detail
    args = ["doctor", "--hardware", "h100", "--gpus", "16", "--host-gb", "100", "--shape", "qwen3-8b"]
    assert cli.main([*args, *STAGED_BROADCAST, "engine.backend=vllm", "output_dir=/shared/x"]) == 1
    assert (
        "FAIL  host memory: each node's host RAM (0 trainer rank(s) and 8 engine(s)"
        in capsys.readouterr().out
    )


def test_lora_adapters_are_planned_in_float32_as_peft_keeps_them_beside_a_bf16_master() -> None:
    """peft's ``autocast_adapter_dtype`` (on by default, kept by ``attach_lora``) casts bf16 adapters to
    float32, so their gradients and AdamW moments are float32 too. Measured on the trainer's own path: a tiny
    bf16 Qwen2 with LoRA; the plan's adapter, gradient and moment terms and the checkpoint's ``adapter/`` and
    moments are the bytes it holds (planned in the master dtype, they were half)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from asyncrl.sim.model_shape import shape_from_hf_config
    from asyncrl.trainer.trainer import Trainer

    hf = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=96,
        tie_word_embeddings=True,
    )
    config = load_run_config(None, ["model.dtype=bfloat16", "trainer.lora.rank=4"])
    torch.manual_seed(0)
    trainer = Trainer(Qwen2ForCausalLM(hf).to(torch.bfloat16), config.trainer, config.loss, config.advantage)
    adapters = [p for p in trainer.model.parameters() if p.requires_grad]
    assert {p.dtype for p in adapters} == {torch.float32}
    held = sum(p.numel() * p.element_size() for p in adapters)
    for p in adapters:
        p.grad = torch.zeros_like(p)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in adapters)
    trainer.optimizer.step()  # AdamW creates its moments beside the parameters
    moments = sum(
        t.numel() * t.element_size()
        for state in trainer.optimizer.state.values()
        for key, t in state.items()
        if key in ("exp_avg", "exp_avg_sq")
    )
    shape = shape_from_hf_config(hf.to_dict())
    terms = {t.name: t.bytes for t in mp.trainer_role(config, shape).terms}
    assert (terms["LoRA adapters"], terms["gradients"], terms["optimizer state"]) == (held, grads, moments)
    assert terms["master weights"] == 2 * shape.num_params  # the frozen base stays in bf16
    checkpoint = {t.name: t.bytes for t in mp.checkpoint_bytes(config, shape).parts}
    assert checkpoint == {"adapter/": held, "AdamW moments": moments}


@pytest.mark.parametrize(
    ("shape", "status", "idle_gb"),
    [("qwen3-0.6b", Status.WARN, 60.3), ("qwen3-1.7b", Status.FAIL, 60.3), ("qwen3-8b", Status.FAIL, 77.5)],
)
def test_slots_the_kv_budget_never_admits_are_named_with_the_engine_keys(
    shape, status, idle_gb, tmp_path, monkeypatch
) -> None:
    """The 8-GPU recipe on the built-in engine at its defaults: 64 slots of 9,217 positions, but
    engine.max_kv_tokens 65,536 admits 7 requests of at least 8,193 tokens (a 1-token prompt and 8,192 new
    ones), so 57 slots never run one. Doctor WARNs with the count and the bytes they hold, and FAILs where the
    engine refuses the pool (above 90 % of the GPU free beside its weights: 67.65 GB against 67.45 at 1.7B,
    86.98 against 55.81 at 8B); an engine GPU that overflows names the engine's keys, not the trainer's."""
    use_offline_cache(monkeypatch, tmp_path)
    config = load_run_config(RECIPES / "dapo_math_8gpu.yaml", ["engine.backend=builtin"])
    findings = diagnose(config, hardware=mp.hardware_named("h100", 8), shape=NAMED_SHAPES[shape])
    [slots] = [f for f in findings if "built-in engine's KV pool" in f.detail]
    assert slots.status is status, slots.line()
    assert "64 slots × 9217 positions" in slots.detail and "admits at most 7 at once" in slots.detail
    idle = f"the 57 slots above it never run a request and hold {idle_gb} GB"
    assert slots.fix.startswith(f"set engine.max_running_requests=7: {idle}")
    engine = [f for f in findings if f.detail.startswith("engine ×4")]
    assert engine and "more trainer.num_workers" not in engine[0].fix
    if shape == "qwen3-8b":  # 16.4 GB of weights beside 87.0 GB of pool: the engine's own line fails too
        assert engine[0].status is Status.FAIL and "lower engine.max_running_requests" in engine[0].fix
    fixed = load_run_config(
        RECIPES / "dapo_math_8gpu.yaml", ["engine.backend=builtin", "engine.max_running_requests=7"]
    )
    ok = diagnose(fixed, hardware=mp.hardware_named("h100", 8), shape=NAMED_SHAPES[shape])
    [line] = [f for f in ok if "built-in engine's KV pool" in f.detail]
    assert line.status is Status.OK and not [f for f in ok if f.status is Status.FAIL]
