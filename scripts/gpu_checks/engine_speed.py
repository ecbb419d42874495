"""GPU kit section: the built-in engine's decode step at Qwen3 0.6B / 1.7B / 4B shapes, beside the probe's
static CUDA-graph loop and HF generate, and its greedy exactness on the device.

Usage: ``python scripts/gpu_checks/engine_speed.py --device {cpu,cuda} --out DIR``

- ``--device cuda``: random-initialised models at the shape table's sizes (``asyncrl.sim.model_shape``, bfloat16;
  nothing is downloaded). Per shape: whole ``LLMEngine.step()`` calls in decode at batch 1 / 16 / 64 / 256
  (``engine.decode_graphs: on``: captured static shapes, and ``off`` at batch 64 for the eager path),
  the probe's static CUDA-graph loop at the same batches over a KV length of 256 (the engine's bucket for these
  contexts), and tokens per second of the engine against HF ``generate`` at batch 64.
  Each engine-step point says how its decode ran (``decode_path``: CUDA graphs, with how many were captured,
  their capture seconds and any capture error that turned capturing off).
- The long-tailed mix (``bench/engine.py --part decode_attention``'s ``tail``: 64 rows, one at 2,000 positions
  and 63 at ~100; for the 0.6B and 1.7B shapes): the decode step at captured static shapes with each row over
  its own length bucket against every row over the longest, the KV positions each reads, the SDPA kernels one
  eager step of each dispatched to (aten op names under the profiler: flash, memory-efficient, cuDNN or math),
  and the graphs captured for it; and the SDPA kernels one prefill chunk as long as the longest row dispatched
  to (``model_runner.grouped_attention``: the memory-efficient kernel expected, read from torch's kernel
  selection before any GPU ran it).
- Captures per wake (the 0.6B shape): the shipped capture policy (``engine.decode_graph_min_uses``) over a
  rollout of more requests than slots with long-tailed lengths, twice, with a sleep and a wake between (what
  ``runtime.switch`` does every step, dropping the graphs): per wake, the graphs captured and their seconds,
  the steps run eagerly before their shape's capture (and at how many shapes), the steps replayed, and the
  rollout's wall seconds. What the simulator's ``recapture`` term of the switch models, measured.
- ``--device cpu``: the same sections at the probe's tiny shape (the mix at 8 rows, 200 and ~20 positions, its
  static shapes eager), a twin that runs in well under a minute.

Exactness (both devices, fp32; on CUDA each static shape's first step eager and the later ones captured,
``engine.decode_graph_min_uses: 2``, so the checks cross that transition): greedy tokens of the engine at static
shapes equal HF ``generate`` for the two tiny test families (and a 2-layer Qwen3-0.6B-shaped model on CUDA),
their log-probs within 1e-3 of a full HF forward, and a seeded sampled batch gives the same tokens run to run. These are PASS/FAIL lines and set the
exit status. The issue's speed targets (engine step ≤ 1.3× the static loop at batch ≥ 16 and ≤ 2× at batch 1
for 0.6B and 1.7B; ≥ 3× HF generate's tokens/s at batch 64) are TARGET lines: met or missed, recorded in the
result JSON, not a failure of the kit (a missed target is a measurement to act on, not a broken check).

Writes ``DIR/engine_speed.json`` after the exactness checks and again after each shape (``"complete": false``
until the end), so a run killed by the kit's section limit keeps every shape it finished. Shapes run under one
time budget (``--budget-s``: no shape starts after it; the kit passes 2/3 of the section's limit, leaving the
last shape started the rest); what the budget cannot hold is written down as not measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python scripts/gpu_checks/engine_speed.py` puts its own folder first on sys.path: make the checkout the import
# root (the kit's PYTHONPATH does too), so `bench` imports as it does for the benchmarks
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from asyncrl.config.engine import EngineConfig  # noqa: E402
from asyncrl.engine.llm_engine import LLMEngine  # noqa: E402
from asyncrl.engine.model_runner import ModelRunner  # noqa: E402
from asyncrl.engine.scheduler import Chunk  # noqa: E402
from asyncrl.engine.sequence import Sequence  # noqa: E402
from asyncrl.sim.model_shape import NAMED_SHAPES, ModelShape  # noqa: E402
from asyncrl.sim.probe import (  # noqa: E402
    TINY_SHAPE,
    ProbePlan,
    build_model,
    decode_path,
    decode_static,
    describe_device,
    engine_steps,
    hf_config,
)
from asyncrl.testing.models import tiny_llama, tiny_qwen2  # noqa: E402
from asyncrl.types import Request, SamplingParams  # noqa: E402
from bench.engine import (  # noqa: E402
    PLANS,
    attention_runner,
    context_mix,
    decode_step,
    sdpa_ops,
    time_decode,
)

CUDA_SHAPES = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b")
TARGET_SHAPES = ("qwen3-0.6b", "qwen3-1.7b")
"""Shapes the issue's step-time targets name."""


