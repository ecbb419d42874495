"""On a long-tailed batch, the ranks' token-balanced split (``distributed.row_split``) trains the same step as one
process, every rank deals the rows identically, and ``split_metrics`` reports how even the split was.

One 60-token sample among short ones, two gloo ranks: strided, rank 0 would hold the long row and three short
ones; balanced, it holds the long row and rank 1 the rest. Checked packed (real tokens) and padded (rows x
longest row), each with two mini-batches so the split is made per mini-batch, and with the proximal policy
recomputed at step start so the no-grad forward's split of the whole batch is used too.
"""

from __future__ import annotations

import pytest
from test_trainer_fsdp import _assert_gradients_close, _assert_metrics_equal, _assert_weights_close, _full
from trainer_fixtures import make_trajectory, tiny_qwen2, with_model_logprobs

from asyncrl.config.algorithm import AdvantageConfig, DecoupledPPOParams, LossConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.testing.gradients import stepped_gradients, trained_parameters
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer.distributed.parallel import Parallelism, SingleProcess
from asyncrl.trainer.distributed.row_split import RowSplit, strided_split
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import Group

CASES = {
    "packed": {"sequence_packing": True, "max_tokens_per_microbatch": 64},
    "padded": {"sequence_packing": False, "max_tokens_per_microbatch": 64},
}
"""Trainer settings of each case; the 64-token budget splits a rank's rows into more than one micro-batch."""
LOSS = LossConfig(name="decoupled_ppo", decoupled_ppo=DecoupledPPOParams(proximal="recompute"))


def _long_tailed_groups() -> list[Group]:
    """Two groups of four: responses of 3-9 tokens, but one of 57 (a 60-token sample)."""
    groups = []
    for g in range(2):
        trajectories = []
        for i in range(4):
            response = 57 if (g, i) == (0, 0) else 3 + (5 * i + 3 * g) % 7
            tokens = [(13 * g + 7 * i + k) % 300 for k in range(3 + response)]
            trajectories.append(
                make_trajectory(tokens[:3], tokens[3:], reward=float((i + g) % 2), uid=f"g{g}", index=i)
            )
        groups.append(Group(prompt_uid=f"g{g}", trajectories=trajectories))
    return groups


def _step(case: str, parallel: Parallelism) -> dict:
    """One step of ``case``; every rank returns the splits it dealt, rank 0 also the step's results."""
    config = TrainerConfig(lr=1e-3, max_grad_norm=None, num_mini_batches=2, **CASES[case])
    trainer = Trainer(tiny_qwen2(), config, LOSS, AdvantageConfig(name="grpo"), parallel=parallel)
    splits: list = []
    split = trainer._split

    def recording(batch, rows):
        splits.append(split(batch, rows))
        return splits[-1]

    trainer._split = recording
    groups = with_model_logprobs(_long_tailed_groups(), tiny_qwen2(), noise=0.5)
    with stepped_gradients(trainer, _full) as stepped:
        metrics = trainer.train_step(groups, policy_version=0)
    weights = {name: _full(param.detach()) for name, param in trained_parameters(trainer)}
    result = {"splits": splits, "split_metrics": trainer.split_metrics}
    if parallel.rank == 0:
        result |= {"metrics": metrics, "grads": stepped[-1], "weights": weights}
    return result


def _sharded_steps() -> list[dict]:
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    parallel = FullyShardedParallel("cpu")
    return [_step(case, parallel) for case in CASES]


def test_balanced_split_on_a_long_tailed_batch_equals_single_process_step():
    ranks = run_ranks(_sharded_steps, 2)
    for index, case in enumerate(CASES):
        got = [rank[index] for rank in ranks]
        want = _step(case, SingleProcess())
        assert got[0]["splits"] == got[1]["splits"], f"{case}: the ranks dealt the rows differently"
        start, *training = got[0]["splits"]
        assert (
            start.rows == tuple(range(8)) and len(training) == 2
        )  # the step-start forward, the mini-batches
        for split in got[0]["splits"]:
            assert sorted(row for rank in split.ranks for row in rank) == sorted(split.rows)
            strided = _strided(split, case)
            assert max(split.tokens) <= max(strided.tokens)
            if 0 in split.rows:  # the long row: strided stacks short ones beside it
                assert max(split.tokens) < max(strided.tokens), f"{case}: no better than strided"
        imbalance = got[0]["split_metrics"]["rank_token_imbalance"]
        assert imbalance == pytest.approx(sum(split.imbalance for split in training) / 2)
        assert got[1]["split_metrics"] == got[0]["split_metrics"]
        assert want["split_metrics"] == {}  # one process: nothing to balance
        _assert_gradients_close(got[0]["grads"], want["grads"])
        _assert_weights_close(got[0]["weights"], want["weights"])
        _assert_metrics_equal(got[0]["metrics"], want["metrics"])


def _strided(split: RowSplit, case: str) -> RowSplit:
    """The strided split of ``split``'s rows over two ranks, as ``case`` plans micro-batches."""
    packed = CASES[case]["sequence_packing"]
    return strided_split(
        split.rows, _lengths(split.rows), 2, CASES[case]["max_tokens_per_microbatch"], packed=packed
    )


def _lengths(rows: tuple[int, ...]) -> list[int]:
    """Real lengths of batch rows ``rows`` (the batch's rows are the groups' trajectories in order)."""
    trajectories = [t for group in _long_tailed_groups() for t in group.trajectories]
    return [len(trajectories[row].token_ids) for row in rows]


def test_the_long_tail_is_what_strided_stacks():
    """The batch this file trains is long-tailed: strided, its long row shares rank 0 with three short ones."""
    lengths = _lengths(tuple(range(8)))
    assert lengths == [60, 11, 9, 7, 9, 7, 12, 10]
    strided = strided_split(list(range(8)), lengths, 2, 64, packed=True)
    assert strided.ranks == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert strided.tokens == (90, 35)
