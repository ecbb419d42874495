"""One FSDP2 train step over gloo ranks equals the single-process trainer's step on the same batch.

For every loss aggregation mode and the 1x4, 2x2 and 4x1 ranks x micro-batches splits of an 8-sample batch
(every sample 14 tokens long with different loss masks, so the padded token budget fixes the micro-batch
count exactly), and for the losses that read step-start forwards (reference KL, decoupled proximal recompute,
mismatch masking, the OPSM / K3 / M2PO masks, a separate or shared critic) with packing, two mini-batches and
two PPO epochs: gradients, updated weights, loss and gradient norm agree to 1e-5 relative (see the checks for
what relative means), with gradients reduce-scattered every micro-batch (the default) and, for the 2x2 split,
once per mini-batch (``fsdp_grad_accumulation: unsharded``). The compared gradients are checked to be non-zero, so the check can fail.
"""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_fixtures import make_trajectory, random_groups, tiny_qwen2, with_model_logprobs

from asyncrl.config.algorithm import (
    AGGREGATIONS,
    AdvantageConfig,
    DecoupledPPOParams,
    K3RejectionConfig,
    KLConfig,
    LossConfig,
    M2POConfig,
    MismatchConfig,
    OPSMConfig,
)
from asyncrl.config.critic import CriticConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.testing.gradients import stepped_gradients, trained_parameters
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer.batching import plan_micro_batches
from asyncrl.trainer.distributed.parallel import Parallelism, SingleProcess
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import Group

SPLITS = [(1, 4), (2, 2), (4, 1)]
"""(ranks, micro-batches per rank) of the 8-sample batch."""
BUDGET = 28
"""Padded token budget: two 14-token rows per micro-batch."""


def _uniform_length_groups() -> list[Group]:
    """Two groups of four 14-token samples whose prompts (and so loss masks) differ in length."""
    groups = []
    for g in range(2):
        trajectories = []
        for i in range(4):
            prompt_len = 2 + 3 * i + g
            tokens = [(7 * g + 11 * i + k) % 300 for k in range(14)]
            trajectories.append(
                make_trajectory(
                    tokens[:prompt_len], tokens[prompt_len:], reward=float((i + g) % 2), uid=f"g{g}", index=i
                )
            )
        groups.append(Group(prompt_uid=f"g{g}", trajectories=trajectories))
    return groups


def _cases() -> dict[str, tuple[LossConfig, dict, str]]:
    """name -> (loss config, trainer config overrides, batch kind)."""
    cases = {
        f"aggregation={mode}": (
            LossConfig(name="ppo", aggregation=mode),
            {"sequence_packing": False, "max_tokens_per_microbatch": BUDGET},
            "uniform",
        )
        for mode in AGGREGATIONS
    }
    multi_pass = {"num_mini_batches": 2, "ppo_epochs": 2, "max_tokens_per_microbatch": 30}
    cases["grpo-kl"] = (LossConfig(name="grpo", kl=KLConfig(beta=0.1, estimator="k3")), multi_pass, "random")
    cases["decoupled-recompute"] = (
        LossConfig(name="decoupled_ppo", decoupled_ppo=DecoupledPPOParams(proximal="recompute")),
        multi_pass,
        "random",
    )
    cases["mismatch-mask"] = (
        LossConfig(name="ppo", mismatch=MismatchConfig(granularity="token", mode="mask", low=0.5, high=2.0)),
        multi_pass,
        "random",
    )
    cases["offpolicy-masks"] = (  # M2PO's mask is batch-wide: ranks must see every row's log-ratio
        LossConfig(
            name="ppo",
            opsm=OPSMConfig(delta=0.05),
            k3_rejection=K3RejectionConfig(threshold=0.06),
            m2po=M2POConfig(threshold=0.05),
        ),
        multi_pass,
        "random",
    )
    # The critic's values and gradients are sharded too. One optimizer step over micro-batches: after several
    # Adam steps its embedding's rarely-seen rows (gradients near Adam's eps) drift past 1e-5 by rounding alone.
    for kind in ("separate", "shared_trunk"):
        cases[f"critic-{kind}"] = (
            LossConfig(name="ppo"),
            {"max_tokens_per_microbatch": 30, "critic": CriticConfig(type=kind)},
            "random",
        )
    return cases