def settings(device: str) -> dict[str, Any]:
    """Shapes and sizes per device: the real ones on CUDA, a tiny twin on CPU."""
    if device == "cuda":
        return {
            "shapes": [NAMED_SHAPES[name] for name in CUDA_SHAPES],
            "dtype": "bfloat16",
            "batches": (1, 16, 64, 256),
            "prompt": 128,
            "new": 48,
            "static_kv": 256,
            "hf_batch": 64,
            "repeats": 10,
            "exact_new_tokens": 24,
            "mix": {"shapes": TARGET_SHAPES, "rows": 64, "long": 2000, "short": 100, "max_len": 2048},
            "wakes": {"shapes": CUDA_SHAPES[:1], "slots": 16, "requests": 32, "prompt": 128, "new": 64},
        }
    return {
        "shapes": [TINY_SHAPE],
        "dtype": "float32",
        "batches": (1, 8),
        "prompt": 16,
        "new": 8,
        "static_kv": 64,
        "hf_batch": 8,
        "repeats": 4,
        "exact_new_tokens": 12,
        "mix": {"shapes": (TINY_SHAPE.name,), "rows": 8, "long": 200, "short": 20, "max_len": 256},
        "wakes": {"shapes": (TINY_SHAPE.name,), "slots": 4, "requests": 10, "prompt": 16, "new": 12},
    }


def step_plan(shape: ModelShape, s: dict[str, Any], batches: tuple[int, ...], graphs: str) -> ProbePlan:
    return ProbePlan(
        models=(shape,),
        dtype=s["dtype"],
        batches=batches,
        kv_lengths=(s["static_kv"],),
        engine_step_batches=batches,
        engine_step_prompt_tokens=s["prompt"],
        engine_step_new_tokens=s["new"],
        engine_decode_graphs=graphs,
        warmup=2,
        repeats=s["repeats"],
    )


def _medians(points: list[dict[str, Any]]) -> dict[int, float]:
    return {p["batch"]: p["median_s"] for p in points if "median_s" in p}


