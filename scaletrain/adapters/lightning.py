"""A Lightning `LightningModule` trained by scaletrain as it is: `--model package.module:LitModel`
(its `--model-option`s are the class's keyword arguments), or `Trainer(LitModel(...), cfg)`.

What of the module is used (docs/lightning.md says the same to users):
- `__init__`, then `setup("fit")` once;
- `training_step(batch, batch_idx)`: its loss (a tensor, or the "loss" of the dict it returns) is
  the step's loss; the strategy runs forward and backward, scaletrain's step does the rest
  (precision, accumulation, clipping, the update) with no host synchronisation;
- `validation_step(batch, batch_idx)`: what it `self.log`s (or `log_dict`s) are the run's
  validation metrics (`val_acc` is reported as `val_acc`, targeted as `acc`), each the mean over
  the whole split weighted by batch size, as Lightning's on-epoch mean, but summed exactly over
  every rank. Without a validation_step the metric is training_step's loss on the split;
- `configure_optimizers()`: read once and made into scaletrain's own fused optimizer and
  device-side schedule with the same settings: SGD, Adam or AdamW, one setting for every
  parameter (or decay only on weights, biases and norms undecayed), with no scheduler, StepLR or
  MultiStepLR stepped per epoch;
- the test split is scored with validation_step (test_step is not called); `predict` and `export`
  run the module's `forward` (its predict_step is not called), read as the data's task reads a
  model's outputs (class probabilities for classes).
Refused in one line, not ignored: manual optimisation, several optimizers, any other scheduler,
any other Lightning hook the class overrides (on_*, optimizer_step, backward, gradient clipping,
checkpoint and dataloader hooks...), a logged value that is not a number or tensor (a torchmetrics
`Metric`: log its `compute()`), reductions other than the mean, and dict samples (the batch handed
to the steps is Lightning's `[inputs, targets]`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import re
import warnings
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from scaletrain.config import OptimConfig
from scaletrain.console import quiet_fake_tensors
from scaletrain.errors import ConfigError
from scaletrain.inputs import Inputs, batch_rows
from scaletrain.optim.schedules import OwnSchedule
from scaletrain.tasks.base import Task
from scaletrain.user_code.lightning import OWN_OPTIMIZER_FIELDS

# Hooks whose behaviour scaletrain provides: overriding them changes nothing we would do.
HONOURED = {"setup", "training_step", "validation_step", "test_step", "predict_step", "configure_optimizers",
            "forward"}
# LightningModule methods (beside its hooks classes') that change the loop when overridden.
LOOP_METHODS = ("configure_callbacks", "configure_gradient_clipping", "lr_scheduler_step", "optimizer_step",
                "optimizer_zero_grad", "backward", "configure_model", "configure_sharded_model")
# Metric names that are better lower: everything else logged is better higher (accuracy, F1, AUC).
LOWER_IS_BETTER = re.compile(r"loss|err|mse|mae|rmse|perplexity|ppl|nll|cer|wer|distance")
VAL_PREFIX = re.compile(r"^(val|valid|validation)[_/]")


def _lightning_base(cls: type) -> type:
    return next(b for b in cls.__mro__ if b.__name__ == "LightningModule")


def unsupported_hooks(cls: type) -> list[str]:
    """The Lightning hooks `cls` overrides that scaletrain does not call the way Lightning would."""
    base = _lightning_base(cls)
    hooks_module = importlib.import_module(base.__module__.rsplit(".", 1)[0] + ".hooks")
    names = {n for kind in ("ModelHooks", "DataHooks", "CheckpointHooks")
             for n in vars(getattr(hooks_module, kind)) if not n.startswith("_")} | set(LOOP_METHODS)
    return sorted(n for n in names - HONOURED if getattr(cls, n, None) is not getattr(base, n, None))


class LightningAdapter(nn.Module):
    """The module, as a plain nn.Module whose forward runs its training_step (training mode) or
    validation_step (evaluation mode) on a batch, as Lightning's own strategy wrapper does: DDP,
    FSDP and compile wrap it as any model."""

    def __init__(self, module: nn.Module):
        super().__init__()
        cls = type(module)
        if not module.automatic_optimization:
            raise ConfigError(f"{cls.__name__} uses manual optimisation (automatic_optimization = False); scaletrain "
                              "runs the optimizer step itself: use automatic optimisation")
        if cls.training_step is _lightning_base(cls).training_step:   # Lightning's own warns, then raises
            raise ConfigError(f"{cls.__name__} defines no training_step: scaletrain trains on the loss it returns, as "
                              "Lightning does; define training_step(self, batch, batch_idx)")
        hooks = unsupported_hooks(cls)
        if hooks:
            raise ConfigError(f"{cls.__name__} overrides {', '.join(hooks)}: scaletrain does not call these Lightning "
                              "hooks (it honours training_step, validation_step, configure_optimizers and setup); "
                              "remove them to train it here (docs/lightning.md)")
        self.module = module
        self.has_validation_step = cls.validation_step is not _lightning_base(cls).validation_step
        self._batch_idx = 0
        self._logged: dict[str, tuple[Any, float | None]] | None = None   # set while a step runs
        # The module logs through us: Lightning's own `log` needs its Trainer.
        module.log = self._log
        module.log_dict = self._log_dict
        module.setup("fit")

    # ------------------------------------------------------------- the steps
    def forward(self, inputs: torch.Tensor, targets: torch.Tensor | None = None):
        if targets is None:   # inference (predict, export): the module's own forward
            return self.module(inputs)
        batch = [inputs, targets]   # what Lightning's default collate hands a step for (input, target) samples
        idx = self._next_batch_idx()
        self._logged = {}
        try:
            if self.training or not self.has_validation_step:
                out = self.module.training_step(batch, idx)
                loss = out.get("loss") if isinstance(out, Mapping) else out
                if loss is None:
                    raise ConfigError(f"{type(self.module).__name__}.training_step returned "
                                      f"{'a dict without loss' if isinstance(out, Mapping) else 'None'}: scaletrain "
                                      "trains on the loss it returns (skipping a batch is not supported)")
                return loss if self.training else {"loss": (loss, None)}
            self.module.validation_step(batch, idx)
            return dict(self._logged)
        finally:
            self._logged = None

    @torch.compiler.disable
    def _next_batch_idx(self) -> int:
        # Outside any compiled region: a changing Python int read inside one would recompile it.
        idx, self._batch_idx = self._batch_idx, self._batch_idx + 1
        return idx

    def train(self, mode: bool = True) -> LightningAdapter:
        self._batch_idx = 0   # batch_idx counts from 0 in each epoch and each validation pass
        return super().train(mode)

    def to(self, *args, **kwargs) -> LightningAdapter:
        # Lightning's module keeps its own `device` (and dtype) up to date in its `to`.
        self.module.to(*args, **kwargs)
        return self

    def _log(self, name: str, value: Any, *args, batch_size: int | None = None, reduce_fx: Any = "mean",
             **kwargs) -> None:
        if self._logged is None:   # logged outside a step (a hook we call): nothing to reduce
            return
        if reduce_fx not in ("mean", torch.mean):
            raise ConfigError(f"self.log('{name}', reduce_fx={reduce_fx!r}): scaletrain reduces logged metrics by "
                              "their batch-weighted mean only")
        if not isinstance(value, (torch.Tensor, int, float)) or (isinstance(value, torch.Tensor)
                                                                  and value.numel() != 1):
            raise ConfigError(f"self.log('{name}', ...) got {type(value).__name__}: log a number or a one-element "
                              "tensor (for a torchmetrics Metric, its compute())")
        self._logged[name] = (value, batch_size)

    def _log_dict(self, dictionary: Mapping, *args, batch_size: int | None = None, **kwargs) -> None:
        for name, value in dictionary.items():
            self._log(name, value, batch_size=batch_size, **{k: v for k, v in kwargs.items() if k == "reduce_fx"})

    # ------------------------------------------------- seams the trainer asks
    def own_task(self, example: tuple[Inputs, torch.Tensor] | None, data_task: str) -> LightningTask:
        """The task: the metrics validation_step logs, found by running it once on fake tensors
        shaped as `example` (two samples of the data): no computation, no randomness drawn.
        Predictions are the data's task's transform of the module's forward (softmax for classes)."""
        name = type(self.module).__name__
        if example is None:
            raise ConfigError(f"{name}: a LightningModule's metrics are read off its validation_step, which needs "
                              "the data's samples here")
        return LightningTask(name, self._probe(example), data_task)

    def optim_settings(self, optim: OptimConfig, epochs: int) -> OptimConfig:
        """`optim` with what configure_optimizers sets (optimizer, LR, decay, schedule): the
        command line refuses flags naming these (OWN_OPTIMIZER_FIELDS) before anything starts."""
        mine = read_optimizers(self.module, epochs)
        assert set(mine) <= set(OWN_OPTIMIZER_FIELDS), set(mine) - set(OWN_OPTIMIZER_FIELDS)
        return dataclasses.replace(optim, **mine)

    def own_callbacks(self) -> list:
        """What trains beside the step: a ReduceLROnPlateau's reaction to each validation."""
        optimizer, config, name = _configured(self.module, UNKNOWN_STEPS_PER_EPOCH, 1)
        if config is None or not isinstance(config["scheduler"], torch.optim.lr_scheduler.ReduceLROnPlateau):
            return []
        return [PlateauSchedule(config["scheduler"], optimizer, config["monitor"], config["frequency"],
                                config.get("strict", True), name)]

    def own_schedule(self, steps_per_epoch: int, epochs: int) -> OwnSchedule:
        """Every optimizer step's LR (and momentum, where it cycles) under the module's own
        scheduler (lr_schedule 'module'), stepped as Lightning's loop steps it: `simulate_schedule`."""
        return simulate_schedule(self.module, steps_per_epoch, epochs)

    def describe_optimizer(self, optim: OptimConfig) -> str:
        """One line for the run's start: where its optimizer settings came from."""
        schedule = (f", LR x{optim.step_gamma:g} at epochs {', '.join(f'{m:g}' for m in optim.step_milestones)}"
                    if optim.lr_schedule == "step" else
                    ", LR from its own scheduler, stepped as Lightning steps it" if optim.lr_schedule == "module"
                    else "")
        return (f"optimizer from {type(self.module).__name__}.configure_optimizers: {optim.optimizer} lr {optim.lr:g}"
                f"{f' weight decay {optim.weight_decay:g}' if optim.weight_decay else ''}{schedule}")

    def _probe(self, example: tuple[Inputs, torch.Tensor]) -> dict[str, str]:
        from torch._subclasses.fake_tensor import FakeTensorMode

        from scaletrain.data.user import kept_random_state
        x, y = example
        if isinstance(x, Mapping):
            raise ConfigError(f"{type(self.module).__name__}: a LightningModule is trained here on (input, target) "
                              "samples; these samples are dicts")
        device = next((p.device for p in self.parameters()), torch.device("cpu"))
        was_training = self.training
        self.eval()
        try:
            with kept_random_state(), torch.no_grad(), quiet_fake_tensors(), \
                    FakeTensorMode(allow_non_fake_inputs=True) as mode:
                logged = self(mode.from_tensor(x.to(device)), mode.from_tensor(y.to(device)))
        finally:
            self.train(was_training)
        if not logged:
            raise ConfigError(f"{type(self.module).__name__}.validation_step logs nothing: log the metrics to report, "
                              "e.g. self.log('val_loss', loss)")
        names: dict[str, str] = {}
        for key in logged:
            metric = re.sub(r"[^a-z0-9_]", "_", VAL_PREFIX.sub("", key.lower()))
            metric = metric if re.match(r"[a-z]", metric) else f"m_{metric}"
            if metric in names:
                raise ConfigError(f"self.log: '{names[metric]}' and '{key}' are both reported as val_{metric}; "
                                  "name them apart")
            names[metric] = key
        return names


