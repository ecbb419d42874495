"""``make_task(config)``: the one place that maps ``task.type`` to a Task implementation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from asyncrl.config.task import TaskConfig
from asyncrl.data.base import Split, Task, TaskSample
from asyncrl.data.procedural import GENERATORS, LengthSpec, ProceduralTask


def make_task(config: TaskConfig) -> Task:
    """Build the task ``config.type`` names (a built-in procedural task, a dataset file, a Hugging Face
    dataset on disk or reasoning-gym), its prompts rendered as ``task.chat_template`` and
    ``task.chat_template_kwargs`` say."""
    task = _make_task(config)
    if config.chat_template == "messages" and not config.chat_template_kwargs:
        return task
    return ChatRendering(task, config.chat_template, config.chat_template_kwargs)


def _make_task(config: TaskConfig) -> Task:
    sizes = {"train": config.num_train, "eval": config.num_eval}
    if config.type in GENERATORS or config.type == "code":
        from asyncrl.data.coding import code_example

        lengths = LengthSpec(
            median=config.median_items, sigma=config.length_sigma, max_items=config.max_items
        )
        return ProceduralTask(
            config.type,
            seed=config.seed,
            sizes=sizes,
            lengths=lengths,
            eval_fraction=config.eval_fraction,
            generator=code_example if config.type == "code" else None,
        )
    if config.type in ("file", "hf_dataset"):
        return _rows_task(config)
    if config.type == "reasoning_gym":
        from asyncrl.data.reasoning_gym import ReasoningGymTask

        return ReasoningGymTask(
            config.dataset_name, seed=config.seed, sizes=sizes, dataset_kwargs=config.dataset_kwargs
        )
    raise ValueError(f"task.type {config.type!r} has no implementation")


def _rows_task(config: TaskConfig) -> Task:
    """A ``FileTask`` over JSONL/Parquet files (``file``) or a saved/local HF dataset (``hf_dataset``)."""
    from asyncrl.data.file_task import FileTask, RowSource
    from asyncrl.data.hf_dataset import read_dataset_rows, read_hub_rows
    from asyncrl.data.loader import FieldSpec, read_rows

    fields = FieldSpec(
        prompt_field=config.prompt_field,
        answer_field=config.answer_field,
        messages_field=config.messages_field,
        answer_delimiter=config.answer_delimiter,
        prompt_format=config.prompt_format,
    )

    def source(path: str, split: str) -> RowSource:
        if config.type == "file":
            return RowSource(path, lambda: read_rows(path))
        return RowSource(f"{path}[{split}]", lambda: read_dataset_rows(path, split))

    def dataset_split(split: str) -> RowSource:
        """A split of the task's own dataset: by hub name, or at ``train_path``."""
        if not config.dataset:
            return source(config.train_path, split)
        return RowSource(
            f"{config.dataset}[{config.dataset_config or 'default'}:{split}]",
            lambda: read_hub_rows(
                config.dataset,
                config.dataset_config,
                split,
                revision=config.dataset_revision,
                local_files_only=config.local_files_only,
            ),
        )

    train = dataset_split(config.train_split)
    eval_source = None
    if config.eval_path:
        eval_source = source(config.eval_path, config.eval_split or config.train_split)
    elif config.eval_split:
        eval_source = dataset_split(config.eval_split)
    return FileTask(
        train, eval_source, fields, seed=config.seed, eval_fraction=config.eval_fraction, name=config.type
    )


class ChatRendering:
    """A task whose samples are all prompted as chat (``always``: a plain prompt becomes one user message),
    all as plain text (``never``: chat rows keep only their last user message, ``TaskSample.prompt``), or as
    they come (``messages``); every chat sample carries ``template_kwargs`` for its template."""

    def __init__(self, task: Task, mode: str, template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.name = task.name
        self._task = task
        self._mode = mode
        self._template_kwargs = dict(template_kwargs or {})

    def split(self, split: Split) -> list[TaskSample]:
        return [self._render(sample) for sample in self._task.split(split)]

    def _render(self, sample: TaskSample) -> TaskSample:
        if self._mode == "never":
            return replace(sample, messages=None)
        if sample.messages is None and self._mode == "always":
            sample = replace(sample, messages=({"role": "user", "content": sample.prompt},))
        if self._template_kwargs:
            sample = replace(sample, chat_template_kwargs=self._template_kwargs)
        return sample