@torch.inference_mode()
def tokens_per_second(model: torch.nn.Module, s: dict[str, Any]) -> dict[str, float]:
    """Engine and HF ``generate`` over the same ``hf_batch`` random prompts, greedy, ``new`` tokens each; the
    second run of each is timed (the first captures graphs / warms kernels)."""
    device = next(model.parameters()).device
    batch, prompt, new = s["hf_batch"], s["prompt"], s["new"]
    ids = torch.randint(
        1, model.config.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(0)
    )
    config = EngineConfig(
        max_running_requests=batch,
        max_kv_tokens=batch * (prompt + new),
        max_prefill_tokens_per_step=batch * prompt,
        max_model_len=prompt + new,
    )
    engine = LLMEngine(model, config=config)
    sampling = SamplingParams(temperature=0, max_new_tokens=new, ignore_eos=True)

    def run_engine() -> None:
        for index, row in enumerate(ids.tolist()):
            engine.add_request(Request(request_id=str(index), prompt_token_ids=row, sampling=sampling))
        while engine.has_work():
            engine.step()

    def run_hf() -> None:
        on_device = ids.to(device)
        model.generate(
            on_device,
            attention_mask=torch.ones_like(on_device),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )

    out = {}
    for name, fn in (("engine", run_engine), ("hf_generate", run_hf)):
        fn()
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        out[f"{name}_tokens_per_s"] = batch * new / (time.perf_counter() - start)
    out["engine_over_hf"] = out["engine_tokens_per_s"] / out["hf_generate_tokens_per_s"]
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_shape(shape: ModelShape, s: dict[str, Any], device: torch.device) -> dict[str, Any]:
    model = build_model(shape, device=device, dtype=getattr(torch, s["dtype"]))
    record: dict[str, Any] = {"shape": shape.name, "dtype": s["dtype"]}
    record["engine_step"] = engine_steps(model, step_plan(shape, s, s["batches"], "on"))
    mid = (s["hf_batch"],)
    record["engine_step_eager"] = engine_steps(model, step_plan(shape, s, mid, "off"))
    record["static_loop"] = decode_static(model, shape, step_plan(shape, s, s["batches"], "auto"))
    engine, static = _medians(record["engine_step"]), _medians(record["static_loop"])
    record["engine_over_static"] = {b: engine[b] / static[b] for b in engine if b in static}
    record["tokens_per_s"] = tokens_per_second(model, s)
    if shape.name in s["mix"]["shapes"]:
        try:  # caught here, so a crash in the mix keeps the shape's other figures
            record["long_tail_mix"] = long_tail_mix(model, s)
        except Exception:
            record["long_tail_mix"] = {"error": traceback.format_exc()}
    if shape.name in s["wakes"]["shapes"]:
        try:
            record["captures_per_wake"] = captures_per_wake(model, s)
        except Exception:
            record["captures_per_wake"] = [{"error": traceback.format_exc()}]
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return record