class LightningTask(Task):
    """The module's own scoring: the step's loss is training_step's; the metrics are what
    validation_step logs, each a batch-weighted mean (value x weight and weight summed per metric,
    so the means are exact over batches and ranks)."""
    train_metric = ""

    def __init__(self, module_name: str, logged: dict[str, str], data_task: str = "classification"):
        from scaletrain.tasks import TASKS
        self.name = f"lightning:{module_name}"
        self.data_task = TASKS.get(data_task)()   # what predictions are made of the module's forward
        self.logged = logged                     # our metric name -> the name validation_step logs
        self.metrics = {m: not LOWER_IS_BETTER.search(m) for m in logged}
        self.default_target = "loss" if "loss" in logged else None
        self.n_sums = 2 * len(logged)

    def model_inputs(self, x: Inputs, y: torch.Tensor) -> Inputs:
        if isinstance(x, dict):
            raise ConfigError(f"{self.name}: a LightningModule is trained here on (input, target) samples; these "
                              "samples are dicts")
        return {"inputs": x, "targets": y}

    def prediction_inputs(self, x: Inputs, y: torch.Tensor) -> Inputs:
        return x   # the module's forward takes its inputs alone

    def loss(self, output, target):
        return output.float() if isinstance(output, torch.Tensor) else output

    def eval_sums(self, output, target):
        rows = float(batch_rows(target))
        values, weights = [], []
        for key in self.logged.values():
            value, weight = output.get(key, (0.0, 0.0))
            weight = float(rows if weight is None else weight)
            values.append(torch.as_tensor(value, dtype=torch.float64, device=target.device).reshape(()) * weight)
            weights.append(weight)
        return torch.cat([torch.stack(values), torch.tensor(weights, dtype=torch.float64, device=target.device)])

    def eval_metrics(self, sums):
        k = len(self.logged)
        return {m: total / weight if weight else float("nan")
                for m, total, weight in zip(self.logged, sums[:k], sums[k:], strict=True)}

    def scored_as(self) -> Task:
        """Its metrics are what validation_step logs, which a mean of several modules' predictions
        does not carry: those are scored as the data's task scores them (accuracy and loss of
        class probabilities)."""
        return self.data_task

    def predictions(self, output):
        """The module's forward on the inputs, as the data's task reads outputs (class probabilities
        for classification): what `predict` returns and `export` serves (predict_step is not called)."""
        return self.data_task.predictions(output)


