"""The Trainer: fit / evaluate / predict, on one device or as one replica of many.

What is learned and how it is scored comes from its task (tasks/); how the step is spread over
devices from its strategy, which runs the step's forward/backward and optimizer step
(distributed/strategies/base.py). Transforms are applied in one place (`parallelize`), then
CUDA-graph capture of the whole step; `self.model` is always the bare module (its state dict
has no wrapper prefixes). Its state is `state_dict()` / `load_state_dict()`; its forward-only
side (`evaluate`, `predict`, each validation pass) is training/evaluating.py's.

A Trainer that sets its own strategy up (no `strategy` given) tears it down in `close()` (or at
the end of a `with` block), so the Python API never leaks a process group.
"""

from __future__ import annotations

import copy
import math
import time
from itertools import islice

import torch
from torch import nn

from scaletrain.accelerators.xla import is_xla
from scaletrain.adapters import adapted
from scaletrain.callbacks import CallbackList
from scaletrain.config import TrainConfig, identity_digest
from scaletrain.data import Dataset, Normalizer, loader_class, workers_end_on_stop
from scaletrain.data.user import TorchSplit
from scaletrain.distributed import Strategy, build_strategy, divide_batch, resolve_device
from scaletrain.distributed.batching import loader_batch
from scaletrain.distributed.capabilities import epoch_control, own_optimizer_problem
from scaletrain.errors import ConfigError, NonFiniteLossError, add_context
from scaletrain.inputs import first_rows
from scaletrain.optim import LRSchedule, build_schedule, current_lr
from scaletrain.precision import DynamicLossScaler, get_policy
from scaletrain.precision.alignment import alignment_warnings
from scaletrain.precision.hardware import device_facts, precision_warnings, settle_precision
from scaletrain.tasks import Task, build_task, check_validation, checked_task
from scaletrain.training.clock import DeviceClock, execution_boundary
from scaletrain.training.counters import DeviceCounters
from scaletrain.training.defaults import (
    Setting,
    choose_channels_last,
    choose_compile,
    choose_cudnn_benchmark,
    fixed_batch_shapes,
    has_2d_convolutions,
)
from scaletrain.training.device_rules import device_problem
from scaletrain.training.evaluating import Evaluating
from scaletrain.training.memory import PeakMemory
from scaletrain.training.parallelize import parallelize
from scaletrain.training.snapshot import TrainingSnapshot, init_optimizer_state
from scaletrain.training.state import copy_into, load_template, load_trainer_state, on_host, trainer_state
from scaletrain.training.step import TrainStep

__all__ = ["Trainer", "resolve_device"]


