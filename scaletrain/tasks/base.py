"""A task: what a model learns and how it is scored (how the model is called on a batch, the
loss, the metrics evaluation reports, the metric a run stops at). The trainer, the batch finder
and the sweep talk to a task only through this interface, so a new kind of learning problem is
one more file in this folder, or a class in the user's own module (`--task package.module:Name`,
docs/your-task.md).

Every method runs on the device without host synchronisation: sums are accumulated as tensors and
read back once per evaluation (the trainer's rule for the hot path).
"""

from __future__ import annotations

import inspect
import math
import re
from abc import ABC, abstractmethod
from typing import Any

import torch

from scaletrain.config import TASKS as TASK_CHOICES
from scaletrain.errors import ConfigError, DataError, add_context
from scaletrain.inputs import Inputs, call_model
from scaletrain.registry import Registry

TASKS = Registry("task", "--task", choices=TASK_CHOICES)
# Class decorator: makes a task available as `--task NAME` (and a config choice).
register_task = TASKS.register


class Task(ABC):
    name = "base"
    # The metrics evaluation reports (without the val_/test_ prefix): name -> higher is better.
    metrics: dict[str, bool] = {}
    # The metric a target (--target) refers to unless --target-metric names another.
    default_target: str | None = "loss"
    # The per-step training metric accumulated on the device (train_<name> in the epoch logs),
    # averaged over every target element (samples; tokens for a language model); "": none beside
    # the loss.
    train_metric: str = ""
    # What a mean of several models' predictions of this task is (an ensemble's table row).
    combined: str = "averaged predictions"
    # Length of the vector `eval_sums` returns.
    n_sums: int = 0
    # What the task asks of its data's targets. data/ asks these (by the task's name: `targets_of`),
    # never the name itself, so a task of one more kind is one file here.
    # Targets are class indices: integer labels, refused as floats and checked in [0, classes) as read.
    integer_labels: bool = False
    # Targets index the model's outputs (classes, tokens): its width is the data's class count, and
    # a stored shard's target past it is refused as read. Otherwise the width is the targets' own.
    class_outputs: bool = True
    # A data set's `vocab_size` states its class count (token ids).
    vocabulary: bool = False
    # Inputs standardised with the training split's per-channel statistics (not token ids: indices).
    normalised_inputs: bool = True
    # Scores whatever the targets are (a model's own loss): the data's own kind of targets decides
    # how they are read, as it does for a user's task class.
    any_targets: bool = False

    def forward(self, model, x: Inputs) -> Any:
        """The model's output for a batch's inputs: its one input positionally, several (a dict
        sample's) by name. Override to call it otherwise."""
        return call_model(model, x)

    def model_inputs(self, x: Inputs, y: torch.Tensor) -> Inputs:
        """What `forward` receives of a batch (applied by the loaders on the device): the inputs.
        A model that computes its own loss takes the targets among them (own_loss.py)."""
        return x

    def prediction_inputs(self, x: Inputs, y: torch.Tensor) -> Inputs:
        """What `forward` receives of a batch when predicting: the training inputs by default; a
        model whose steps take the targets but predicts from the inputs alone (a LightningModule's
        forward) overrides it."""
        return self.model_inputs(x, y)

    @abstractmethod
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The mean loss of a batch, computed in float32 whatever the autocast dtype."""

    def train_metric_sum(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The training metric summed over the batch's target elements (a 0-d tensor); needed only
        where `train_metric` names one."""
        return torch.zeros((), device=target.device)

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

    def output_of_predictions(self, predictions: torch.Tensor) -> torch.Tensor:
        """An output that `eval_sums` scores as `predictions` (what `predictions` returned, or a
        mean of several models' predictions: an ensemble's): log-probabilities by default, whose
        softmax they are. A task whose predictions are its outputs returns them."""
        return torch.log(predictions.float().clamp_min(torch.finfo(torch.float32).tiny))

    @classmethod
    def scores_predictions(cls) -> str:
        """'' where `eval_sums(output_of_predictions(p), target)` scores predictions `p`, a mean of
        several models' among them (an ensemble's); else why not, in a few words. The default
        softmax and its log do; a task that overrides `predictions` says how to score them by
        overriding `output_of_predictions` too."""
        if cls.predictions is not Task.predictions and cls.output_of_predictions is Task.output_of_predictions:
            return ("it defines predictions but not output_of_predictions, the output eval_sums scores as those "
                    "predictions (docs/your-task.md)")
        return ""

    def scored_as(self) -> Task:
        """The task whose metrics score this task's predictions (an ensemble's mean of several
        models' among them): itself, or, where its own metrics are not a function of its
        predictions (a LightningModule's logged ones), the data's task its predictions are made as."""
        return self

    def output_size(self, dataset) -> int:
        """The model's output width for this data set: one per real-valued target, else the classes
        (the vocabulary for token ids)."""
        y = dataset.examples.y
        if y.is_floating_point():
            return 1 if y.ndim == 1 else int(y.shape[1])
        return dataset.num_classes

    def reached(self, metric: str, value: float, target: float) -> bool:
        return value >= target if self.metrics[metric] else value <= target

    def check_metric(self, metric: str, flag: str = "--target-metric") -> str:
        """`metric` (or the default for 'auto'), refused with the choices when this task has none."""
        if metric == "auto" and self.default_target is None:
            raise ConfigError(f"the {self.name} task has no default target metric; name one with {flag} "
                              f"({', '.join(self.metrics)})")
        metric = self.default_target if metric == "auto" else metric
        if metric not in self.metrics:
            raise ConfigError(f"{flag} {metric}: the {self.name} task reports {', '.join(self.metrics)}; "
                              "use one of these")
        return metric