def _groups(kind: str) -> list[Group]:
    if kind == "uniform":
        return with_model_logprobs(_uniform_length_groups(), tiny_qwen2(), noise=0.3)
    return with_model_logprobs(random_groups(num_groups=2, group_size=4, seed=1), tiny_qwen2(), noise=0.5)


def _step(name: str, parallel: Parallelism) -> tuple[dict, dict, dict] | None:
    """Train one step of case ``name``; on rank 0, (metrics, full gradients, full weights) afterwards."""
    loss_config, overrides, kind = _cases()[name]
    overrides = dict(overrides)
    critic = overrides.pop("critic", None)
    model = tiny_qwen2()
    ref = copy.deepcopy(model) if loss_config.needs_reference else None
    config = TrainerConfig(lr=1e-3, max_grad_norm=None, **overrides)
    advantage = AdvantageConfig(name="gae" if critic else "grpo")
    trainer = Trainer(model, config, loss_config, advantage, ref, parallel=parallel, critic=critic)
    if critic is not None:  # a non-zero head, so the critic's body has a gradient to compare
        for param in trainer.critic.module.parameters():
            if param.ndim == 2 and param.shape[0] == 1:
                with torch.no_grad():
                    param.copy_(_seeded_like(param))
    with stepped_gradients(trainer, _full) as stepped:  # full_tensor is a collective: every rank
        metrics = trainer.train_step(_groups(kind), policy_version=0)
    weights = {name: _full(param.detach()) for name, param in trained_parameters(trainer)}
    return (metrics, stepped[-1], weights) if parallel.rank == 0 else None


def _seeded_like(param: torch.Tensor) -> torch.Tensor:
    """The same values on every rank (and in one process) in ``param``'s layout (a DTensor's local shard)."""
    full = torch.randn(tuple(param.shape), generator=torch.Generator().manual_seed(0)) * 0.1
    if hasattr(param, "full_tensor"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full, param.device_mesh, param.placements)
    return full


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _sharded_steps(names: list[str], grad_accumulation: str = "sharded") -> list:
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    parallel = FullyShardedParallel("cpu", grad_accumulation=grad_accumulation)
    return [_step(name, parallel) for name in names]


def _assert_gradients_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Per tensor, the largest error within 1e-5 of the tensor's largest gradient entry."""
    assert max(float(g.abs().max()) for g in want.values()) > 0, "zero gradient: the check could not fail"
    for name, expected in want.items():
        error = float((got[name] - expected).abs().max()) / max(float(expected.abs().max()), 1e-12)
        assert error <= 1e-5, f"gradient of {name}: relative error {error:.2e}"


def _assert_weights_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """The updated model within 1e-5 of the single-process one, relative to its norm.

    Per element it would be ill-posed: Adam's first step moves each weight by lr * g / (|g| + eps), so an entry
    whose gradient is near eps (1e-8) turns float rounding in g into a visible difference; the gradients above
    are the strict check (and the only one Adam's scale invariance cannot hide).
    """
    error = sum(float((got[n] - w).pow(2).sum()) for n, w in want.items()) ** 0.5
    norm = sum(float(w.pow(2).sum()) for w in want.values()) ** 0.5
    assert error / norm <= 1e-5, f"updated weights: relative error {error / norm:.2e}"


def _check(name: str, sharded: tuple[dict, dict, dict]) -> None:
    metrics, grads, weights = sharded
    want_metrics, want_grads, want_weights = _step(name, SingleProcess())
    _assert_gradients_close(grads, want_grads)
    _assert_weights_close(weights, want_weights)
    assert metrics["loss"] == pytest.approx(want_metrics["loss"], rel=1e-5, abs=1e-7)
    assert metrics["grad_norm"] == pytest.approx(want_metrics["grad_norm"], rel=1e-5)
    assert metrics["num_trained_tokens"] == want_metrics["num_trained_tokens"]
    _assert_metrics_equal(metrics, want_metrics)