class Trainer(Evaluating):
    def __init__(self, model: nn.Module, config: TrainConfig | None = None, callbacks=(),
                 strategy: Strategy | None = None, checkpointer=None, task: Task | None = None,
                 checked: bool = False):
        # The caller's configuration stays theirs: settling `auto` and a model's own optimizer
        # write into this trainer's copy (trainer.config), never into the object handed in.
        self.config = copy.deepcopy(config) if config is not None else TrainConfig()
        if not checked:   # the Python API's door; build_training checked it already (`checked`)
            self.config.validate()
        cfg = self.config
        model = adapted(model)   # a LightningModule trains through its adapter (adapters/)
        # A model that brings its optimizer settings (a LightningModule's configure_optimizers):
        # they replace the config's, so the optimizer, the schedule and the logs all follow them.
        own_optim = getattr(model, "optim_settings", None)
        if own_optim is not None:
            cfg.optim = own_optim(cfg.optim, cfg.epochs)
        # ...and its own LR schedule where it brings one (lr_schedule 'module'): every step's LR.
        self.own_schedule = getattr(model, "own_schedule", None)
        # Whoever sets a strategy up tears it down: given one, the caller; else this trainer.
        self.owns_strategy = strategy is None
        if strategy is None:
            strategy = build_strategy(cfg.distributed)
        brought_by = type(getattr(model, "module", model)).__name__    # (the config may not name it: the API)
        problem = ((own_optimizer_problem(type(strategy), strategy.name, brought_by) if own_optim is not None
                    else None) or device_problem(cfg, type(strategy), strategy.env.world_size))
        if problem:
            raise ConfigError(problem)
        if self.owns_strategy:
            strategy.setup(cfg.device)
        self.strategy = strategy
        try:
            self._build_parts(model, cfg, callbacks, checkpointer, task, own_optim is not None)
        except BaseException:
            self.close(clean=False)   # a strategy this trainer set up (a process group) is left as found
            raise

    def _build_parts(self, model: nn.Module, cfg: TrainConfig, callbacks, checkpointer, task: Task | None,
                     own_optim: bool) -> None:
        """Everything but the strategy: layout, batch, precision, the parallelized model, the
        optimizer and the device-side state."""
        strategy = self.strategy
        # None: the data set's own task, chosen when fit() or evaluate() first sees the data.
        self.task = checked_task(task, f"task {type(task).__name__}") if task is not None else None
        self.device = strategy.device
        self.layout = strategy.layout
        # What only some strategies do at an epoch's edges (a no-op object for the others).
        self.epoch_control = epoch_control(strategy)
        self.batch = divide_batch(cfg.batch_size, cfg.per_replica_batch_size, self.layout.replicas,
                                cfg.optim.grad_accum_steps, cfg.accumulate_to_global)
        # What the hardware chose where the configuration did not say (defaults.py): stated by the
        # run's start line and kept in its record. `auto` precision is usually settled with the
        # run's configuration already (lifecycle/run.py: the saved config holds the policy).
        facts = device_facts(self.device)
        cfg.precision.policy, why = settle_precision(cfg.precision.policy, facts)
        self.settings = [Setting("precision", cfg.precision.policy, why),
                         choose_channels_last(cfg.channels_last, self.device, has_2d_convolutions(model)),
                         choose_compile(cfg.compile)]
        self.policy = get_policy(cfg.precision.policy)
        problem = self.policy.problem(cfg.precision, facts.kind, facts.capability)
        if problem:
            raise ConfigError(problem)
        self.policy.configure_backend()
        torch.manual_seed(cfg.seed)
        prepared = parallelize(model, cfg, strategy, self.policy, self.batch.per_replica,
                               channels_last=self.setting("channels_last"))
        self.model, self.forward, self.eval_forward = prepared.model, prepared.train_forward, prepared.eval_forward
        self.checkpointed_blocks = prepared.checkpointed_blocks
        # What this device does with the policy, and tensor-core shapes under 16-bit precisions;
        # run_training prints these once.
        self.advice = (precision_warnings(self.policy, facts) + self.policy.notes(self.model, cfg.precision)
                       # Tensor cores are a GPU's: on a CPU (where the probe may choose bf16) the sizes do not matter.
                       + (alignment_warnings(self.model, self.policy.name, self.batch.micro_batch)
                          if self.device.type == "cuda" else [])
                       + ([model.describe_optimizer(cfg.optim)] if own_optim else [])
                       + ([f"--grad-compression {cfg.distributed.grad_compression} compresses what processes "
                           "exchange; this run has one process, so nothing is compressed (it applies under --nproc)"]
                          if cfg.distributed.grad_compression != "none" and self.layout.world == 1 else []))
        # What a model brings to run beside the step (a LightningModule's ReduceLROnPlateau), first:
        # its epoch-end work is done before the run's own callbacks record the epoch.
        self.callbacks = CallbackList([*(model.own_callbacks() if hasattr(model, "own_callbacks") else []),
                                       *callbacks])
        self.checkpointer = checkpointer
        self.use_graphs = (bool(cfg.cuda_graphs if cfg.cuda_graphs is not None else cfg.steps_per_execution > 1)
                           and self.device.type == "cuda" and strategy.supports_cuda_graphs)
        self.optimizer = strategy.make_optimizer(cfg.optim, self.model, self.device, capturable=self.use_graphs)
        init_optimizer_state(self.optimizer)
        self.scaler = (DynamicLossScaler(self.device, cfg.precision.init_scale,
                                         growth_interval=cfg.precision.growth_interval)
                       if self.policy.loss_scaling else None)
        # The eager step counts on the host (a few kernels at each read instead of a dozen a step);
        # a captured graph, fp16's overflow-dependent count and an XLA device's traced graph (a
        # host index would be a constant of it: a new graph each step) need the device (counters.py).
        self.counters = DeviceCounters(self.device, host_indexed=not self.use_graphs and self.scaler is None
                                       and not is_xla(self.device), defer_metrics=not cfg.compile)
        self.clock = DeviceClock(self.device)
        self.end_execution = execution_boundary(self.device)
        self.stop_training = False
        self.history: list[dict] = []
        self.warmup_s = 0.0
        self.eval_time_s = 0.0
        self.checkpoint_time_s = 0.0   # saving checkpoints: left out of training time, reported beside it
        self.global_step = 0
        self.resumed_at_step = 0       # the global step this process began training at
        self.resumed_epoch_time_s = 0.0  # training time of a resumed epoch before its checkpoint
        self.epoch = 0           # the epoch being trained (0-based)
        self.epoch_step = 0      # optimizer steps done in it
        self.steps_per_epoch = 0
        # A user's own samples (a TorchSplit) are read in replica batches, each under its own seed:
        # a resume on another replica count would draw their random transforms differently.
        self.replica_seeded_data = False
        self.resumed_from: str | None = None
        self.test_logs: dict = {}      # the test split's figures, evaluated once after training
        self.normalizer: Normalizer | None = None
        self.peak_memory = PeakMemory(self.device)
        self._step = None
        self._pad_input: torch.Tensor | None = None   # a sample for padding forwards (strategy.evaluate)
        self._units_per_sample = 1   # target elements per sample (tokens for a language model)

    def setting(self, name: str):
        """The value this trainer runs with for a setting of `self.settings` (defaults.py)."""
        return next(s.value for s in self.settings if s.name == name)

    def settle_setting(self, setting: Setting) -> None:
        """Adds or replaces a setting (one chosen when the data is seen: cudnn.benchmark)."""
        self.settings = [s for s in self.settings if s.name != setting.name] + [setting]

    def settle_for_data(self, dataset: Dataset) -> None:
        """The settings that follow from the data (a DataLoader's batch size; cudnn.benchmark:
        whether every batch has one shape), chosen and applied; a run does it before its start
        line, `fit` again (the same)."""
        if dataset.loader_batch is not None:
            self.batch = loader_batch(dataset.loader_batch, self.config.per_replica_batch_size, self.layout.replicas,
                                      self.config.optim.grad_accum_steps)
        self.settle_setting(choose_cudnn_benchmark(self.config.cudnn_benchmark, self.device,
                                                   fixed_batch_shapes(dataset.train)))
        torch.backends.cudnn.benchmark = self.setting("cudnn.benchmark")

    # ------------------------------------------------------------- lifecycle
    def close(self, clean: bool = True) -> None:
        """Tears the strategy down if this trainer set it up (leaves the process group)."""
        if self.owns_strategy:
            self.strategy.teardown(clean)
            self.owns_strategy = False

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(clean=exc_type is None)

    def as_dataset(self, data, val=None, test=None) -> Dataset:
        """Our Dataset as it is, or one of the user's splits (data/user.py), its task chosen once."""
        if isinstance(data, Dataset):
            return data
        from scaletrain.data.user import as_dataset
        cfg = self.config
        return as_dataset(data, val, test, task=cfg.task, val_fraction=cfg.data.val_fraction, seed=cfg.seed,
                          count_classes=False)

    def adopt(self, dataset: Dataset) -> None:
        """Takes the data's task (unless one was given) and input statistics."""
        if self.task is None:
            self.task = build_task(self.config.task, dataset.task, self.model, dataset.example)
        if self.normalizer is None:
            # Where the batches are normalised: the batch finder normalises its device batches with
            # it directly (on a GPU a host copy failed every trial: found by benchmarks/gpu).
            self.normalizer = Normalizer(dataset.mean, dataset.std, self.policy.input_dtype).to(self.device)
        self._units_per_sample = max(dataset.examples.y[:1].numel(), 1)

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Everything a resumed run needs, as live tensors plus one JSON string (training/state.py);
        on an XLA device, host copies of them (torch.distributed.checkpoint reads host memory)."""
        state = trainer_state(self)
        return on_host(state) if is_xla(self.device) else state

    def load_template(self, saved_world_size: int, saved_replicas: int | None = None) -> dict:
        """The state dict to fill in place from a checkpoint taken on `saved_world_size` ranks
        holding `saved_replicas` model replicas (default: one per rank). On an XLA device it is
        host copies, which `load_state_dict` copies into the live tensors."""
        template = load_template(self, saved_world_size, saved_replicas or saved_world_size)
        if not is_xla(self.device):
            return template
        self._live_template = template
        return on_host(template)

    def load_state_dict(self, state: dict, saved_world_size: int | None = None,
                        saved_replicas: int | None = None) -> dict:
        """Applies a state (filled from `load_template`); returns its plain values."""
        if saved_world_size is None:   # saved by this very layout
            saved_world_size, saved_replicas = self.layout.world, self.layout.replicas
        if getattr(self, "_live_template", None) is not None:   # an XLA device's: filled on the host
            state, self._live_template = copy_into(self._live_template, state), None
        return load_trainer_state(self, state, saved_world_size, saved_replicas or saved_world_size)

    def position(self) -> dict:
        """Where training stands, and what a checkpoint must agree on to resume here."""
        return {"global_step": self.global_step, "epoch": self.epoch, "epoch_step": self.epoch_step,
                "world_size": self.layout.world, "replicas": self.layout.replicas,
                "global_batch": self.batch.global_batch,
                "steps_per_epoch": self.steps_per_epoch, "replica_seeded_data": self.replica_seeded_data,
                "config_identity": identity_digest(self.config)}

    def build_step(self, schedule: LRSchedule, grad_accum_steps: int | None = None, first_step: int = 0) -> TrainStep:
        """The training step with this trainer's model, optimizer, task, precision and strategy
        (fit, and the batch finder's trials, run exactly this)."""
        return TrainStep(self.model, self.forward, self.optimizer, schedule, self.policy, self.task, self.counters,
                         self.device, self.strategy, self.scaler, self.config.optim.clip_grad_norm,
                         grad_accum_steps or self.batch.accum_steps, grads_to_none=not self.use_graphs,
                         first_step=first_step)

    # ------------------------------------------------------------------ data
    def loader(self, split, train: bool, predict: bool = False):
        """The loader of `split` for this process: its replica's share of each global batch when
        `train`, its evaluation range otherwise (the batch finder and the scaling measurement take
        real batches from it); `predict`: the batches as the task predicts from them."""
        cfg, data, layout = self.config, self.config.data, self.layout
        if train:
            batch, shard = self.batch.per_replica, dict(rank=layout.replica_rank, world_size=layout.replicas)
            if not data.drop_last and layout.replicas > 1:   # a job of several processes started outside --nproc
                raise ConfigError("config key 'data.drop_last' false trains a smaller last step, but "
                                  f"{layout.replicas} replicas take equal shares of every batch; keep drop_last (the "
                                  "default)")
        else:
            # Each replica evaluates one contiguous range; the sums are all-reduced afterwards.
            start, end = layout.evaluation_range(len(split))
            if (start, end) != (0, len(split)):
                split = split.part(start, end)
            batch, shard = data.val_batch_size or self.batch.per_replica, {}
        cls, kwargs = loader_class(split, data, self.device)
        return cls(split, batch, self.device, self.normalizer, shuffle=train, drop_last=train and data.drop_last,
                   augment=data.augment if train else (), shift=data.shift, seed=cfg.seed,
                   model_inputs=self.task.prediction_inputs if predict else self.task.model_inputs, **shard, **kwargs)

    def schedule(self, steps_per_epoch: int, epochs: int):
        """The LR schedule of `epochs` epochs of `steps_per_epoch` optimizer steps: the config's,
        or the model's own (lr_schedule 'module'), scaled for the replicas."""
        return build_schedule(self.config.optim, steps_per_epoch, epochs, replicas=self.layout.replicas,
                              own_schedule=self.own_schedule)

    # ----------------------------------------------------------------- train
    def fit(self, data, val=None, test=None) -> list[dict]:
        """Trains on the training split, evaluating on the validation split after every epoch and
        on the test split once at the end (`self.test_logs`). `data` is our Dataset of splits, or
        the training split as users hold it (a torch Dataset, a DataLoader, (inputs, targets)
        arrays) with `val` and `test` in the same forms (data/user.py: without `val` a seeded
        fraction of the training split is held out). A data set without a validation split is
        validated on its test split, and then has no separate test figure. With a checkpointer that
        has something to resume, continues from it exactly."""
        dataset = self.as_dataset(data, val, test)
        self.normalizer = None   # this data set's statistics
        self.adopt(dataset)
        self.settle_for_data(dataset)   # a DataLoader's batch size adopted among them
        train_loader = self.loader(dataset.train, train=True)
        self.replica_seeded_data = isinstance(dataset.train, TorchSplit)
        val_loader = self.loader(dataset.val if dataset.val is not None else dataset.test, train=False)
        self.steps_per_epoch = len(train_loader)
        if self.steps_per_epoch == 0:
            raise ConfigError(f"global batch {self.batch.global_batch} is larger than the {len(dataset.train)} "
                              "training samples; use a smaller --batch-size")
        with workers_end_on_stop(train_loader, val_loader):
            return self._train(dataset, train_loader, val_loader)

    def _train(self, dataset: Dataset, train_loader, val_loader) -> list[dict]:
        """fit()'s training, warm-up to the last callback, on the loaders fit() made."""
        cfg = self.config
        schedule = self.schedule(self.steps_per_epoch, cfg.epochs)
        self.counters.resize(self.steps_per_epoch)  # also empties the per-step loss slots
        # A second fit() starts a fresh schedule after the optimizer steps already taken.
        first_step = self.counters.applied()
        self.train_step = self.build_step(schedule, first_step=first_step)
        self.peak_memory.reset()
        self.warmup_s = self._warm_up(train_loader, val_loader)
        self.strategy.after_first_step()
        position = self.checkpointer.restore(self) if self.checkpointer else None
        start_epoch, start_step = (position.epoch, position.epoch_step) if position else (0, 0)
        self.resumed_from = position.resumed_from if position else None
        self.resumed_at_step = self.global_step
        self.callbacks.call("on_train_begin", self)
        logs: dict = self.history[-1] if self.history else {}
        for epoch in range(start_epoch, cfg.epochs):
            if self.stop_training:
                break
            self.epoch = epoch
            train_loader.set_epoch(epoch, start_step)
            self.epoch_control.begin_epoch(epoch)
            self.callbacks.call("on_epoch_begin", self, epoch)
            try:
                logs = self._train_epoch(train_loader, epoch, start_step)
                start_step = 0
                if cfg.eval_each_epoch:
                    logs.update(self.evaluate_loader(val_loader))
                    check_validation(logs, epoch)
            except Exception as exc:   # where it was, for a failure of the user's code (user_code/failures.py)
                add_context(exc, f"in epoch {epoch + 1}, " + (f"training step {self.epoch_step + 1}" if start_step
                                 or self.epoch_step < self.steps_per_epoch else "evaluating the validation split"))
                raise
            self.callbacks.call("on_epoch_end", self, epoch, logs)
            self.history.append(logs)
        self.epoch, self.epoch_step = len(self.history), 0
        if cfg.eval_each_epoch and dataset.val is not None:
            test = self.evaluate_loader(self.loader(dataset.test, train=False), report=False)
            self.test_logs = {f"test_{k[4:]}": v for k, v in test.items() if k.startswith("val_")}
        if self.checkpointer is not None and self.checkpointer.every > 0 \
                and self.checkpointer.last_saved_position != (self.epoch, 0):
            started = time.perf_counter()
            self.checkpointer.save(self)  # the final state, so a resumed finished run has nothing left to do
            self.checkpoint_time_s += time.perf_counter() - started
        if self.checkpointer is not None:
            started = time.perf_counter()
            self.checkpointer.wait()      # a background save still writing: the run ends once it is committed
            self.checkpoint_time_s += time.perf_counter() - started
        self.callbacks.call("on_train_end", self, logs)
        return self.history

    def _warm_up(self, train_loader, val_loader) -> float:
        """Untimed: compiles, captures the CUDA graph, and touches every kernel once; then puts
        every weight, optimizer state, counter and RNG back exactly as it was."""
        start = time.perf_counter()
        extra = {**self.counters.tensors(), **(self.scaler.state_tensors() if self.scaler else {})}
        snapshot = TrainingSnapshot(self.model, self.optimizer, extra)
        x, y = next(iter(train_loader))
        self._pad_input = first_rows(x)
        if self.use_graphs:
            from scaletrain.training.cuda_graphs import CudaGraphStep
            self._step = CudaGraphStep(self.train_step, x, y)
        else:
            for _ in range(2 if self.config.compile else 1):
                self.train_step(x, y)
            self.end_execution()
            self._step = self.train_step
        if self.config.eval_each_epoch:
            self.evaluate_loader(val_loader, max_batches=1, reduce=False)
        snapshot.restore()
        self.counters.restored()
        self.clock.now()  # synchronise before reading the warm-up time
        return time.perf_counter() - start

    def _train_epoch(self, loader, epoch: int, start_step: int = 0) -> dict:
        cfg, c = self.config, self.counters
        if start_step == 0:
            c.reset_epoch()  # a resumed epoch keeps the restored losses of its first steps
        self.model.train()
        batches = iter(loader)
        epoch_step = self.epoch_step = start_step
        next_log = (start_step // cfg.log_every + 1) * cfg.log_every
        first_global_step = self.global_step - start_step
        # A resumed epoch counts the training time its first steps took before the checkpoint.
        self.clock.start(already=self.resumed_epoch_time_s if start_step else 0.0)
        data_wait = 0.0   # host time blocked on the loader: how much the input pipeline held training back
        while True:
            asked = time.perf_counter()
            chunk = list(islice(batches, cfg.steps_per_execution))
            data_wait += time.perf_counter() - asked
            if not chunk:
                break
            self.callbacks.call("on_train_batch_begin", self, self.global_step)
            for x, y in chunk:
                self._step(x, y)
            self.end_execution()   # an XLA device runs the chunk's steps as one graph (clock.py)
            epoch_step += len(chunk)
            self.global_step += len(chunk)
            self.epoch_step = epoch_step
            batch_logs = {"epoch_step": epoch_step}
            if epoch_step >= next_log:  # a log step: the only reads inside the epoch
                next_log += cfg.log_every
                ran = epoch_step if self.epoch_control.cuts_epochs else None
                losses = c.read(epoch_step, self.strategy, ran=ran)["losses"]
                self._check_finite(losses, first_global_step)
                batch_logs["loss"] = sum(losses[-cfg.log_every:]) / len(losses[-cfg.log_every:])
            self.callbacks.call("on_train_batch_end", self, self.global_step, batch_logs)
            if self.checkpointer is not None and self.checkpointer.due(self.global_step, len(chunk)):
                paused_at = self.clock.pause()  # checkpoint writing is not training time
                self.checkpointer.save(self)
                self.checkpoint_time_s += time.perf_counter() - paused_at
                self.clock.resume()
            if self.epoch_control.epoch_cut():
                break   # the others have finished the epoch (backup workers): the rest of this share is dropped
        self.epoch_control.end_epoch()
        # The epoch's training ends when every replica has finished its steps, so the reads below (a
        # collective) are inside the clock: a replica that finished first (a parameter server's fast
        # worker, which never waits inside a step) counts its wait for the others.
        if self.epoch_control.cuts_epochs:
            ran, epoch_step = epoch_step, self._agree_on_epoch_end(epoch_step, first_global_step)
            values = c.read(epoch_step, self.strategy, ran=ran)
            samples = round(values["replica_steps"] * self.batch.global_batch / self.layout.replicas)
        else:
            values = c.read(epoch_step, self.strategy)
            samples = epoch_step * self.batch.global_batch
        epoch_time = self.clock.stop()
        self._check_finite(values["losses"], first_global_step)
        return {
            "epoch": epoch + 1,
            "train_loss": sum(values["losses"]) / max(epoch_step, 1),
            **({f"train_{self.task.train_metric}": values["metric_sum"] / max(samples * self._units_per_sample, 1)}
               if self.task.train_metric else {}),
            "lr": current_lr(self.optimizer),
            "samples": samples,
            "epoch_train_time_s": epoch_time,
            "data_wait_s": data_wait,
            **self.epoch_control.epoch_metrics(),
            "cumulative_train_time_s": self.clock.total,
            "checkpoint_time_s": self.checkpoint_time_s,
            "skipped_steps": values["skipped"],
            "optimizer_steps": values["applied_steps"],
            **({"loss_scale": float(self.scaler.scale)} if self.scaler else {}),
        }

    def _agree_on_epoch_end(self, ran: int, first_global_step: int) -> int:
        """An epoch that ended early for some replicas: every process takes the most steps any ran
        (the position, the LR schedule's count and the checkpoints then agree again)."""
        agreed = torch.tensor([ran, self.counters.applied()], dtype=torch.float64)
        self.strategy.all_reduce_max_(agreed)
        steps, applied = (int(v) for v in agreed.tolist())
        self.counters.set_applied(applied)
        self.epoch_step, self.global_step = steps, first_global_step + steps
        return steps

    def _check_finite(self, losses: list[float], first_global_step: int) -> None:
        """Under fp16-mixed an overflow is the loss scaler's business; elsewhere it is fatal."""
        if self.scaler is not None:
            return
        bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
        if bad is not None:
            raise NonFiniteLossError(
                f"the loss became inf/NaN at training step {first_global_step + bad + 1} under precision "
                f"'{self.policy.name}'; lower --lr, add --clip-grad-norm, or check the data for inf/NaN")
