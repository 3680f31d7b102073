"""Learning-rate schedules as pure functions of a step counter that lives on the device.

The counter advances only on applied optimizer steps (an fp16 step skipped for overflow does not
move the schedule), and it is a device tensor, so computing the LR never waits on the host and
the whole step can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from scaletrain.errors import ConfigError

SCHEDULES = ("constant", "step", "cosine", "onecycle", "module")


@dataclass(frozen=True, slots=True)
class LRSchedule:
    kind: str
    base_lr: float
    total_steps: int
    warmup_steps: int = 0
    milestones: tuple[int, ...] = ()  # in steps, for kind == "step"
    gamma: float = 0.1
    min_lr_ratio: float = 0.0
    onecycle_div: float = 25.0  # onecycle starts at base_lr / 25, as torch's OneCycleLR
    replica_scale: float = 1.0   # LR multiplier for data parallelism (linear: N replicas, sqrt: sqrt(N))
    scale_warmup_steps: int = 0  # ramp the multiplier from 1 to replica_scale over these steps
    # kind == "module": the LR of every optimizer step, as the model's own scheduler sets them
    # (a LightningModule's configure_optimizers, stepped as Lightning steps it: adapters/lightning.py)
    values: torch.Tensor | None = field(default=None, compare=False)
    # ...and where that scheduler cycles it too (OneCycleLR's and CyclicLR's cycle_momentum), every
    # step's momentum: SGD's, or Adam's first beta.
    momenta: torch.Tensor | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.kind not in SCHEDULES:
            raise ConfigError(f"unknown lr_schedule '{self.kind}'; choose one of: {', '.join(SCHEDULES)}")
        if (self.kind == "module") != (self.values is not None):
            raise ConfigError("lr_schedule 'module' is the schedule a model brings (a LightningModule's "
                              "configure_optimizers returns one); this model brings none: choose constant, step, "
                              "cosine or onecycle")

    def __call__(self, step: torch.Tensor) -> torch.Tensor:
        """LR for the optimizer step with (0-based) index `step`, as a float32 device tensor."""
        lr = self._base(step)
        if self.replica_scale == 1.0:
            return lr
        # Goyal et al.'s gradual warm-up: start at the single-replica LR, reach k times it linearly.
        s = step.to(torch.float32)
        ramp = torch.clamp((s + 1) / max(self.scale_warmup_steps, 1), max=1.0) if self.scale_warmup_steps else 1.0
        return lr * (1.0 + (self.replica_scale - 1.0) * ramp)

    def _base(self, step: torch.Tensor) -> torch.Tensor:
        s = step.to(torch.float32)
        total = float(max(self.total_steps, 1))
        if self.values is not None:   # the model's own: past its last step, its last value
            index = torch.clamp(step.to(torch.long), 0, len(self.values) - 1)
            return self.values.to(step.device, torch.float32)[index]
        if self.kind == "onecycle":
            rise = float(max(self.warmup_steps, 1))
            start = self.base_lr / self.onecycle_div
            up = start + (self.base_lr - start) * torch.clamp(s / rise, max=1.0)
            return torch.where(s < rise, up, self._cosine(s - rise, total - rise))
        if self.kind == "constant":
            lr = torch.full_like(s, self.base_lr, dtype=torch.float32)
        elif self.kind == "step":
            passed = sum((s >= m).to(torch.float32) for m in self.milestones) if self.milestones else s * 0
            lr = self.base_lr * torch.pow(torch.full_like(s, self.gamma), passed)
        else:  # cosine, after the warm-up
            lr = self._cosine(s - self.warmup_steps, total - self.warmup_steps)
        if self.warmup_steps > 0:
            lr = lr * torch.clamp((s + 1) / self.warmup_steps, max=1.0)
        return lr

    def _cosine(self, s: torch.Tensor, span: float) -> torch.Tensor:
        progress = torch.clamp(s / max(span, 1.0), 0.0, 1.0)
        floor = self.base_lr * self.min_lr_ratio
        return floor + (self.base_lr - floor) * 0.5 * (1.0 + torch.cos(math.pi * progress))

    def table(self, device: torch.device, offset: int = 0) -> torch.Tensor:
        """LR of every optimizer step (plus one spare) as a device tensor indexed by the global
        applied-step count; a schedule that starts after `offset` earlier steps pads the front."""
        steps = torch.arange(self.total_steps + 1, device=device)
        lrs = self(steps).to(torch.float32)
        return torch.cat([lrs.new_zeros(offset), lrs]) if offset else lrs

    def momentum_table(self, offset: int = 0) -> list[float] | None:
        """Every optimizer step's momentum (plus one spare), indexed as `table` is, on the host: the
        step sets it as a Python number (None: the schedule leaves the momentum alone)."""
        if self.momenta is None:
            return None
        values = [float(m) for m in self.momenta[:self.total_steps + 1]]
        values += values[-1:] * (self.total_steps + 1 - len(values))
        return values[:1] * offset + values

    def value_at(self, step: int) -> float:
        return float(self(torch.tensor(step)))


def replica_lr_scale(rule: str, replicas: int) -> float:
    """The LR multiplier for `replicas` data-parallel replicas under a scaling rule."""
    if rule == "linear":
        return float(replicas)
    if rule == "sqrt":
        return math.sqrt(replicas)
    if rule == "none":
        return 1.0
    raise ConfigError(f"unknown lr_scaling '{rule}'; choose one of: none, linear, sqrt")


# The schedule is read from a table of one float32 per optimizer step on the device (no host
# sync in the step): 100 M steps is a 400 MB table, and far longer than any run we know of.
MAX_SCHEDULE_STEPS = 100_000_000


@dataclass(frozen=True)
class OwnSchedule:
    """A model's own schedule, every optimizer step's values (a LightningModule's scheduler,
    simulated: adapters/lightning.py): the LR, and the momentum where the scheduler cycles it."""
    lrs: torch.Tensor
    momenta: torch.Tensor | None = None


def build_schedule(cfg, steps_per_epoch: int, epochs: int, replicas: int = 1,
                   own_schedule: Callable[[int, int], OwnSchedule] | None = None) -> LRSchedule:
    """Turns the epoch-denominated OptimConfig into a step-denominated schedule. `own_schedule`:
    the model's own (`own_schedule(steps_per_epoch, epochs)`), read under lr_schedule 'module'."""
    if steps_per_epoch * epochs > MAX_SCHEDULE_STEPS:
        raise ConfigError(f"--epochs {epochs} x {steps_per_epoch} steps per epoch is {steps_per_epoch * epochs:,} "
                          f"optimizer steps; the learning-rate schedule holds at most {MAX_SCHEDULE_STEPS:,} "
                          "(one value per step on the device): lower --epochs")
    own = own_schedule(steps_per_epoch, epochs) if own_schedule is not None and cfg.lr_schedule == "module" else None
    warmup = round(cfg.warmup_epochs * steps_per_epoch)
    if cfg.lr_schedule == "onecycle" and warmup == 0:
        warmup = round(0.3 * steps_per_epoch * epochs)  # torch OneCycleLR's pct_start
    return LRSchedule(
        kind=cfg.lr_schedule,
        base_lr=cfg.lr,
        total_steps=steps_per_epoch * epochs,
        warmup_steps=warmup,
        milestones=tuple(round(m * steps_per_epoch) for m in cfg.step_milestones),
        gamma=cfg.step_gamma,
        min_lr_ratio=cfg.min_lr_ratio,
        replica_scale=replica_lr_scale(cfg.lr_scaling, replicas),
        scale_warmup_steps=round(cfg.lr_scaling_warmup_epochs * steps_per_epoch),
        values=own.lrs if own is not None else None,
        momenta=own.momenta if own is not None else None,
    )