# The epoch logs' own keys beside the task's (train_<train_metric>, val_<metric>): a task's
# metric may not take one of them.
OWN_TRAIN_KEYS = ("loss",)
METRIC_NAME = re.compile(r"[a-z][a-z0-9_]*")


def targets_of(name: str) -> type[Task]:
    """The class of the task `name` (registered, or the user's `package.module:Name`), whose
    attributes say what it asks of its data's targets (`integer_labels`, `class_outputs`,
    `vocabulary`, `normalised_inputs`, `any_targets`): what data/ asks instead of branching on task names."""
    return TASKS.get(name)


def computes_own_loss(model) -> bool:
    """A model whose forward takes `labels=` and returns an output with `.loss` (Hugging Face's
    convention): it is trained on its own loss unless a task is named."""
    try:
        return "labels" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def build_task(name: str, dataset_task: str, model=None, example=None) -> Task:
    """The task `name`: a user's own class (`package.module:Name`, checked), a built-in one that
    fits the data, or for 'auto' the task the model brings (`own_task`: an adapted LightningModule,
    which reads its metrics off `example`, two of the data's (inputs, targets)), its own loss
    (`model` computes one) or the data's task."""
    own_task = getattr(model, "own_task", None)
    if own_task is not None:
        if name != "auto":
            raise ConfigError(f"--task {name}: {type(model).__name__} brings its own loss and metrics; leave --task "
                              "auto")
        return own_task(example, dataset_task)
    if ":" in name:
        return user_task(name)
    if name == "auto" and model is not None and computes_own_loss(model):
        return TASKS.get("own-loss").for_model(model, dataset_task)
    chosen = dataset_task if name == "auto" else name
    cls = TASKS.get(chosen)
    if name == "own-loss":
        return cls.for_model(model, dataset_task)
    if chosen != dataset_task:
        raise ConfigError(f"--task {chosen} does not fit the data: its targets are for the {dataset_task} task; "
                          f"use --task auto or {dataset_task}")
    return cls()


def user_task(name: str) -> Task:
    """An instance of the user's Task class `name`, its contract checked: every required method,
    metrics named as ours are, none of them colliding with the logs' own keys."""
    cls = TASKS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError(f"--task {name}: not a subclass of scaletrain.tasks.Task (write `class "
                          f"{name.partition(':')[2]}(Task)`: docs/your-task.md)")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise ConfigError(f"--task {name}: the class lacks {', '.join(missing)}; a task defines loss, "
                          "eval_sums and eval_metrics (docs/your-task.md)")
    try:
        inspect.signature(cls).bind()
    except TypeError as exc:    # raised at our call, before their __init__ runs: no frame of theirs to show
        raise ConfigError(f"--task {name}: scaletrain builds the task as {cls.__name__}() with no arguments, and its "
                          f"__init__ cannot be called so ({exc}); give its parameters defaults") from None
    except ValueError:
        pass                    # no signature to read (a C type): the call says
    try:
        task = cls()
    except Exception as exc:   # the user's __init__: theirs to see (user_code/failures.py)
        add_context(exc, f"building your task {name}")
        raise
    task.name = name
    return checked_task(task, f"--task {name}")


