"""GPU kit section: the memory plan (``asyncrl doctor --hardware``) against measured peaks, per role, at the
1-GPU recipe's real shape.

``--device cuda``: ``gsm8k_1gpu.yaml``'s trainer and built-in engine settings (fp32 masters, bf16 compute and
serving, its KV slots and micro-batch budget) on a random-initialised Qwen3-1.7B-shaped model built here
(nothing is downloaded), ≥ 3 RL steps of generate → train → weight sync driven here (no task, no reward
function: prompts are GSM8K-style questions built here, read as their characters' codes modulo the vocabulary,
since a random model reads no text; rewards are set, see ``_groups``). It prints each role's planned peak
beside ``torch.cuda.max_memory_allocated`` of its phase and a step-time breakdown, writes ``memory_plan.json``
under ``--out``, and fails on an OOM or a role outside ±15 % of its plan. Batches are smaller than the
recipe's (fewer prompts, shorter answers) so 3 steps fit the kit's minutes; the memory terms the plan sizes
(weights, KV pool, micro-batch tokens) are the recipe's.

``--device cpu``: the same loop at a tiny shape, in seconds: a rehearsal of the script, not a measurement (on
CPU the plan is checked against the allocator by ``tests/unit/app/test_memory_measured.py``).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

from asyncrl.app import memory_plan as mp
from asyncrl.config.engine import serving_dtype
from asyncrl.config.run import load_run_config
from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.sim.model_shape import NAMED_SHAPES, ModelShape
from asyncrl.trainer.factory import build_trainer
from asyncrl.types import Group, Request, SamplingParams, Trajectory

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "asyncrl" / "examples" / "recipes" / "gsm8k_1gpu.yaml"
TOLERANCE = 0.15
TINY = ModelShape(
    name="tiny-qwen3",
    num_layers=2,
    hidden=128,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    intermediate=384,
    vocab=4096,
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_of(shape: ModelShape, max_len: int, device: torch.device) -> torch.nn.Module:
    """A random-initialised Qwen3 of ``shape`` in fp32 (the trainer's master dtype), built on ``device`` (1.7 B
    parameters initialise in seconds there, in tens of seconds on the host)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        vocab_size=shape.vocab,
        tie_word_embeddings=shape.tied_embeddings,
        max_position_embeddings=max_len,
    )
    torch.manual_seed(0)
    with device:
        return Qwen3ForCausalLM(config)


def gsm8k_rows(count: int) -> list[dict[str, str]]:
    """GSM8K-format problems (a question, a worked answer ending ``#### N``), built here; only the questions'
    lengths and characters reach the engine (as prompt ids)."""
    return [
        {
            "question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
            "answer": f"He has {a} + {b} = {a + b} apples.\n#### {a + b}",
        }
        for a, b in ((3 + i, 5 + 2 * i) for i in range(count))
    ]


