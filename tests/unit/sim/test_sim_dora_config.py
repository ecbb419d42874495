"""The DORA-size example (asyncrl/examples/sim/dora_qwen25_32b.yaml) states the workload issue 48 names."""

from __future__ import annotations

from pathlib import Path

from asyncrl.sim.derive import load_sim_config

DORA = Path(__file__).parents[3] / "asyncrl" / "examples" / "sim" / "dora_qwen25_32b.yaml"


def test_the_dora_example_is_qwen25_32b_on_64_h800s_at_512_by_16() -> None:
    config = load_sim_config(str(DORA), [])
    assert (config.model, config.hardware) == ("qwen2.5-32b", "h800")
    gpus = config.rollout.num_engines * config.engine.gpus_per_engine + config.trainer.num_gpus
    assert gpus == 64
    assert (config.rollout.rollout_batch_size, config.rollout.num_return_sequences) == (512, 16)
    assert (config.lengths.mean, config.rollout.max_new_tokens) == (2400.0, 30000)
    assert config.controller.mode == "multi_version"
    wider = load_sim_config(str(DORA), ["trainer.num_gpus=64", "rollout.num_engines=16"])  # the 128-GPU run
    assert wider.rollout.num_engines * wider.engine.gpus_per_engine + wider.trainer.num_gpus == 128
