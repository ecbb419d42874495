"""Built-in procedural tasks: exact examples, long-tailed lengths, disjoint deterministic splits."""

import random

import pytest

from asyncrl.config.task import TaskConfig
from asyncrl.data import make_task
from asyncrl.data.lengths import long_tail_count, quantile
from asyncrl.data.procedural import (
    copy_example,
    count_example,
    reverse_example,
    running_sum_example,
)


class ScriptedRng(random.Random):
    """A Random whose randint/choices return scripted values, so examples are checked exactly."""

    def __init__(self, ints, letters=()):
        super().__init__(0)
        self._ints = list(ints)
        self._letters = list(letters)

    def randint(self, a, b):
        value = self._ints.pop(0)
        assert a <= value <= b
        return value

    def choices(self, population, k=1):
        return [self._letters.pop(0) for _ in range(k)]


def test_count_example_lists_every_number_from_start():
    example = count_example(ScriptedRng([98]), 4)
    assert example.prompt == "count 98 to 101:"
    assert example.demonstration == " 98 99 100 101"
    assert example.answer == "98 99 100 101"
    assert example.answer_delimiter is None


def test_copy_and_reverse_examples():
    copied = copy_example(ScriptedRng([], "kqb"), 3)
    assert (copied.prompt, copied.demonstration, copied.answer) == ("copy k q b:", " k q b", "k q b")
    reversed_ = reverse_example(ScriptedRng([], "kqb"), 3)
    assert (reversed_.prompt, reversed_.demonstration) == ("reverse k q b:", " b q k")


def test_running_sum_example_gives_prefix_sums_then_total():
    example = running_sum_example(ScriptedRng([3, 1, 4, 9]), 4)
    assert example.prompt == "sum 3 1 4 9:"
    assert example.demonstration == " 3 4 8 17 = 17"
    assert (example.answer, example.answer_delimiter) == ("17", "=")


def test_long_tail_count_is_clipped_and_median_is_close():
    rng = random.Random(0)
    draws = [long_tail_count(rng, median=3.0, sigma=1.0, max_items=40) for _ in range(5000)]
    assert min(draws) == 1 and max(draws) == 40
    assert quantile(draws, 0.5) == 3
    assert long_tail_count(rng, median=5.0, sigma=0.0, max_items=40) == 5


def test_quantile_nearest_rank():
    assert quantile([5, 1, 4, 2, 3], 0.5) == 3
    assert quantile([5, 1, 4, 2, 3], 0.99) == 5
    assert quantile([5, 1, 4, 2, 3], 0.2) == 1
    with pytest.raises(ValueError):
        quantile([], 0.5)


@pytest.mark.parametrize("task_type", ["count", "copy", "reverse", "running_sum"])
def test_splits_are_disjoint_deterministic_and_sized(task_type):
    config = TaskConfig(type=task_type, num_train=2000, num_eval=200, seed=3)
    task, again = make_task(config), make_task(config)
    train, held_out = task.split("train"), task.split("eval")
    assert (len(train), len(held_out)) == (2000, 200)
    assert not {s.prompt for s in train} & {s.prompt for s in held_out}
    assert train == again.split("train") and held_out == again.split("eval")
    assert len({s.uid for s in train + held_out}) == 2200
    assert held_out[0].uid == f"{task_type}-eval-000000"


def test_different_seeds_give_different_splits():
    first = make_task(TaskConfig(num_train=50, num_eval=10, seed=0)).split("eval")
    second = make_task(TaskConfig(num_train=50, num_eval=10, seed=1)).split("eval")
    assert [s.prompt for s in first] != [s.prompt for s in second]


def test_default_response_lengths_are_long_tailed():
    # The tokenizer splits every digit and space into its own token, so a count demonstration's token count
    # is its character count (plus EOS).
    samples = make_task(TaskConfig(type="count")).split("train")
    lengths = [len(s.demonstration) + 1 for s in samples]
    assert quantile(lengths, 0.99) / quantile(lengths, 0.5) >= 8


def test_every_demonstration_earns_its_reward():
    from asyncrl.rewards import get_reward

    for task_type in ("count", "copy", "reverse", "running_sum"):
        for sample in make_task(TaskConfig(type=task_type, num_train=50, num_eval=10)).split("eval"):
            assert get_reward(sample.reward)(sample.demonstration, sample) == 1.0
            assert get_reward("format")(sample.demonstration, sample) == 1.0


def test_unknown_split_is_rejected():
    with pytest.raises(ValueError, match="split must be one of 'train', 'eval'"):
        make_task(TaskConfig(num_train=5, num_eval=5)).split("test")


def test_eval_split_too_large_for_its_share_reports_the_field():
    task = make_task(TaskConfig(type="count", num_eval=10, max_items=1, median_items=1.0, length_sigma=0.0))
    # max_items=1 leaves 1000 distinct prompts, of which ~10% are held out: 10 eval prompts are found
    assert len(task.split("eval")) == 10
    tiny_share = make_task(
        TaskConfig(type="count", num_eval=200, max_items=1, median_items=1.0, eval_fraction=0.001)
    )
    with pytest.raises(ValueError, match="task.num_eval"):
        tiny_share.split("eval")
