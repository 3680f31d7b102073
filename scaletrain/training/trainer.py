"""The Trainer: fit / evaluate / predict for one device.

Transforms are applied in one place, in a fixed order (precision conversion of the weights, then
compilation, then CUDA-graph capture of the whole step); the model itself stays a plain module.
"""

from __future__ import annotations

import math
import time
from itertools import islice

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from scaletrain.callbacks import CallbackList
from scaletrain.config import TrainConfig
from scaletrain.data import ArraySplit, Dataset, DeviceLoader, Normalizer, StreamingLoader, as_features, choose_placement
from scaletrain.errors import ConfigError, NonFiniteLossError
from scaletrain.optim import build_optimizer, build_schedule, current_lr
from scaletrain.precision import DynamicLossScaler, get_policy
from scaletrain.training.clock import DeviceClock
from scaletrain.training.counters import DeviceCounters
from scaletrain.training.memory import PeakMemory
from scaletrain.training.snapshot import TrainingSnapshot, init_optimizer_state
from scaletrain.training.step import TrainStep


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device '{name}' was asked for but CUDA is not available; use --device cpu")
    return device


class Trainer:
    def __init__(self, model: nn.Module, config: TrainConfig | None = None, callbacks=()):
        self.config = config or TrainConfig()
        self.config.validate()
        cfg = self.config
        self.device = resolve_device(cfg.device)
        self.policy = get_policy(cfg.precision.policy)
        self.policy.configure_backend()
        torch.manual_seed(cfg.seed)
        self.model = self.policy.convert_module(model, cfg.precision.fp32_modules).to(self.device)
        self.callbacks = CallbackList(callbacks)
        self.use_graphs = bool(cfg.cuda_graphs if cfg.cuda_graphs is not None
                               else cfg.steps_per_execution > 1) and self.device.type == "cuda"
        self.forward = torch.compile(self.model, mode=cfg.compile_mode) if cfg.compile else self.model
        self.optimizer = build_optimizer(cfg.optim, self.model, self.device, capturable=self.use_graphs)
        init_optimizer_state(self.optimizer)
        self.scaler = (DynamicLossScaler(self.device, cfg.precision.init_scale,
                                         growth_interval=cfg.precision.growth_interval)
                       if self.policy.loss_scaling else None)
        self.counters = DeviceCounters(self.device)
        self.clock = DeviceClock(self.device)
        self.stop_training = False
        self.history: list[dict] = []
        self.warmup_s = 0.0
        self.eval_time_s = 0.0
        self.global_step = 0
        self.steps_per_epoch = 0
        self.normalizer: Normalizer | None = None
        self.peak_memory = PeakMemory(self.device)
        self._step = None

    # ------------------------------------------------------------------ data
    def _loader(self, split: ArraySplit, train: bool) -> DeviceLoader | StreamingLoader:
        cfg, data = self.config, self.config.data
        batch = cfg.batch_size if train else (data.val_batch_size or cfg.batch_size)
        placement = choose_placement(data.placement, split.x.nbytes + split.y.nbytes, self.device)
        cls = DeviceLoader if placement == "device" else StreamingLoader
        kwargs = {} if cls is DeviceLoader else {"num_workers": data.num_workers}
        return cls(split, batch, self.device, self.normalizer, shuffle=train, drop_last=train,
                   augment=data.augment if train else (), shift=data.shift, seed=cfg.seed, **kwargs)

    # ----------------------------------------------------------------- train
    def fit(self, dataset: Dataset) -> list[dict]:
        """Trains on `dataset.train`, evaluating on `dataset.test` after every epoch."""
        cfg = self.config
        self.normalizer = Normalizer(dataset.mean, dataset.std, self.policy.input_dtype)
        train_loader = self._loader(dataset.train, train=True)
        val_loader = self._loader(dataset.test, train=False)
        self.steps_per_epoch = len(train_loader)
        if self.steps_per_epoch == 0:
            raise ConfigError(f"batch_size {cfg.batch_size} is larger than the {len(dataset.train)} "
                              "training samples; use a smaller --batch-size")
        schedule = build_schedule(cfg.optim, self.steps_per_epoch, cfg.epochs)
        self.counters.resize(self.steps_per_epoch)  # also empties the per-step loss slots
        # A second fit() starts a fresh schedule after the optimizer steps already taken.
        first_step = int(self.counters.applied_steps)
        self.train_step = TrainStep(self.model, self.forward, self.optimizer, schedule, self.policy,
                                    self.counters, self.device, self.scaler, cfg.optim.clip_grad_norm,
                                    cfg.optim.grad_accum_steps, grads_to_none=not self.use_graphs,
                                    first_step=first_step)
        self.peak_memory.reset()
        self.warmup_s = self._warm_up(train_loader, val_loader)
        self.callbacks.call("on_train_begin", self)
        logs: dict = {}
        for epoch in range(cfg.epochs):
            train_loader.set_epoch(epoch)
            self.callbacks.call("on_epoch_begin", self, epoch)
            logs = self._train_epoch(train_loader, epoch)
            logs.update(self.evaluate_loader(val_loader))
            self.callbacks.call("on_epoch_end", self, epoch, logs)
            self.history.append(logs)
            if self.stop_training:
                break
        self.callbacks.call("on_train_end", self, logs)
        return self.history

    def _warm_up(self, train_loader, val_loader) -> float:
        """Untimed: compiles, captures the CUDA graph, and touches every kernel once; then puts
        every weight, optimizer state, counter and RNG back exactly as it was."""
        start = time.perf_counter()
        extra = {**self.counters.tensors(), **(self.scaler.state_tensors() if self.scaler else {})}
        snapshot = TrainingSnapshot(self.model, self.optimizer, extra)
        x, y = next(iter(train_loader))
        if self.use_graphs:
            from scaletrain.training.cuda_graphs import CudaGraphStep
            self._step = CudaGraphStep(self.train_step, x, y)
        else:
            for _ in range(2 if self.config.compile else 1):
                self.train_step(x, y)
            self._step = self.train_step
        self.evaluate_loader(val_loader, max_batches=1)
        snapshot.restore()
        self.clock.now()  # synchronise before reading the warm-up time
        return time.perf_counter() - start

    def _train_epoch(self, loader, epoch: int) -> dict:
        cfg, c = self.config, self.counters
        c.reset_epoch()
        self.model.train()
        batches = iter(loader)
        epoch_step, next_log = 0, cfg.log_every
        first_global_step = self.global_step
        self.clock.start()
        while chunk := list(islice(batches, cfg.steps_per_execution)):
            self.callbacks.call("on_train_batch_begin", self, self.global_step)
            for x, y in chunk:
                self._step(x, y)
            epoch_step += len(chunk)
            self.global_step += len(chunk)
            batch_logs = {"epoch_step": epoch_step}
            if epoch_step >= next_log:  # a log step: the only reads inside the epoch
                next_log += cfg.log_every
                losses = c.read(epoch_step)["losses"]
                self._check_finite(losses, first_global_step)
                batch_logs["loss"] = sum(losses[-cfg.log_every:]) / len(losses[-cfg.log_every:])
            self.callbacks.call("on_train_batch_end", self, self.global_step, batch_logs)
        epoch_time = self.clock.stop()
        values = c.read(epoch_step)
        self._check_finite(values["losses"], first_global_step)
        samples = epoch_step * cfg.batch_size
        return {
            "epoch": epoch + 1,
            "train_loss": sum(values["losses"]) / max(epoch_step, 1),
            "train_accuracy": values["correct"] / max(samples, 1),
            "lr": current_lr(self.optimizer),
            "samples": samples,
            "epoch_train_time_s": epoch_time,
            "cumulative_train_time_s": self.clock.total,
            "skipped_steps": values["skipped"],
            "optimizer_steps": values["applied_steps"],
            **({"loss_scale": float(self.scaler.scale)} if self.scaler else {}),
        }

    def _check_finite(self, losses: list[float], first_global_step: int) -> None:
        """Under fp16-mixed an overflow is the loss scaler's business; elsewhere it is fatal."""
        if self.scaler is not None:
            return
        bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
        if bad is not None:
            raise NonFiniteLossError(
                f"the loss became inf/NaN at training step {first_global_step + bad + 1} under precision "
                f"'{self.policy.name}'; lower --lr, add --clip-grad-norm, or check the data for inf/NaN")

    # ------------------------------------------------------------- evaluate
    @torch.no_grad()
    def evaluate_loader(self, loader, max_batches: int | None = None) -> dict:
        """Loss and accuracy over a loader, summed on the device and read once. Not timed as
        training: the training clock is stopped while this runs."""
        self.callbacks.call("on_validation_begin", self)
        start = self.clock.now()
        was_training = self.model.training
        self.model.eval()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        count = 0
        for x, y in islice(loader, max_batches):
            with self.policy.autocast(self.device):
                logits = self.forward(x)
            loss_sum += F.cross_entropy(logits.float(), y, reduction="sum")
            correct += (logits.argmax(dim=-1) == y).sum()
            count += y.shape[0]
        self.model.train(was_training)
        loss, right = torch.stack([loss_sum, correct.to(torch.float64)]).tolist()
        logs = {"val_loss": loss / max(count, 1), "val_accuracy": right / max(count, 1)}
        elapsed = self.clock.now() - start
        if max_batches is None:
            self.eval_time_s += elapsed
            logs["eval_time_s"] = elapsed
        self.callbacks.call("on_validation_end", self, logs)
        return logs

    def evaluate(self, dataset: Dataset, split: str = "test") -> dict:
        """Loss and accuracy of the current model on a split of `dataset`."""
        if self.normalizer is None:
            self.normalizer = Normalizer(dataset.mean, dataset.std, self.policy.input_dtype)
        logs = self.evaluate_loader(self._loader(getattr(dataset, split), train=False))
        return {"loss": logs["val_loss"], "accuracy": logs["val_accuracy"]}

    # --------------------------------------------------------------- predict
    @torch.no_grad()
    def predict(self, x, batch_size: int | None = None) -> torch.Tensor:
        """Class probabilities (float32, on the host) for raw samples shaped like the training data.
        NumPy float64 input is converted to float32 explicitly."""
        if self.normalizer is None:
            raise ConfigError("predict() needs the training statistics: call fit() or evaluate() first")
        x = as_features(np.asarray(x) if not isinstance(x, torch.Tensor) else x, "predict input")
        batch_size = batch_size or self.config.data.val_batch_size or self.config.batch_size
        normalizer = Normalizer(self.normalizer.mean.to(self.device), self.normalizer.std.to(self.device),
                                self.normalizer.dtype)
        self.model.eval()
        out = []
        for chunk in x.split(batch_size):
            with self.policy.autocast(self.device):
                logits = self.forward(normalizer(chunk.to(self.device)))
            out.append(torch.softmax(logits.float(), dim=-1).cpu())
        return torch.cat(out) if out else torch.empty(0)