# ------------------------------------------------------- configure_optimizers
# What configure_optimizers reads of `self.trainer` to size a schedule (OneCycleLR's total_steps
# from estimated_stepping_batches, most often). When the settings are read before the data is
# (the run's record), the steps per epoch are not known yet: the schedule built then is only
# looked at for its kind, and the one that trains is simulated with the real count.
UNKNOWN_STEPS_PER_EPOCH = 1000


@contextlib.contextmanager
def _attached(module: nn.Module, steps_per_epoch: int, epochs: int):
    """`module.trainer` answers what a fit of `epochs` epochs of `steps_per_epoch` steps would (a
    LightningModule's trainer property raises when no Trainer is attached)."""
    stand_in = SimpleNamespace(estimated_stepping_batches=steps_per_epoch * epochs, max_epochs=epochs, max_steps=-1,
                               num_training_batches=steps_per_epoch, accumulate_grad_batches=1, current_epoch=0,
                               global_step=0, world_size=1, num_devices=1, num_nodes=1)
    previous = module.__dict__.get("_trainer")
    module.__dict__["_trainer"] = stand_in
    try:
        yield
    finally:
        module.__dict__["_trainer"] = previous


def _configured(module: nn.Module, steps_per_epoch: int, epochs: int):
    """(optimizer, scheduler configuration with Lightning's defaults or None, the method's name for
    messages) of a fresh `module.configure_optimizers()`, called as a fit of `epochs` epochs of
    `steps_per_epoch` steps would call it."""
    name = f"{type(module).__name__}.configure_optimizers"
    with _attached(module, steps_per_epoch, epochs):
        optimizer, scheduler = _unpack(module.configure_optimizers(), name)
    return optimizer, None if scheduler is None else _scheduler_config(scheduler, name), name


