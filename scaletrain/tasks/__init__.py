"""Tasks: what is learned and how it is scored (see base.py). Every module of this package is
imported here and registers its task (`@register_task`), so a new task is one new file."""

import scaletrain.tasks as _package
from scaletrain.registry import discover
from scaletrain.tasks.base import TASKS, Task, build_task, register_task

discover(_package)

__all__ = ["TASKS", "Task", "build_task", "register_task"]
