"""A task: what a model learns and how it is scored (loss, the metrics evaluation reports, the
metric a run stops at). The trainer, the batch finder and the sweep talk to a task only through
this interface, so a new kind of learning problem is one more file in this folder.

Every method runs on the device without host synchronisation: sums are accumulated as tensors and
read back once per evaluation (the trainer's rule for the hot path).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from scaletrain.errors import ConfigError
from scaletrain.config import TASKS as TASK_CHOICES
from scaletrain.registry import Registry

TASKS = Registry("task", "--task", choices=TASK_CHOICES)
# Class decorator: makes a task available as `--task NAME` (and a config choice).
register_task = TASKS.register


class Task(ABC):
    name = "base"
    # The metrics evaluation reports (without the val_/test_ prefix): name -> higher is better.
    metrics: dict[str, bool] = {}
    # The metric a target (--target) refers to unless --target-metric names another.
    default_target: str = "loss"
    # The per-step training metric accumulated on the device (train_<name> in the epoch logs),
    # averaged over every target element (samples; tokens for a language model).
    train_metric: str = ""
    # Length of the vector `eval_sums` returns.
    n_sums: int = 0

    @abstractmethod
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The mean loss of a batch, computed in float32 whatever the autocast dtype."""

    @abstractmethod
    def train_metric_sum(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The training metric summed over the batch's target elements (a 0-d tensor)."""

    @abstractmethod
    def eval_sums(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Sums over the batch (float64, length n_sums) from which `eval_metrics` finishes."""

    @abstractmethod
    def eval_metrics(self, sums: list[float]) -> dict[str, float]:
        """The metrics, from the sums over the whole split (all ranks)."""

    def example_batch(self, batch: int, input_shape, output_size: int, input_dtype: torch.dtype):
        """An (x, y) batch shaped and typed as this task's data (values arbitrary): what the memory
        planner traces a step with (it also runs under FakeTensorMode)."""
        x = torch.empty((batch, *input_shape), dtype=input_dtype)
        return x, torch.empty((batch,), dtype=torch.int64).random_(output_size)

    def predictions(self, output: torch.Tensor) -> torch.Tensor:
        """What `Trainer.predict` returns for a batch's outputs: class probabilities by default."""
        return torch.softmax(output.float(), dim=-1)

    def output_size(self, dataset) -> int:
        """The model's output width for this data set (classes, regression targets, vocabulary)."""
        return dataset.num_classes

    def reached(self, metric: str, value: float, target: float) -> bool:
        return value >= target if self.metrics[metric] else value <= target

    def check_metric(self, metric: str, flag: str = "--target-metric") -> str:
        """`metric` (or the default for 'auto'), refused with the choices when this task has none."""
        metric = self.default_target if metric == "auto" else metric
        if metric not in self.metrics:
            raise ConfigError(f"{flag} {metric}: the {self.name} task reports {', '.join(self.metrics)}; "
                              "use one of these")
        return metric


def build_task(name: str, dataset_task: str) -> Task:
    """The task `name`, or the data set's own for 'auto'; refuses a task the data cannot train."""
    chosen = dataset_task if name == "auto" else name
    cls = TASKS.get(chosen)
    if chosen != dataset_task:
        raise ConfigError(f"--task {chosen} does not fit the data: its targets are for the {dataset_task} task; "
                          f"use --task auto or {dataset_task}")
    return cls()