def read_optimizers(module: nn.Module, epochs: int) -> dict[str, Any]:
    """The OptimConfig fields equal to what `module.configure_optimizers()` returns, or a one-line
    refusal naming what scaletrain cannot train the same way."""
    optimizer, config, name = _configured(module, UNKNOWN_STEPS_PER_EPOCH, epochs)
    fields = _optimizer_fields(optimizer, module, name)
    fields.update(_schedule_fields(config, epochs, name))
    return fields


def simulate_schedule(module: nn.Module, steps_per_epoch: int, epochs: int) -> OwnSchedule:
    """Every optimizer step's LR (float64, `steps_per_epoch * epochs` of them), and its momentum
    where the scheduler cycles that too (OneCycleLR's and CyclicLR's default), under the scheduler
    `module.configure_optimizers()` returns, stepped as Lightning's fit loop steps it: interval
    "step", after each batch whose index in its epoch (from 1) is a multiple of `frequency`;
    interval "epoch", after each epoch whose number (from 1) is one. The scheduler is run on a
    throwaway optimizer over the module's parameters (the step's own optimizer is built from the
    config), so the whole run's LRs are known before the first step and read on the device by the
    applied-step counter: a resume anywhere, mid-epoch too, continues the same table."""
    optimizer, config, name = _configured(module, steps_per_epoch, epochs)
    if config is None:   # lr_schedule 'module' is only set for a module that returns a scheduler
        raise ConfigError(f"{name} returns no scheduler; lr_schedule 'module' reads the one it returns")
    sched, frequency = config["scheduler"], config["frequency"]
    if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):   # PlateauSchedule changes it as it goes
        return OwnSchedule(torch.full((steps_per_epoch * epochs,), float(optimizer.param_groups[0]["lr"]),
                                      dtype=torch.float64))
    lrs, momenta, fixed = [], [], _fixed_settings(optimizer)
    with warnings.catch_warnings():
        # torch warns that the scheduler steps before its optimizer ever did: this one never will.
        warnings.simplefilter("ignore", UserWarning)
        try:
            for epoch in range(epochs):
                for batch in range(steps_per_epoch):
                    lrs.append(optimizer.param_groups[0]["lr"])
                    momenta.append(_momentum(optimizer.param_groups[0]))
                    if config["interval"] == "step" and (batch + 1) % frequency == 0:
                        sched.step()
                if config["interval"] == "epoch" and (epoch + 1) % frequency == 0:
                    sched.step()
        except ValueError as exc:     # OneCycleLR stepped past its total_steps (torch's "Tried to step ...")
            planned = getattr(sched, "total_steps", None)
            built = f"built for total_steps {planned}" if planned is not None else f"refused a step ({exc})"
            raise ConfigError(f"{name}: its {type(sched).__name__} was {built}, and this run takes "
                              f"{steps_per_epoch * epochs} optimizer steps ({epochs} epochs of {steps_per_epoch}); "
                              "size it with total_steps=self.trainer.estimated_stepping_batches, or train fewer "
                              "epochs") from None
    if _fixed_settings(optimizer) != fixed:   # a scheduler of Adam's second beta, say
        raise ConfigError(f"{name}: its {type(sched).__name__} changes more than the LR and the momentum as it "
                          "steps; scaletrain schedules those two only")
    cycled = len(set(momenta)) > 1
    return OwnSchedule(torch.tensor(lrs, dtype=torch.float64),
                       torch.tensor(momenta, dtype=torch.float64) if cycled else None)


