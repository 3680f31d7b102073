"""Building a run's parts from its config: the one place the wiring lives.

    strategy (set up) -> data -> task -> model (seeded) -> Trainer (parallelize, optimizer, ...)

`scaletrain train`, `find-batch-size`, the scaling measurement, `ensemble` and the Python API
all build through `build_training`, so a new part (a task, a strategy option) is wired once.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from scaletrain.adapters import model_to_train
from scaletrain.checkpoint.weights import load_weights, weights_flag
from scaletrain.config import TrainConfig
from scaletrain.data import Dataset, load_dataset
from scaletrain.distributed import Strategy, resolve_device
from scaletrain.errors import ConfigError
from scaletrain.inputs import call_model, map_inputs
from scaletrain.models.structure import device_of, forget_structures
from scaletrain.tasks import Task, build_task
from scaletrain.training.allocator import keep_freed_memory
from scaletrain.training.denormals import flush_denormals
from scaletrain.training.preflight import meta_model, model_memory_problem, run_task
from scaletrain.training.threads import AdaptiveThreads, ThreadChoice, choose_threads, wait_policy
from scaletrain.training.trainer import Trainer


@dataclass(slots=True)
class TrainingParts:
    trainer: Trainer
    dataset: Dataset

    @property
    def strategy(self) -> Strategy:
        return self.trainer.strategy

    def close(self, clean: bool = True) -> None:
        self.trainer.close(clean)

    def __enter__(self) -> TrainingParts:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(clean=exc_type is None)


def set_thread_pools(cfg: TrainConfig) -> ThreadChoice:
    """The CPU thread pools, before any work so that every kernel sees them: the intra-op threads
    the config names or the load leaves (threads.py), the inter-op threads it names. torch fixes
    the inter-op pool at its first parallel work: a process that already ran some (a second
    training in one notebook) keeps its pool, and says so."""
    pinned = bool(cfg.distributed.devices) and resolve_device(cfg.device).type == "cpu"
    choice = choose_threads(cfg.threads, pinned=pinned)
    inter_op = cfg.inter_op_threads
    if inter_op is not None and torch.get_num_interop_threads() != inter_op:
        try:
            torch.set_num_interop_threads(inter_op)
        except RuntimeError:
            warnings.warn(f"inter_op_threads={inter_op} not applied: this process's inter-op pool was already "
                          f"started with {torch.get_num_interop_threads()} threads", stacklevel=2)
    return choice


def task_for(cfg: TrainConfig, dataset: Dataset) -> Task:
    """The task a run of `cfg` on `dataset` trains (preflight.run_task, on the data in hand; its
    first samples are read here, outside the meta device, where a sample would be a meta tensor)."""
    outputs = build_task(cfg.task, dataset.task).output_size(dataset)
    return run_task(cfg, (dataset.input_shape, outputs, dataset.task, dataset.example))


def _check_model_on_meta(cfg: TrainConfig, dataset: Dataset, task: Task, outputs: int) -> str | None:
    """What the model on the meta device shows before anything is allocated: one too big to build
    at all, and (a forward of two samples' shapes) fewer outputs than the labels need, each one
    line; more outputs than classes is a note, returned. A model that cannot be built or run there
    (its constructor or forward reads a tensor's values, a layer cannot take the samples) is built
    and run for real, and raises its own error."""
    try:
        model = meta_model(cfg, (dataset.input_shape, outputs))
    except Exception:
        return
    problem = model_memory_problem(cfg, model)
    if problem:
        raise ConfigError(problem)
    try:
        output = call_model(model, map_inputs(lambda t: t.to(device_of(model)), dataset.example[0]))
    except Exception:
        return    # the real step names the layer that fails, with torch's own message (user_code/failures.py)
    width = output.shape[-1] if isinstance(output, torch.Tensor) and output.ndim >= 2 else None
    if task.integer_labels and width is not None and width > outputs:
        return (f"{cfg.model.name} gives {width} outputs per sample and the labels of {dataset.name} name "
                f"{outputs} classes: the last {width - outputs} outputs never get a label (its builder is given "
                f"num_classes {outputs})")
    if task.integer_labels and width is not None and width < outputs:
        raise ConfigError(f"{cfg.model.name} gives {width} outputs per sample, but the labels of {dataset.name} "
                          f"go up to {outputs - 1} ({outputs} classes): a label past the outputs cannot be scored; "
                          f"build the model with num_classes outputs (its builder is given {outputs})")


def build_training(cfg: TrainConfig, *, strategy: Strategy | None = None, dataset: Dataset | None = None,
              task: Task | None = None, callbacks=(), checkpointer=None, checked: bool = False) -> TrainingParts:
    """The trainer (and data) `cfg` describes. Without `strategy` the trainer sets one up and
    tears it down on `close()`; a given one stays its caller's to tear down. `checked`: the caller
    validated `cfg` and changed nothing since (a run's settle_config), so it is not checked again."""
    if not checked:          # the Python API's door: a run of its own
        cfg.validate()
        forget_structures()
    threads = set_thread_pools(cfg)
    dataset = dataset if dataset is not None else load_dataset(cfg.data, seed=cfg.seed)
    given = task
    task = task or build_task(cfg.task, dataset.task)
    # The same initial weights for every precision, fusing choice, strategy and rank.
    outputs = task.output_size(dataset)
    note = _check_model_on_meta(cfg, dataset, task, outputs)
    torch.manual_seed(cfg.seed)
    # A LightningModule (its class named, or returned by a builder) trains through its adapter,
    # adapted before the task is chosen: it brings its own.
    model = model_to_train(cfg.model.name, dataset.input_shape, outputs, **cfg.model.options)
    # A model with its own loss trains on it; one that brings its task (a LightningModule) on that.
    task = given or build_task(cfg.task, dataset.task, model, dataset.example)
    if cfg.model.init_from is not None:   # before the strategy wraps or shards it: every rank reads the whole file
        load_weights(model, cfg.model.init_from, weights_flag(cfg.model.init_from))
    # A count chosen from the load follows it epoch by epoch; first, so the epoch's logs say it.
    callbacks = [AdaptiveThreads(threads.setting.value), *callbacks] if threads.adaptive else list(callbacks)
    trainer = Trainer(model, cfg, callbacks, strategy=strategy, checkpointer=checkpointer, task=task, checked=True)
    trainer.advice += [n for n in (note, threads.note) if n]
    trainer.settle_setting(threads.setting)
    trainer.settle_setting(wait_policy())
    trainer.settle_setting(flush_denormals(cfg.flush_denormal))   # after the pools exist: each thread set
    if trainer.device.type == "cpu":     # the step's blocks reused, not mapped afresh (allocator.py)
        trainer.settle_setting(keep_freed_memory())
    trainer.settle_for_data(dataset)      # so the run's start line and record name it too
    return TrainingParts(trainer, dataset)
