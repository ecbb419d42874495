"""Tasks and datasets: the ``TaskSample`` record and ``Task`` seam, built-in procedural tasks, user files
(JSONL / Parquet), the reasoning-gym adapter, and ``make_task`` choosing among them."""

from asyncrl.data.base import Split, Task, TaskSample, extract_answer, render_prompt
from asyncrl.data.registry import make_task

__all__ = ["Split", "Task", "TaskSample", "extract_answer", "make_task", "render_prompt"]