def _momentum(group: dict) -> float:
    """The momentum a scheduler cycles: Adam's first beta, or SGD's momentum."""
    return float(group["betas"][0]) if "betas" in group else float(group.get("momentum", 0.0))


class PlateauSchedule:
    """A ReduceLROnPlateau from configure_optimizers, stepped as Lightning steps it: after the
    validation of every `frequency`-th epoch, on the value validation_step logged as `monitor`.
    It runs on its own throwaway optimizer; a reduction there multiplies the LR of every later step
    (TrainStep.scale_lr_from). A checkpoint holds its state (the trainer saves a callback's
    state_dict), and a resumed run scales its fresh table by the LR it had reached."""

    def __init__(self, scheduler, optimizer: torch.optim.Optimizer, monitor: str, frequency: int, strict: bool,
                 name: str):
        self.scheduler, self.optimizer, self.monitor = scheduler, optimizer, monitor
        self.frequency, self.strict, self.name = frequency, strict, name
        self.initial_lr = float(optimizer.param_groups[0]["lr"])
        self.metric: str | None = None    # the run's name for `monitor` (val_<metric>)

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def on_train_begin(self, trainer) -> None:
        logged = getattr(trainer.task, "logged", {})
        self.metric = next((f"val_{metric}" for metric, key in logged.items() if key == self.monitor), None)
        if self.metric is None and self.strict:
            raise ConfigError(f"{self.name}: ReduceLROnPlateau monitors '{self.monitor}', which validation_step does "
                              f"not log (it logs {', '.join(sorted(logged.values())) or 'nothing'})")
        if self.lr != self.initial_lr:   # resumed past a reduction: the table is built fresh
            trainer.train_step.scale_lr_from(trainer.counters.applied(), self.lr / self.initial_lr)

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None:
        value = logs.get(self.metric) if self.metric else None
        if (epoch + 1) % self.frequency or value is None:   # Lightning skips a missing metric when not strict
            return
        before = self.lr
        self.scheduler.step(value)
        if self.lr != before:
            trainer.train_step.scale_lr_from(trainer.counters.applied(), self.lr / before)

    def state_dict(self) -> dict:
        return {"scheduler": self.scheduler.state_dict(), "lr": self.lr}

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        for group in self.optimizer.param_groups:
            group["lr"] = state["lr"]