def checked_task(task: Task, name: str) -> Task:
    """`task` (a user's, by its class or given as an instance to the Python API), refused in one line
    where its contract is broken: metrics named as ours are, none colliding with the logs' own
    keys, its default target among them."""
    if type(task).__module__.startswith("scaletrain."):
        return task           # our own: kept to the contract by our tests
    cls = type(task)
    metrics = task.metrics
    if not (isinstance(metrics, dict) and metrics and all(isinstance(k, str) and isinstance(v, bool)
                                                          for k, v in metrics.items())):
        raise ConfigError(f"{name}: `metrics` must map each metric's name to whether higher is better, "
                          "e.g. {'loss': False, 'f1': True}")
    bad = [m for m in (*metrics, task.train_metric or "x") if not METRIC_NAME.fullmatch(m)]
    if bad:
        raise ConfigError(f"{name}: metric name '{bad[0]}' must be lower-case letters, digits and _")
    if task.train_metric and type(task).train_metric_sum is Task.train_metric_sum:
        raise ConfigError(f"{name}: train_metric '{task.train_metric}' needs a train_metric_sum method")
    if task.train_metric in OWN_TRAIN_KEYS:
        raise ConfigError(f"{name}: train_metric '{task.train_metric}' collides with the logs' own "
                          f"train_{task.train_metric}; name it otherwise, or leave it empty")
    if task.default_target is not None and task.default_target not in metrics:
        stated = any("default_target" in vars(c) for c in cls.__mro__ if c is not Task)
        said = (f"default_target '{task.default_target}'" if stated else
                f"the class sets no default_target, and the inherited '{task.default_target}'")
        raise ConfigError(f"{name}: {said} is not one of its metrics ({', '.join(metrics)}); set "
                          f"default_target = '{next(iter(metrics))}' (what --target refers to), or None")
    if not isinstance(task.n_sums, int) or task.n_sums < 1:
        raise ConfigError(f"{name}: n_sums must be the length of the vector eval_sums returns (>= 1)")
    return task


def check_validation(logs: dict, epoch: int) -> None:
    """A validation metric that is inf or NaN while the epoch's training loss is finite: the split's
    samples or targets hold such values (a torch Dataset is read only as it is used), one line
    instead of a run that records NaN for every val_ metric."""
    bad = {k: v for k, v in logs.items() if k.startswith("val_") and isinstance(v, float) and not math.isfinite(v)}
    loss = logs.get("train_loss")
    if bad and isinstance(loss, float) and math.isfinite(loss):
        shown = ", ".join(f"{k} {v}" for k, v in bad.items())
        raise DataError(f"the validation split gives {shown} after epoch {epoch + 1}, while the training loss is "
                        f"{loss:.4g}: a sample or target of it holds inf or NaN; clean or drop those samples")


def checked_sums(sums: Any, task: Task) -> torch.Tensor:
    """A batch's evaluation sums, refused in one line unless a vector of the task's `n_sums` (a
    check of their metadata: no device synchronisation)."""
    if not isinstance(sums, torch.Tensor) or tuple(sums.shape) != (task.n_sums,):
        what = f"a tensor of shape {tuple(sums.shape)}" if isinstance(sums, torch.Tensor) else type(sums).__name__
        raise ConfigError(f"the {task.name} task's eval_sums must return a vector of n_sums = {task.n_sums} sums, "
                          f"got {what}; make n_sums the length of what eval_sums returns")
    return sums


def checked_loss(loss: Any, task: Task) -> torch.Tensor:
    """The step's loss, refused in one line unless it is a scalar floating-point tensor (a check of
    its metadata: no device synchronisation)."""
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.is_floating_point():
        what = (f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor)
                else type(loss).__name__)
        raise ConfigError(f"the {task.name} task's loss must be a scalar floating-point tensor (the batch's mean), "
                          f"got {what}")
    return loss