class Meter:
    """Allocated bytes and the peak since the last reset: the CUDA allocator's; on CPU nothing is measured."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def allocated(self) -> int:
        return torch.cuda.memory_allocated() if self.cuda else 0

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int:
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("FAIL memory_plan: --device cuda but no CUDA device is visible")
        return 1
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    shape = NAMED_SHAPES["qwen3-1.7b"] if cuda else TINY
    prompts, per_prompt, new_tokens = (8, 8, 256) if cuda else (2, 2, 8)
    overrides = [
        f"model.device={args.device}",
        f"rollout.rollout_batch_size={prompts}",
        f"rollout.num_return_sequences={per_prompt}",
        f"rollout.max_new_tokens={new_tokens}",
        "loss.name=reinforce",
    ]
    if not cuda:  # the tiny twin in fp32 throughout, small slots and micro-batches
        overrides += [
            "trainer.compute_dtype=float32",
            "engine.dtype=float32",
            "engine.max_running_requests=4",
            "engine.max_kv_tokens=512",
            "engine.max_model_len=128",
            "trainer.max_tokens_per_microbatch=64",
        ]
    config = load_run_config(RECIPE, overrides)
    max_len = config.engine.max_model_len or 1536
    rows = gsm8k_rows(prompts * args.steps)

    hardware = mp.Hardware(
        args.device, torch.cuda.get_device_properties(0).total_memory if cuda else 2**34, 1
    )
    plan = mp.plan(config, shape, max_len, hardware, device=args.device)
    trainer_plan, engine_plan = plan.roles
    meter = Meter(device)
    results: dict[str, object] = {"device": args.device, "shape": shape.name, "steps": []}
    try:
        meter.reset()
        model = model_of(shape, max_len, device)
        trainer = build_trainer(config, model, type("Tok", (), {"pad_token_id": 0})())
        held_before_engine = meter.allocated()
        serve_dtype = DTYPES[serving_dtype(config.engine.dtype, config.model.dtype, args.device)]
        engine = LLMEngine(copy.deepcopy(model).to(serve_dtype).eval(), None, config.engine)
        engine_held = meter.allocated() - held_before_engine
        peaks = {"engine": 0, "trainer": 0, "device": 0}
        for step in range(args.steps):
            timing: dict[str, float] = {}
            batch = rows[step * prompts : (step + 1) * prompts]
            meter.reset()
            base = meter.allocated()
            start = time.perf_counter()
            prompt_ids = {
                i: [ord(c) % shape.vocab for c in row["question"]][:64] for i, row in enumerate(batch)
            }
            for i, ids in prompt_ids.items():
                for k in range(per_prompt):
                    engine.add_request(
                        Request(
                            request_id=f"{step}-{i}-{k}",
                            prompt_token_ids=ids,
                            sampling=SamplingParams(max_new_tokens=new_tokens, seed=k),
                        )
                    )
            generations = []
            while engine.has_work():
                generations += engine.step()
            timing["generate_s"] = time.perf_counter() - start
            peaks["engine"] = max(peaks["engine"], engine_held + meter.peak() - base)
            peaks["device"] = max(peaks["device"], meter.peak())
            groups = _groups(generations, prompt_ids, step)
            meter.reset()
            start = time.perf_counter()
            trainer.train_step(groups, policy_version=step)
            timing["train_s"] = time.perf_counter() - start
            peaks["trainer"] = max(peaks["trainer"], meter.peak() - engine_held)
            peaks["device"] = max(peaks["device"], meter.peak())
            meter.reset()
            start = time.perf_counter()
            engine.update_weights(
                [(n, t.to(serve_dtype)) for n, t in trainer.sync_tensors().items()], step + 1
            )
            timing["sync_s"] = time.perf_counter() - start
            peaks["trainer"] = max(peaks["trainer"], meter.peak() - engine_held)
            peaks["device"] = max(peaks["device"], meter.peak())
            timing["tokens"] = sum(len(g.token_ids) for g in generations)
            results["steps"].append(timing)
            print(
                f"step {step}: generate {timing['generate_s']:.1f} s, train {timing['train_s']:.1f} s, "
                f"sync {timing['sync_s']:.2f} s, {timing['tokens']} tokens generated",
                flush=True,
            )
    except torch.OutOfMemoryError as err:
        print(f"FAIL memory_plan: out of memory: {err}")
        (args.out / "memory_plan.json").write_text(json.dumps(results | {"oom": str(err)}, indent=1))
        return 1
    planned = {
        "trainer": trainer_plan.total,
        "engine": engine_plan.total,
        "device": plan.devices[0].total,
    }
    results["roles"] = {
        role: {"planned_bytes": planned[role], "measured_bytes": peaks[role] if cuda else None}
        for role in planned
    }
    results["terms"] = {r.name: [t.__dict__ for t in r.terms] for r in plan.roles}
    (args.out / "memory_plan.json").write_text(json.dumps(results, indent=1))
    failed = False
    for role, planned_bytes in planned.items():
        if not cuda:
            print(f"PASS memory_plan {role}: planned {planned_bytes / 1e9:.3f} GB (CPU twin: not measured)")
            continue
        measured = peaks[role]
        ok = abs(planned_bytes - measured) <= TOLERANCE * measured
        failed |= not ok and role != "device"
        verdict = "PASS" if ok else ("FAIL" if role != "device" else "INFO")
        print(
            f"{verdict} memory_plan {role}: planned {planned_bytes / 1e9:.2f} GB, measured peak "
            f"{measured / 1e9:.2f} GB ({(planned_bytes - measured) / measured:+.0%})"
        )
    return 1 if failed else 0


def _groups(generations, prompt_ids: dict[int, list[int]], step: int) -> list[Group]:
    """Groups of the step's generations with a 0/1 reward: a random model's answers score 0, so every other
    sample is given 1 to leave the advantages non-zero (the memory and time are what is measured)."""
    by_prompt: dict[int, list[Trajectory]] = {}
    for gen in sorted(generations, key=lambda g: g.request_id):
        _, i, k = gen.request_id.split("-")
        prompt = prompt_ids[int(i)]
        response = list(gen.token_ids)
        by_prompt.setdefault(int(i), []).append(
            Trajectory(
                prompt_uid=f"{step}-{i}",
                sample_index=int(k),
                token_ids=prompt + response,
                loss_mask=[0] * len(prompt) + [1] * len(response),
                logprobs=[0.0] * len(prompt) + list(gen.logprobs),
                versions=[-1] * len(prompt) + list(gen.versions),
                start_version=step,
                num_prompt_tokens=len(prompt),
                reward=float(int(k) % 2),
            )
        )
    return [Group(prompt_uid=f"{step}-{i}", trajectories=t) for i, t in by_prompt.items()]


if __name__ == "__main__":
    sys.exit(main())