def _fixed_settings(optimizer: torch.optim.Optimizer) -> list[dict]:
    """What a scheduler may not change: every group setting but the LR and the momentum (Adam's
    first beta; its second stays)."""
    return [{k: (tuple(v)[1] if k == "betas" else v) for k, v in group.items()
             if k not in ("params", "lr", "initial_lr", "momentum")} for group in optimizer.param_groups]


def _unpack(result: Any, name: str) -> tuple[torch.optim.Optimizer, Any]:
    """(optimizer, scheduler config or None) of each form Lightning accepts."""
    scheduler = None
    if isinstance(result, Mapping):
        result, scheduler = result.get("optimizer"), result.get("lr_scheduler")
    elif isinstance(result, (list, tuple)):
        if len(result) == 2 and all(isinstance(r, (list, tuple)) for r in result):
            result, schedulers = result
            if len(schedulers) > 1:
                raise ConfigError(f"{name} returns {len(schedulers)} schedulers; scaletrain trains with one")
            scheduler = schedulers[0] if schedulers else None
        if len(result) != 1:
            raise ConfigError(f"{name} returns {len(result)} optimizers; scaletrain trains with one")
        result = result[0]
        if isinstance(result, Mapping):
            result, scheduler = result.get("optimizer"), result.get("lr_scheduler")
    if not isinstance(result, torch.optim.Optimizer):
        raise ConfigError(f"{name} returns {type(result).__name__}, not an optimizer")
    return result, scheduler


