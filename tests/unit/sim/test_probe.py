"""The calibration kit: its static decode step is the model's own arithmetic, its grid and memory plans are
exact, and the whole quick run measures every section on a CPU."""

from __future__ import annotations

import json

import torch

from asyncrl.cli.main import main
from asyncrl.engine.static_decode import StaticDecode as EngineStaticDecode
from asyncrl.engine.static_decode import WakeCounts
from asyncrl.sim.model_shape import NAMED_SHAPES
from asyncrl.sim.probe import (
    TINY_SHAPE,
    StaticDecode,
    build_model,
    decode_grid,
    decode_path,
    quick_plan,
    train_layers,
)


def test_static_decode_step_gives_the_models_own_next_token_logits():
    model = build_model(TINY_SHAPE, device=torch.device("cpu"), dtype=torch.float32)
    prompt = torch.tensor([[5, 17, 42, 9, 101, 77, 3, 250]])
    with torch.no_grad():
        past = model(input_ids=prompt[:, :-1], use_cache=True).past_key_values
        expected = model(input_ids=prompt).logits[:, -1]
    decode = StaticDecode(model, batch=1, kv_len=prompt.shape[1])
    for index, layer in enumerate(past.layers):
        decode.keys[index][:, :, :-1] = layer.keys
        decode.values[index][:, :, :-1] = layer.values
    decode.ids[:] = prompt[:, -1:]
    decode.step()
    torch.testing.assert_close(decode.logits, expected, rtol=1e-5, atol=1e-5)
    assert decode.ids.item() == int(expected.argmax())


def test_decode_grid_keeps_the_kv_lengths_whose_cache_fits():
    plan = quick_plan()  # float32: 4 bytes; tiny: 2 layers x 2 kv heads x 16 dims x 2 = 256 B per token
    per_token = TINY_SHAPE.kv_bytes_per_token(4)
    assert per_token == 512
    budget = 4 * 65 * per_token  # batch 4 fits kv_len 64 (65 positions with the scratch one), batch 1 both
    assert decode_grid(plan, TINY_SHAPE, budget) == {1: [16, 64], 4: [16, 64]}
    assert decode_grid(plan, TINY_SHAPE, budget - 1) == {1: [16, 64], 4: [16]}
    assert decode_grid(plan, TINY_SHAPE, 16 * per_token) == {1: [], 4: []}


def test_train_layers_cut_a_model_that_would_not_fit_and_keep_one_that_does():
    plan = quick_plan()
    eight_b = NAMED_SHAPES["qwen3-8b"]
    h200_free = 139 << 30
    assert train_layers(TINY_SHAPE, plan, h200_free) == TINY_SHAPE.num_layers
    assert train_layers(eight_b, plan, None) == eight_b.num_layers
    cut = train_layers(eight_b, plan, 8 << 30)  # 8 GiB: the embeddings alone take most of it
    assert 1 <= cut < eight_b.num_layers


def test_quick_calibration_measures_every_section(tmp_path):
    out = tmp_path / "probe.json"
    assert main(["calibrate", "--quick", "--device", "cpu", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["not_measured"] == []
    assert record["gemm"] and record["bandwidth"]["read"]["bytes_per_s"] > 0
    (model,) = record["models"]
    for key in ("decode_engine", "decode_static", "engine_step", "prefill"):
        assert model[key] and all(point["median_s"] > 0 for point in model[key]), key
    assert all(point["decode_path"] == {"path": "dynamic", "captures": 0} for point in model["engine_step"])
    assert len(model["decode_engine"]) == len(quick_plan().batches) * len(quick_plan().kv_lengths)
    assert model["train"]["layers_measured"] == TINY_SHAPE.num_layers
    assert model["train"]["step"]["tokens_per_s"] > 0


def test_a_spent_budget_records_every_section_as_not_measured(tmp_path):
    out = tmp_path / "probe.json"
    assert main(["calibrate", "--quick", "--device", "cpu", "--budget-s", "0", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["not_measured"][0].startswith("gemm: skipped")
    assert any("tiny: build" in line for line in record["not_measured"])


def test_decode_path_says_how_steps_ran_and_what_their_captures_cost():
    static = EngineStaticDecode(
        lambda inputs, groups: None,
        num_slots=2,
        max_len=64,
        device=torch.device("cpu"),
        capture=False,
        fingerprint=tuple,
    )
    assert decode_path(None) == {"path": "dynamic", "captures": 0}
    assert decode_path(static) == {"path": "static shapes, eager", "captures": 0}
    static.capture = True  # as a CUDA run leaves it
    static.total = WakeCounts(captures=3, capture_s=0.25, eager_steps=7)
    captured = decode_path(static)
    assert captured["path"] == "static shapes, CUDA graphs"
    assert (captured["captures"], captured["capture_s"], captured["capture_error"]) == (3, 0.25, None)
    assert captured["steps_eager"] == 7
    static.eager_shapes.add((4, ((0, 4, 64),)))  # its capture ran out of memory
    assert decode_path(static)["shapes_eager_after_oom"] == 1
    static.capture_error = "RuntimeError: not permitted"
    assert decode_path(static)["path"] == "static shapes, eager after a failed capture"
