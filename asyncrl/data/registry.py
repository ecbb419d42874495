"""``make_task(config)``: the one place that maps ``task.type`` to a Task implementation."""

from __future__ import annotations

from asyncrl.config.task import TaskConfig
from asyncrl.data.base import Task
from asyncrl.data.procedural import GENERATORS, LengthSpec, ProceduralTask


def make_task(config: TaskConfig) -> Task:
    """Build the task ``config.type`` names: a built-in procedural task, a dataset file or reasoning-gym."""
    sizes = {"train": config.num_train, "eval": config.num_eval}
    if config.type in GENERATORS:
        lengths = LengthSpec(
            median=config.median_items, sigma=config.length_sigma, max_items=config.max_items
        )
        return ProceduralTask(
            config.type, seed=config.seed, sizes=sizes, lengths=lengths, eval_fraction=config.eval_fraction
        )
    if config.type == "file":
        from asyncrl.data.file_task import FileTask
        from asyncrl.data.loader import FieldSpec

        fields = FieldSpec(
            prompt_field=config.prompt_field,
            answer_field=config.answer_field,
            messages_field=config.messages_field,
            answer_delimiter=config.answer_delimiter,
        )
        return FileTask(
            config.train_path, config.eval_path, fields, seed=config.seed, eval_fraction=config.eval_fraction
        )
    if config.type == "reasoning_gym":
        from asyncrl.data.reasoning_gym import ReasoningGymTask

        return ReasoningGymTask(
            config.dataset_name, seed=config.seed, sizes=sizes, dataset_kwargs=config.dataset_kwargs
        )
    raise ValueError(f"task.type {config.type!r} has no implementation")