def _optimizer_fields(opt: torch.optim.Optimizer, module: nn.Module, name: str) -> dict[str, Any]:
    kind = type(opt).__name__
    if kind not in ("SGD", "Adam", "AdamW"):
        raise ConfigError(f"{name} returns torch.optim.{kind}; scaletrain trains with SGD, Adam or AdamW")
    groups = opt.param_groups
    shared = {k: v for k, v in groups[0].items() if k not in ("params", "weight_decay", "initial_lr")}
    if any({k: v for k, v in g.items() if k not in ("params", "weight_decay", "initial_lr")} != shared for g in groups):
        raise ConfigError(f"{name}: its parameter groups differ in more than weight decay; scaletrain trains every "
                          "parameter with one setting")
    decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    trainable = [p for p in module.parameters() if p.requires_grad]
    if set(decay) != {id(p) for p in trainable}:
        raise ConfigError(f"{name}: its optimizer does not hold exactly the module's trainable parameters")
    weights = {decay[id(p)] for p in trainable if p.ndim > 1} or {0.0}
    others = {decay[id(p)] for p in trainable if p.ndim <= 1} or set(weights)
    if len(weights) != 1 or not (others == weights or others == {0.0}):
        raise ConfigError(f"{name}: weight decay that is neither the same for all parameters nor on the weights "
                          "only (biases and norms undecayed); scaletrain does one of these")
    weight_decay = next(iter(weights))
    lr = float(shared["lr"])
    fields: dict[str, Any] = {"lr": lr, "weight_decay": float(weight_decay),
                              "decay_all": others == weights and weight_decay > 0}
    _require(shared, {"maximize": False, "differentiable": False}, name, kind)
    if kind == "SGD":
        _require(shared, {"dampening": 0}, name, kind)
        return {**fields, "optimizer": "sgd", "momentum": float(shared["momentum"]),
                "nesterov": bool(shared["nesterov"])}
    _require(shared, {"amsgrad": False, "eps": 1e-8}, name, kind)
    if kind == "Adam" and weight_decay > 0:
        raise ConfigError(f"{name}: Adam's weight_decay is an L2 penalty, scaletrain's AdamW decays decoupled; "
                          "use torch.optim.AdamW, or Adam without weight decay")
    return {**fields, "optimizer": "adamw", "betas": [float(b) for b in shared["betas"]]}


def _require(settings: dict, wanted: dict, name: str, kind: str) -> None:
    for key, value in wanted.items():
        if key in settings and settings[key] not in (value, None) and not (value is False and not settings[key]):
            raise ConfigError(f"{name}: {kind}({key}={settings[key]}) is not supported here (only {key}={value})")


def _scheduler_config(scheduler: Any, name: str) -> dict[str, Any]:
    """Lightning's scheduler configuration (a scheduler alone or its dict) with its defaults, or a
    one-line refusal of what Lightning itself would refuse."""
    config = {"interval": "epoch", "frequency": 1,
              **(dict(scheduler) if isinstance(scheduler, Mapping) else {"scheduler": scheduler})}
    if config["interval"] not in ("step", "epoch"):
        raise ConfigError(f"{name}: lr_scheduler interval {config['interval']!r}: Lightning takes 'step' or 'epoch'")
    frequency = config["frequency"]
    if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 1:
        raise ConfigError(f"{name}: lr_scheduler frequency {frequency!r}: a whole number of intervals, 1 or more")
    sched = config.get("scheduler")
    if not isinstance(sched, (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)):
        raise ConfigError(f"{name}: lr_scheduler is {type(sched).__name__}, not a torch LR scheduler")
    if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
        if not config.get("monitor"):
            raise ConfigError(f"{name}: a ReduceLROnPlateau needs the metric it follows: return "
                              "{'scheduler': ..., 'monitor': 'val_loss'} (as Lightning requires)")
        if config["interval"] != "epoch":
            raise ConfigError(f"{name}: a ReduceLROnPlateau stepped every {config['interval']} reads the last "
                              "validation's metric again and again; scaletrain steps it after each validation "
                              "(interval 'epoch')")
    return config


def _schedule_fields(config: dict | None, epochs: int, name: str) -> dict[str, Any]:
    """StepLR and MultiStepLR stepped every epoch become scaletrain's step schedule (its record
    names the milestones); any other scheduler trains as its simulation (lr_schedule 'module').
    `config`: the scheduler configuration (`_scheduler_config`), None without a scheduler."""
    if config is None:
        return {"lr_schedule": "constant", "warmup_epochs": 0.0}
    sched = config["scheduler"]
    kind = type(sched).__name__
    if config["interval"] != "epoch" or config["frequency"] != 1 or kind not in ("StepLR", "MultiStepLR"):
        return {"lr_schedule": "module", "warmup_epochs": 0.0}
    if kind == "StepLR":
        milestones = [float(m) for m in range(sched.step_size, epochs + 1, sched.step_size)]
    else:
        milestones = sorted(float(m) for m in sched.milestones.elements())
    return {"lr_schedule": "step", "warmup_epochs": 0.0, "step_milestones": milestones,
            "step_gamma": float(sched.gamma)}
