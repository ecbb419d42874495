"""Verifiable tasks: the ``TaskSample`` record, the ``Task`` seam, built-in long-tail tasks, ``make_task``."""

from asyncrl.tasks.base import Split, Task, TaskSample, extract_answer, render_prompt
from asyncrl.tasks.registry import make_task

__all__ = ["Split", "Task", "TaskSample", "extract_answer", "make_task", "render_prompt"]
