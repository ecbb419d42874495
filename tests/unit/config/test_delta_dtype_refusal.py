"""``weight_sync.type=delta`` with a serving dtype apart from the master dtype: accepted where the trainer and
the built-in engines resolve ``engine.dtype`` alike (``test_delta_run`` runs float32 into bfloat16 bit for bit),
refused at config time, naming the fields, where ``auto`` would resolve to bfloat16 on the trainer's GPU and to
``model.dtype`` on engines without one (a delta is patched in byte for byte)."""

from __future__ import annotations

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.run import load_run_config

DELTA = ["runtime.type=local", "weight_sync.type=delta", "model.dtype=float32"]
SPLIT = ["runtime.accelerators_per_trainer_worker=1", "runtime.accelerators_per_engine=0"]


def test_a_trainer_on_a_gpu_and_engines_without_one_are_refused_naming_the_fields():
    with pytest.raises(
        ConfigError, match=r"engine\.dtype=auto.*accelerators_per_engine=0.*set engine\.dtype"
    ):
        load_run_config(None, ["output_dir=/tmp/x", *DELTA, *SPLIT])


@pytest.mark.parametrize(
    "fix",
    [
        ["engine.dtype=bfloat16"],  # both sides serve what was set
        ["model.dtype=bfloat16"],  # auto resolves to bfloat16 on either side
        ["weight_sync.type=object_store"],  # the engine casts while copying
        ["runtime.accelerators_per_engine=1"],  # both on GPUs
        ["runtime.accelerator_resource=fake_gpu"],  # stand-in GPUs: every side on the CPU
    ],
)
def test_what_resolves_alike_is_accepted(fix):
    config = load_run_config(None, ["output_dir=/tmp/x", *DELTA, *SPLIT, *fix])
    assert config.weight_sync.type in ("delta", "object_store")


def test_inline_float32_into_a_bfloat16_engine_is_accepted():
    overrides = [
        "output_dir=/tmp/x",
        "weight_sync.type=delta",
        "model.dtype=float32",
        "engine.dtype=bfloat16",
    ]
    assert load_run_config(None, overrides).engine.dtype == "bfloat16"
