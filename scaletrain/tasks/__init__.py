"""Tasks: what is learned and how it is scored (see base.py). Each module of this package
registers its task (`@register_task`) and is imported when its name is asked for (registry.py),
so a new task is one new file."""

from scaletrain.tasks.base import (
    TASKS,
    Task,
    build_task,
    check_validation,
    checked_loss,
    checked_sums,
    checked_task,
    computes_own_loss,
    register_task,
    targets_of,
)

__all__ = ["TASKS", "Task", "build_task", "check_validation", "checked_loss", "checked_sums", "checked_task",
           "computes_own_loss", "register_task", "targets_of"]
