"""LossConfig / MismatchConfig / KLConfig validation: every error names the key and the valid values."""

import pytest

from asyncrl.config.algorithm import (
    LOSS_NAMES,
    LOSS_PARAM_TYPES,
    CISPOParams,
    ClipParams,
    DecoupledPPOParams,
    KLConfig,
    LossConfig,
    MismatchConfig,
    TISParams,
    TOPRParams,
)
from asyncrl.config.base import ConfigError, from_dict, to_dict
from asyncrl.trainer.losses import LOSS_REGISTRY


def test_loss_literal_param_table_and_registry_agree():
    assert set(LOSS_NAMES) == set(LOSS_REGISTRY) == set(LOSS_PARAM_TYPES)


def test_unknown_loss_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"loss.name must be one of 'ppo', 'grpo', 'decoupled_ppo'"):
        LossConfig(name="a2c")


def test_parameters_of_another_loss_are_rejected_not_ignored():
    with pytest.raises(ValueError, match="loss.tis is set but loss.name is 'ppo'; only loss.ppo"):
        LossConfig(name="ppo", tis=TISParams(cap=3.0))
    with pytest.raises(ValueError, match="loss.ppo is set but loss.name is 'reinforce'"):
        LossConfig(name="reinforce", ppo=ClipParams())


def test_section_of_wrong_type_is_rejected():
    with pytest.raises(ValueError, match="loss.tis must be a TISParams"):
        LossConfig(name="tis", tis=ClipParams())


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ppo", ClipParams()),
        ("decoupled_ppo", DecoupledPPOParams()),
        ("tis", TISParams()),
        ("cispo", CISPOParams()),
        ("topr", TOPRParams()),
        ("reinforce", None),
    ],
)
def test_chosen_section_is_filled_with_defaults(name, expected):
    assert LossConfig(name=name).params == expected


def test_grpo_requires_a_kl_term():
    with pytest.raises(ValueError, match="loss.kl.beta must be > 0 for loss.name='grpo'"):
        LossConfig(name="grpo")
    assert LossConfig(name="grpo", kl=KLConfig(beta=0.04)).needs_reference


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ppo": ClipParams(eps_low=1.0)}, r"loss.ppo.eps_low must be in \(0, 1\)"),
        ({"ppo": ClipParams(eps_high=0.0)}, "loss.ppo.eps_high must be > 0"),
        ({"ppo": ClipParams(dual_clip=1.0)}, "loss.ppo.dual_clip must be > 1"),
        ({"aggregation": "sum"}, "loss.aggregation must be one of 'token-mean'"),
        ({"norm_length": 100}, "loss.norm_length applies only to loss.aggregation='seq-mean-token-sum-norm'"),
        ({"aggregation": "seq-mean-token-sum-norm", "norm_length": 0}, "loss.norm_length must be >= 1"),
    ],
)
def test_invalid_values_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LossConfig(**kwargs)


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (
            lambda: LossConfig(name="decoupled_ppo", decoupled_ppo=DecoupledPPOParams(proximal="exact")),
            "'recompute', 'loglinear'",
        ),
        (lambda: LossConfig(name="tis", tis=TISParams(cap=0.0)), "loss.tis.cap must be > 0"),
        (
            lambda: LossConfig(name="cispo", cispo=CISPOParams(eps_low=1.5)),
            r"loss.cispo.eps_low must be in \[0, 1\]",
        ),
        (
            lambda: LossConfig(name="topr", topr=TOPRParams(negative_weight=-1.0)),
            "loss.topr.negative_weight must be >= 0",
        ),
        (lambda: KLConfig(estimator="k4"), "loss.kl.estimator must be one of 'k1', 'k2', 'k3'"),
        (lambda: KLConfig(beta=-0.1), "loss.kl.beta must be >= 0"),
    ],
)
def test_invalid_section_values_name_the_key(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


def test_mismatch_fills_only_the_parameters_of_its_mode():
    truncate = MismatchConfig()
    assert (truncate.cap, truncate.low, truncate.high) == (2.0, None, None)
    mask = MismatchConfig(mode="mask", granularity="geometric")
    assert (mask.cap, mask.low, mask.high) == (None, 0.5, 2.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"mode": "truncate", "low": 0.5},
            "loss.mismatch.low applies only to loss.mismatch.mode 'mask' or 'reject'",
        ),
        ({"mode": "mask", "cap": 2.0}, "loss.mismatch.cap applies only to loss.mismatch.mode='truncate'"),
        ({"mode": "mask", "low": 1.2}, "0 <= low < 1 < high"),
        ({"granularity": "batch"}, "'token', 'sequence', 'geometric'"),
        ({"mode": "clip"}, "'truncate', 'mask'"),
        ({"cap": -1.0}, "loss.mismatch.cap must be > 0"),
    ],
)
def test_mismatch_rejects_parameters_outside_its_mode(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MismatchConfig(**kwargs)


def test_needs_flags_tell_the_trainer_which_inputs_to_compute():
    assert LossConfig(name="decoupled_ppo").needs_proximal_forward
    loglinear = LossConfig(name="decoupled_ppo", decoupled_ppo=DecoupledPPOParams(proximal="loglinear"))
    assert not loglinear.needs_proximal_forward
    assert not LossConfig().needs_reference and not LossConfig().needs_train_behaviour
    assert LossConfig(mismatch=MismatchConfig()).needs_train_behaviour


def test_loglinear_proximal_cannot_combine_with_mismatch_correction():
    with pytest.raises(ValueError, match="use loss.decoupled_ppo.proximal='recompute'"):
        LossConfig(
            name="decoupled_ppo",
            decoupled_ppo=DecoupledPPOParams(proximal="loglinear"),
            mismatch=MismatchConfig(),
        )


def test_loss_config_round_trips_through_the_generic_loader():
    data = {"name": "tis", "tis": {"cap": 3}, "mismatch": {"mode": "mask", "granularity": "geometric"}}
    config = from_dict(LossConfig, data, "loss")
    assert config.params == TISParams(cap=3.0) and config.mismatch.low == 0.5
    assert from_dict(LossConfig, to_dict(config), "loss") == config
    with pytest.raises(ConfigError, match="loss.tis.cap"):
        from_dict(LossConfig, {"name": "tis", "tis": {"capp": 3}}, "loss")
