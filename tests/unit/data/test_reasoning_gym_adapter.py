"""The reasoning-gym adapter works offline, keeps splits disjoint, and scores with the dataset's scorer."""

import pytest

from asyncrl.config.task import TaskConfig
from asyncrl.data import make_task
from asyncrl.rewards import get_reward


def test_reasoning_gym_splits_and_reward():
    task = make_task(
        TaskConfig(type="reasoning_gym", dataset_name="basic_arithmetic", num_train=20, num_eval=5)
    )
    train, held_out = task.split("train"), task.split("eval")
    assert len(train) == 20 and 1 <= len(held_out) <= 5
    assert not {s.prompt for s in train} & {s.prompt for s in held_out}
    sample = held_out[0]
    assert sample.reward == "reasoning_gym"
    assert sample.messages == ({"role": "user", "content": sample.prompt},)
    score = get_reward("reasoning_gym")
    assert score(f" {sample.answer} ", sample) == 1.0
    assert score("not a number", sample) == 0.0


def test_reasoning_gym_bad_dataset_is_a_value_error():
    task = make_task(
        TaskConfig(type="reasoning_gym", dataset_name="no_such_dataset", num_train=2, num_eval=2)
    )
    with pytest.raises(ValueError, match="reasoning_gym refused"):
        task.split("train")
