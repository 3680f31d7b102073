"""Tasks: what is learned and how it is scored (see base.py). Importing this package registers
classification, regression and language-model."""

from scaletrain.tasks.base import TASKS, Task, build_task, register_task
from scaletrain.tasks.classification import Classification
from scaletrain.tasks.language_model import LanguageModel
from scaletrain.tasks.regression import Regression

__all__ = ["TASKS", "Classification", "LanguageModel", "Regression", "Task", "build_task", "register_task"]