TIMINGS = ("train_time_s", "train_tokens_per_s")
"""Metrics of the clock, not of the step's numbers."""


def _assert_metrics_equal(got: dict[str, float], want: dict[str, float]) -> None:
    """Every metric of the step but its timings is the single-process value: statistics of the whole
    mini-batch, whichever rank and micro-batch each row landed in (``policy_loss`` under the sequence means,
    where a token-weighted mean of micro-batch aggregates is not the mini-batch's; ``ratio_min`` where a
    micro-batch with no counted token reported 0)."""
    assert set(got) == set(want)
    differ = {
        key: (got[key], value)
        for key, value in want.items()
        if key not in TIMINGS and got[key] != pytest.approx(value, rel=1e-5, abs=1e-6)
    }
    assert not differ, f"metrics (sharded, single process): {differ}"


@pytest.mark.parametrize(("ranks", "micros"), SPLITS)
def test_sharded_step_equals_single_process_step(ranks, micros):
    rows_per_rank = 8 // ranks
    assert len(plan_micro_batches([14] * rows_per_rank, BUDGET)) == micros  # the split this case claims
    names = [name for name, (_, _, kind) in _cases().items() if kind == "uniform" or ranks == 2]
    results = run_ranks(_sharded_steps, ranks, names)
    for name, sharded in zip(names, results[0], strict=True):
        _check(name, sharded)


def test_unsharded_accumulation_equals_single_process_step():
    """``trainer.fsdp_grad_accumulation: unsharded`` (one reduction per mini-batch) gives the same step as the
    default sharded accumulation checked above: two ranks, two micro-batches each."""
    names = [name for name, (_, _, kind) in _cases().items() if kind == "uniform"]
    results = run_ranks(_sharded_steps, 2, names, "unsharded")
    for name, sharded in zip(names, results[0], strict=True):
        _check(name, sharded)


@pytest.mark.parametrize("critic", [None, "separate"])
def test_a_rank_without_rows_still_steps_with_the_others(critic):
    """Three ranks, two samples: one rank holds no row of the mini-batch and only keeps collectives in step
    (through the critic's model too, when there is one)."""
    results = run_ranks(_few_rows_step, 3, critic)
    metrics, grads, _ = results[0]
    assert set(results[2]) == {2}, f"rank 2 holds no row: every pass pads, with 2 tokens: {results[2]}"
    want_metrics, want_grads, _ = _few_rows_step(critic, single=True)
    _assert_gradients_close(grads, want_grads)
    assert metrics["loss"] == pytest.approx(want_metrics["loss"], rel=1e-5, abs=1e-7)


def _few_rows_step(critic: str | None, single: bool = False):
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    parallel = SingleProcess() if single else FullyShardedParallel("cpu")
    groups = with_model_logprobs(random_groups(num_groups=1, group_size=2, seed=3), tiny_qwen2(), noise=0.5)
    trainer = Trainer(
        tiny_qwen2(),
        TrainerConfig(lr=1e-2, max_grad_norm=1.0),
        LossConfig(name="ppo"),
        AdvantageConfig(name="gae" if critic else "grpo"),
        parallel=parallel,
        critic=CriticConfig(type=critic) if critic else None,
    )
    widths = _recorded_widths(trainer)
    with stepped_gradients(trainer, _full) as stepped:
        metrics = trainer.train_step(groups, policy_version=0)
    return (metrics, stepped[-1], None) if parallel.rank == 0 else widths


def _recorded_widths(trainer: Trainer) -> list[int]:
    """The width of every forward's input from now on (padding passes included)."""
    widths: list[int] = []
    forward = trainer._forward

    def recording(module, micro):
        widths.append(micro.input_ids.shape[1])
        return forward(module, micro)

    trainer._forward = recording
    return widths
