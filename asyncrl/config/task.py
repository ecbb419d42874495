"""Configuration of the task: which prompts RL trains and evaluates on, and how they are drawn.

Key decision: one flat section whose ``type`` picks a built-in procedural task, a user dataset file, or a
``reasoning-gym`` dataset; fields that a type does not use are ignored by it (each is documented with the
types it applies to).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

TASK_TYPES = ("count", "copy", "reverse", "running_sum", "code", "file", "hf_dataset", "reasoning_gym")
PROMPT_FORMATS = ("", "gsm8k", "boxed")


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """The prompts of a run: a built-in long-tail task, a user dataset, or a reasoning-gym dataset."""

    type: Literal[
        "count", "copy", "reverse", "running_sum", "code", "file", "hf_dataset", "reasoning_gym"
    ] = "copy"
    """Built-in procedural tasks: copy / reverse (a word list; copy is the default, the task the shipped warm
    start ``tiny-copy`` was trained on), count (count from a to b; the ``tiny-count`` warm start), running_sum
    (prefix sums of a digit list, then the total), code (write a Python function from examples; graded by
    the sandboxed ``code`` reward, see docs/sandbox.md). file: a user JSONL/Parquet dataset. hf_dataset: a
    Hugging Face ``datasets`` dataset by hub name (``dataset``), or on disk (``train_path``: a ``save_to_disk``
    directory, or a local .json/.jsonl/.parquet/.csv file read with ``load_dataset``). reasoning_gym: a
    procedural dataset from the reasoning-gym package."""
    seed: int = 0
    """Seed of the procedural generators; the same seed always gives the same splits."""
    num_train: int = 20000
    """Prompts in the train split (procedural tasks and reasoning_gym)."""
    num_eval: int = 256
    """Prompts in the held-out eval split (procedural tasks and reasoning_gym)."""
    median_items: float = 3.0
    """Procedural tasks: median number of items (numbers to count, words, digits) of a prompt."""
    length_sigma: float = 1.0
    """Procedural tasks: sigma of the log-normal number of items; larger makes the length tail longer."""
    max_items: int = 40
    """Procedural tasks: items are clipped to [1, max_items]; bounds the longest response."""
    eval_fraction: float = 0.1
    """Procedural tasks: share of the prompt space reserved for the eval split (by a stable prompt hash),
    which makes the splits disjoint by construction."""
    dataset: str = ""
    """hf_dataset: a dataset on the Hugging Face hub by name (``openai/gsm8k``), read with
    ``datasets.load_dataset`` through the standard cache (``HF_HOME``; ``HF_HUB_OFFLINE=1`` reads only what the
    cache holds). Set this or ``train_path``."""
    dataset_config: str = ""
    """hf_dataset with ``dataset``: the dataset's config (``main`` for gsm8k); empty: its only or default one."""
    dataset_revision: str = ""
    """hf_dataset with ``dataset``: the branch, tag or commit to read; empty: ``main``."""
    local_files_only: bool = False
    """hf_dataset with ``dataset``: never download; read only what the caches hold (as ``HF_HUB_OFFLINE=1``)."""
    prompt_format: Literal["", "gsm8k", "boxed"] = ""
    """file / hf_dataset: a math answer convention applied to every row. gsm8k: the prompt asks for the final
    answer after ``####``, and the reference is what follows the answer field's last ``####``. boxed (MATH):
    the prompt asks for ``\\boxed{}``, and the reference is the answer field's last ``\\boxed{}`` (or the field
    as it is). Both verify with ``math_equiv``. Empty: rows as they are."""
    train_path: str = ""
    """file: JSONL (``.jsonl``) or Parquet (``.parquet``) file of training rows. hf_dataset: a ``save_to_disk``
    directory (a Dataset or DatasetDict) or a local data file."""
    eval_path: str = ""
    """file / hf_dataset: held-out rows from another file or dataset; empty: ``eval_split`` of ``train_path``
    if set, else ``eval_fraction`` of the train rows held out by a stable hash of the prompt."""
    train_split: str = "train"
    """hf_dataset: the split of ``dataset`` / ``train_path`` trained on (a data file has only ``train``); with
    ``dataset`` any ``datasets`` split string (``train[:2000]``)."""
    eval_split: str = ""
    """hf_dataset: the held-out split (of ``eval_path`` if set, else of ``dataset`` / ``train_path``); empty:
    see ``eval_path``."""
    prompt_field: str = "prompt"
    """file / hf_dataset: column holding the plain-text prompt (rows need it unless they have
    ``messages_field``)."""
    answer_field: str = "answer"
    """file / hf_dataset: column holding the reference answer; a dotted name reaches into a nested object
    (``reward_model.ground_truth``, as verl-format datasets such as DAPO-Math-17k keep it)."""
    messages_field: str = ""
    """file / hf_dataset: optional column holding chat messages (a list of {role, content}); empty: plain
    prompts only."""
    answer_delimiter: str = ""
    """file / hf_dataset: the final answer is the text after the last occurrence of this marker; empty: the
    whole response."""
    chat_template: Literal["messages", "always", "never"] = "messages"
    """How prompts reach the model (any task type). messages: rows with chat messages are rendered with the
    tokenizer's chat template (when it has one), plain prompts are fed as they are. always: plain prompts are
    wrapped as one user message and rendered too. never: every prompt is fed as plain text."""
    chat_template_kwargs: dict[str, int | float | str | bool] = field(default_factory=dict)
    """Extra variables every chat template of the run is rendered with: training and evaluation prompts and
    the OpenAI endpoint (producer external). Qwen3: ``{enable_thinking: false}`` answers without a
    ``<think>`` block (its template thinks by default)."""
    dataset_name: str = "basic_arithmetic"
    """reasoning_gym: name of the dataset (``reasoning_gym.create_dataset(name, ...)``)."""
    dataset_kwargs: dict[str, int | float | str | bool] = field(default_factory=dict)
    """reasoning_gym: extra keyword arguments of the dataset's config."""

    def __post_init__(self) -> None:
        if self.type not in TASK_TYPES:
            raise ValueError(
                f"task.type must be one of {', '.join(map(repr, TASK_TYPES))}, got {self.type!r}"
            )
        for name in ("num_train", "num_eval", "max_items"):
            if getattr(self, name) < 1:
                raise ValueError(f"task.{name} must be >= 1, got {getattr(self, name)}")
        if not 1.0 <= self.median_items <= self.max_items:
            raise ValueError(f"task.median_items must be in [1, max_items], got {self.median_items}")
        if self.length_sigma < 0:
            raise ValueError(f"task.length_sigma must be >= 0, got {self.length_sigma}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"task.eval_fraction must be in (0, 1), got {self.eval_fraction}")
        rows = self.type in ("file", "hf_dataset")
        if self.type == "hf_dataset" and bool(self.dataset) == bool(self.train_path):
            raise ValueError(
                "task.type 'hf_dataset' needs exactly one of task.dataset (a hub name) or task.train_path"
            )
        if self.type != "hf_dataset" and self.dataset:
            raise ValueError(f"task.dataset applies to task.type 'hf_dataset', not {self.type!r}")
        if self.type == "file" and not self.train_path:
            raise ValueError(f"task.train_path must be set when task.type is {self.type!r}")
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(
                f"task.prompt_format must be one of {', '.join(map(repr, PROMPT_FORMATS))}, got {self.prompt_format!r}"
            )
        if self.prompt_format and not rows:
            raise ValueError(
                f"task.prompt_format applies to task.type 'file' or 'hf_dataset', not {self.type!r}"
            )
        if rows and not (self.prompt_field or self.messages_field):
            raise ValueError(
                f"task.prompt_field or task.messages_field must be set when task.type is {self.type!r}"
            )
        if self.chat_template not in ("messages", "always", "never"):
            raise ValueError(
                f"task.chat_template must be 'messages', 'always' or 'never', got {self.chat_template!r}"
            )