def long_tail_mix(model: torch.nn.Module, s: dict[str, Any]) -> dict[str, Any]:
    """The decode step at the long-tailed mix, at static shapes (``decode_graphs: on``: captured on CUDA), each
    row over its own length bucket (the engine's plan) against every row over the longest (the plan before it):
    step times (median of ``repeats`` after 2 untimed steps, which capture), KV positions read per layer, the
    SDPA kernels one eager step of each plan dispatched to, and the graphs captured for the two."""
    m = s["mix"]
    runner = attention_runner(model, m["rows"], m["max_len"], decode_graphs="on")
    rope = context_mix("tail", m["rows"], m["long"], m["short"])
    tokens = [3 + row for row in range(m["rows"])]
    record: dict[str, Any] = {
        "rows": m["rows"],
        "long": max(rope),
        "short_median": sorted(rope)[len(rope) // 2],
    }
    for plan in PLANS:
        record[plan] = time_decode(runner, tokens, rope, plan, s["repeats"], 2)
        record[plan]["sdpa_ops"] = sdpa_ops(lambda p=plan: decode_step(runner, tokens, rope, p, eager=True))
    record["longest_over_bucketed"] = record["longest"]["step_ms"] / record["bucketed"]["step_ms"]
    record["decode_path"] = decode_path(runner.static)
    record["prefill_sdpa_ops"] = prefill_sdpa_ops(runner, m["long"])
    return record  # the runner's KV pool goes with it, freed with the model by measure_shape


@torch.inference_mode()
def captures_per_wake(model: torch.nn.Module, s: dict[str, Any]) -> list[dict[str, Any]]:
    """Two rollouts of ``requests`` greedy requests on ``slots`` slots (finished rows refilled at once), output
    lengths from 1/49 of ``new`` to all of it, with a sleep (level 1) and a wake after each: per wake, the
    engine's ``decode_wake_*`` stats read while it sleeps, and the rollout's wall seconds."""
    w = s["wakes"]
    device = next(model.parameters()).device
    config = EngineConfig(
        max_running_requests=w["slots"],
        max_kv_tokens=w["slots"] * (w["prompt"] + w["new"]),
        max_model_len=w["prompt"] + w["new"],
        decode_graphs="on",
    )
    engine = LLMEngine(model, config=config)
    ids = torch.randint(
        1, model.config.vocab_size, (w["prompt"],), generator=torch.Generator().manual_seed(1)
    )
    wakes = []
    for wake in range(2):
        started = time.perf_counter()
        for index in range(w["requests"]):
            new = max(1, w["new"] * (index % 7 + 1) ** 2 // 49)
            sampling = SamplingParams(temperature=0, max_new_tokens=new, ignore_eos=True)
            engine.add_request(
                Request(request_id=f"{wake}-{index}", prompt_token_ids=ids.tolist(), sampling=sampling)
            )
        while engine.has_work():
            engine.step()
        _sync(device)
        seconds = time.perf_counter() - started
        engine.sleep(1)
        stats = engine.stats()
        wakes.append(
            {key.removeprefix("decode_wake_"): stats[key] for key in stats if key.startswith("decode_wake_")}
            | {"rollout_s": seconds, "min_uses": config.decode_graph_min_uses}
        )
        engine.wake()
    return wakes


def prefill_sdpa_ops(runner: ModelRunner, tokens: int) -> dict[str, int]:
    """The SDPA kernels one prefill chunk of ``tokens`` tokens in slot 0 dispatched to, as ``ModelRunner.run``
    prefills it (its KV overwrites slot 0's: run after the decode timings)."""
    request = Request(request_id="prefill", prompt_token_ids=[3] * tokens, sampling=SamplingParams())
    seq = Sequence.from_request(request, 0)
    seq.slot = 0
    return sdpa_ops(lambda: runner.run([], [Chunk(seq, 0, tokens)], 1))


def targets(shapes: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    """The issue's step-time and throughput targets, met or missed, per measured shape."""
    out = []
    for record in shapes:
        if "engine_over_static" not in record:
            continue
        name = record["shape"]
        if name in TARGET_SHAPES:
            for batch, ratio in record["engine_over_static"].items():
                bound = 2.0 if batch == 1 else 1.3
                out.append(
                    (
                        f"{name} batch {batch}: engine step {ratio:.2f}x the static loop (<= {bound})",
                        ratio <= bound,
                    )
                )
        speedup = record["tokens_per_s"]["engine_over_hf"]
        out.append((f"{name}: engine {speedup:.2f}x HF generate tokens/s (>= 3)", speedup >= 3))
    return out


def qwen3_small(device: torch.device) -> torch.nn.Module:
    """2 layers of the Qwen3-0.6B shape in fp32, with weights wide enough (std 0.1) that greedy picks are
    not near-ties decided by rounding."""
    import transformers

    config = hf_config(NAMED_SHAPES["qwen3-0.6b"], num_layers=2)
    config.initializer_range = 0.1
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.eval()


@torch.inference_mode()
def exactness(device: torch.device, new: int) -> list[tuple[str, bool, str]]:
    """(check, passed, detail) for each family: greedy == HF generate, log-probs, seeded reproducibility."""
    models = [("tiny-qwen2", tiny_qwen2()), ("tiny-llama", tiny_llama())]
    if device.type == "cuda":
        models.append(("qwen3-0.6b-2layer", qwen3_small(device)))
    prompts = [[(5 * i + j) % 200 + 3 for j in range(length)] for i, length in enumerate((7, 2, 40, 65, 13))]
    results = []
    for name, model in models:
        model = model.to(device)
        config = EngineConfig(  # each shape's first step eager, then captured: both sides of the transition
            max_running_requests=8,
            max_kv_tokens=4096,
            max_model_len=128,
            dtype="float32",
            decode_graphs="on",
            decode_graph_min_uses=2,
        )
        engine = LLMEngine(model, config=config)
        greedy = SamplingParams(temperature=0, max_new_tokens=new, ignore_eos=True)
        out = _generate(engine, prompts, greedy)
        worst, mismatched = 0.0, []
        for index, prompt in enumerate(prompts):
            expected = model.generate(
                torch.tensor([prompt], device=device),
                max_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
            )[0, len(prompt) :].tolist()
            if out[index][0] != expected:
                mismatched.append(index)
            worst = max(worst, _logprob_error(model, prompt, *out[index]))
        results.append(
            (f"{name}: greedy tokens == HF generate", not mismatched, f"mismatched prompts {mismatched}")
        )
        results.append(
            (f"{name}: greedy log-probs within 1e-3 of HF", worst <= 1e-3, f"max error {worst:.2e}")
        )
        sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_new_tokens=new, ignore_eos=True)
        first, second = _generate(engine, prompts, sampled), _generate(engine, prompts, sampled)
        same = [a[0] for a in first] == [b[0] for b in second]
        results.append((f"{name}: seeded sampling reproducible run to run", same, ""))
        if device.type == "cuda":  # a failed capture falls back to eager static shapes with a warning
            static = engine.runner.static
            captured = static is not None and static.capture_error is None and bool(static.graphs)
            error = "" if static is None else (static.capture_error or "")
            results.append((f"{name}: decode steps replayed from CUDA graphs", captured, error))
    return results


def _generate(
    engine: LLMEngine, prompts: list[list[int]], sampling: SamplingParams
) -> list[tuple[list[int], list[float]]]:
    for index, prompt in enumerate(prompts):
        engine.add_request(Request(request_id=str(index), prompt_token_ids=prompt, sampling=sampling))
    finished = {}
    while engine.has_work():
        finished.update({g.request_id: g for g in engine.step()})
    return [(finished[str(i)].token_ids, finished[str(i)].logprobs) for i in range(len(prompts))]


def _logprob_error(
    model: torch.nn.Module, prompt: list[int], tokens: list[int], logprobs: list[float]
) -> float:
    device = next(model.parameters()).device
    logits = model(torch.tensor([prompt + tokens], device=device)).logits[0].float()
    reference = torch.log_softmax(logits, dim=-1)
    rows = torch.arange(len(tokens), device=device) + len(prompt) - 1
    expected = reference[rows, torch.tensor(tokens, device=device)]
    return float((expected - torch.tensor(logprobs, device=device)).abs().max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--budget-s",
        type=float,
        default=110.0,
        help="start no further shape after this many seconds (the kit passes 2/3 of the section's limit)",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("FAIL engine-speed: --device cuda but torch sees no CUDA device")
        return 1
    device = torch.device(args.device)
    if device.type == "cpu":  # a rehearsal of the kit: one thread keeps it quick on a shared, loaded host
        torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    s = settings(args.device)
    result: dict[str, Any] = {"device": describe_device(device), "settings": _jsonable(s), "shapes": []}
    failed = False
    checks = []
    try:
        checks = exactness(device, s["exact_new_tokens"])
    except Exception:  # a crash is a failed check, written down with the rest
        failed = True
        result["exactness_error"] = traceback.format_exc()
        print(f"FAIL exactness: crashed\n{result['exactness_error']}")
    for check, passed, detail in checks:
        print(f"{'PASS' if passed else 'FAIL'} {check}" + (f" ({detail})" if detail and not passed else ""))
        failed |= not passed
    result["exactness"] = [{"check": c, "passed": p, "detail": d} for c, p, d in checks]
    path = args.out / "engine_speed.json"
    write_result(path, result, complete=False)
    for shape in s["shapes"]:
        if time.monotonic() > deadline:
            result["shapes"].append({"shape": shape.name, "not_measured": "time budget spent"})
            print(f"NOT MEASURED {shape.name}: time budget spent")
            continue
        started = time.monotonic()
        try:
            record = measure_shape(shape, s, device)
        except Exception:
            failed = True
            record = {"shape": shape.name, "error": traceback.format_exc()}
            print(f"FAIL {shape.name}: crashed\n{record['error']}")
        record["seconds"] = time.monotonic() - started
        result["shapes"].append(record)
        write_result(path, result, complete=False)
        _print_shape(record)
        if "error" in record.get("long_tail_mix", {}):
            failed = True
            print(f"FAIL {shape.name} long-tailed mix: crashed\n{record['long_tail_mix']['error']}")
        failed |= any("error" in wake for wake in record.get("captures_per_wake", []))
    result["targets"] = [{"target": t, "met": m} for t, m in targets(result["shapes"])]
    for entry in result["targets"]:
        print(f"TARGET {'met' if entry['met'] else 'MISSED'}: {entry['target']}")
    write_result(path, result, complete=True)
    print(f"{'FAIL' if failed else 'PASS'} engine-speed ({args.device}): {path}")
    return 1 if failed else 0


def write_result(path: Path, result: dict[str, Any], *, complete: bool) -> None:
    """``result`` as it stands, written whole (a temporary file renamed over ``path``), so a kill mid-write
    never leaves half a file; ``complete`` says whether every section ran."""
    partial = path.with_suffix(".json.tmp")
    partial.write_text(json.dumps(_jsonable(result | {"complete": complete}), indent=1) + "\n")
    partial.replace(path)


def _print_shape(record: dict[str, Any]) -> None:
    if "engine_step" not in record:
        return
    engine, static = _medians(record["engine_step"]), _medians(record["static_loop"])
    eager = _medians(record["engine_step_eager"])
    for batch, seconds in engine.items():
        line = f"  {record['shape']} batch {batch}: engine step {seconds * 1e3:.2f} ms"
        if batch in static:
            line += f", static loop {static[batch] * 1e3:.2f} ms"
        if batch in eager:
            line += f", eager engine step {eager[batch] * 1e3:.2f} ms"
        print(line)
    for point in record["engine_step"]:
        print(
            f"  {record['shape']} batch {point['batch']}: decode {_path_line(point.get('decode_path', {}))}"
        )
    tps = record["tokens_per_s"]
    print(
        f"  {record['shape']}: engine {tps['engine_tokens_per_s']:.0f} tok/s, "
        f"HF generate {tps['hf_generate_tokens_per_s']:.0f} tok/s"
    )
    mix = record.get("long_tail_mix")
    if mix and "error" not in mix:
        print(
            f"  {record['shape']} long-tailed mix ({mix['rows']} rows, one at {mix['long']} positions, the median "
            f"at {mix['short_median']}): decode {_path_line(mix['decode_path'])}"
        )
        for plan in PLANS:
            point = mix[plan]
            ops = ", ".join(f"{name} x{count}" for name, count in point["sdpa_ops"].items()) or "none seen"
            print(
                f"    {plan}: step {point['step_ms']:.2f} ms, {point['kv_positions_per_layer']:.0f} KV positions "
                f"per layer in {point['attention_groups']:.0f} group(s); SDPA ops: {ops}"
            )
        print(f"    longest / bucketed step time: {mix['longest_over_bucketed']:.2f}x")
        ops = ", ".join(f"{name} x{count}" for name, count in mix["prefill_sdpa_ops"].items()) or "none seen"
        print(f"    prefill of {mix['long']} tokens: SDPA ops: {ops}")
    for index, wake in enumerate(record.get("captures_per_wake", [])):
        if "error" in wake:
            print(f"  {record['shape']} captures per wake: crashed\n{wake['error']}")
            continue
        print(
            f"  {record['shape']} wake {index} (min_uses {wake['min_uses']}): {wake['graph_captures']} graphs "
            f"captured in {wake['capture_s']:.2f} s, {wake['eager_steps']} steps eager at "
            f"{wake['eager_step_shapes']} shapes, {wake['graph_replays']} replayed; rollout {wake['rollout_s']:.2f} s"
        )


def _path_line(path: dict[str, Any]) -> str:
    """How a run's decode steps ran, in words: the path, and on CUDA its captures and what they cost."""
    line = path.get("path", "not recorded")
    if "capture_s" in path:
        line += f": {path['captures']} captured in {path['capture_s']:.2f} s"
    if path.get("shapes_eager_after_oom"):
        line += f", {path['shapes_eager_after_oom']} shape(s) eager after running out of memory capturing"
    if path.get("capture_error"):
        line += f" (capturing turned off: {path['capture_error']})"
    return line


def _jsonable(value: Any) -> Any:
    if isinstance(value, ModelShape):
        return value.name
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
