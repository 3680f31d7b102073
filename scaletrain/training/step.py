"""One training step: the strategy runs it (`forward_backward`, then `optimizer_step`); this class
holds the pieces they call. Forward under the precision policy, the task's loss in float32,
backward (scaled under fp16), device-side counters, then unscale/skip, clipping, the device-side
LR and the optimizer step. No host synchronisation anywhere.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scaletrain.distributed.strategies.base import Strategy
from scaletrain.errors import ConfigError
from scaletrain.inputs import Inputs
from scaletrain.optim import LRSchedule, fill_lr, set_lr, set_momentum, squared_norm
from scaletrain.precision import DynamicLossScaler, PrecisionPolicy
from scaletrain.tasks import Task, checked_loss
from scaletrain.training.counters import DeviceCounters


class TrainStep:
    def __init__(self, model: nn.Module, forward: nn.Module, optimizer: torch.optim.Optimizer,
                 schedule: LRSchedule, policy: PrecisionPolicy, task: Task, counters: DeviceCounters,
                 device: torch.device, strategy: Strategy, scaler: DynamicLossScaler | None = None,
                 clip_grad_norm: float | None = None, grad_accum_steps: int = 1,
                 grads_to_none: bool = True, first_step: int = 0):
        self.model = model          # owns the parameters
        self.forward = forward      # the callable to run: the model, or its wrapped/compiled form
        self.optimizer = optimizer
        self.policy = policy
        self.task = task
        self.counters = counters
        self.device = device
        self.strategy = strategy
        self.scaler = scaler
        self.clip_grad_norm = clip_grad_norm
        self.grad_accum_steps = grad_accum_steps
        # A CUDA graph needs the gradient tensors to keep their addresses, so it zeroes in place.
        self.grads_to_none = grads_to_none
        self.params = [p for p in model.parameters() if p.requires_grad]
        # Whether this process's outputs count (the layout is frozen: read once, not every micro-batch).
        self.records = strategy.layout.records
        # The whole schedule, precomputed: a constant LR is set once, here; otherwise the step's
        # LR is one lookup by the applied-step count, on the host where the host knows it
        # (`DeviceCounters.host_indexed`: one fill), else on the device (two kernels).
        self.lr_table = schedule.table(device, offset=first_step)
        steady = self.lr_table[first_step:]
        self.constant_lr = bool((steady == steady[0]).all())    # one host read, at build
        self.lr_on_host = None
        if self.constant_lr:
            set_lr(optimizer, steady[0])
        elif counters.host_indexed:
            self.lr_on_host = self.lr_table.cpu().numpy()
        # A schedule that cycles the momentum too (OneCycleLR's default) sets it as a Python number
        # each step, from the host's step count: the optimizers read it there.
        self.momenta = schedule.momentum_table(offset=first_step)
        if self.momenta is not None and not counters.host_indexed:
            raise ConfigError("the model's scheduler cycles the momentum (OneCycleLR's and CyclicLR's cycle_momentum), "
                              "which each step sets from the step count on the host: not under fp16-mixed, CUDA "
                              "graphs or an XLA device, which count on the device; pass cycle_momentum=False, or "
                              "train in another precision (--no-cuda-graphs)")

    def scale_lr_from(self, applied: int, ratio: float) -> None:
        """Every LR from optimizer step `applied` on, times `ratio`: a model's own schedule
        reacting to a validation (a LightningModule's ReduceLROnPlateau), between steps."""
        with torch.no_grad():
            self.lr_table[applied:] *= ratio
        if self.lr_on_host is not None:   # a copy on a GPU, the table's own memory on a CPU: read it again
            self.lr_on_host = self.lr_table.cpu().numpy()
        if self.constant_lr and applied < len(self.lr_table):   # in place: a captured graph reads the same tensor
            set_lr(self.optimizer, self.lr_table[applied])

    def __call__(self, x: Inputs, y: torch.Tensor) -> None:
        self.strategy.forward_backward(self, x, y)
        self.strategy.optimizer_step(self)

    # ------------------------------------------------- forward and backward
    def forward_loss(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """(loss, output): the forward under autocast (the task calls the model), the task's loss
        in float32."""
        with self.policy.autocast(self.device):
            output = self.task.forward(self.forward, x)
        return checked_loss(self.task.loss(output, y), self.task), output

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's share of the step's loss (scaled under fp16)."""
        k = self.grad_accum_steps
        scaled = loss / k if k > 1 else loss
        if self.scaler is not None:
            scaled = self.scaler.scale_loss(scaled)
        scaled.backward()

    def record(self, loss: torch.Tensor, output: torch.Tensor, y: torch.Tensor, parts: int | None = None) -> None:
        """Adds one micro-batch's loss (one of `parts` equal shares of the step; default: the
        accumulation steps) and training metric to the device counters. Processes whose outputs
        another one already counts (tensor-parallel peers) record nothing. Detached tensors only,
        so no autograd and no `no_grad` context is needed."""
        if not self.records:
            return
        c, k = self.counters, parts or self.grad_accum_steps
        c.add_loss(loss.detach() / k if k > 1 else loss.detach())
        if self.task.train_metric:   # a task without a training metric costs the step nothing here
            c.add_metric(self.task.train_metric_sum, output, y)

    # ----------------------------------------------------------- the update
    def unscale_(self) -> torch.Tensor | None:
        """fp16: divides the gradients by the loss scale; returns this rank's overflow flag."""
        return self.scaler.unscale_(self.params) if self.scaler is not None else None

    def clip_(self, total_sq_norm=None) -> None:
        """Scales the gradients down to a total norm of `clip_grad_norm`. Where processes hold
        different parts of the model (pipeline stages, tensor-parallel shards), the strategy's
        `total_sq_norm(grads)` gives the whole model's squared norm, so every process clips by
        it, as one device would; whole gradients (one device, replicas) take the same sum
        (`squared_norm` says why it is not torch's `clip_grad_norm_`)."""
        if self.clip_grad_norm is None:
            return
        if total_sq_norm is None and not self.strategy.replicated_gradients:
            # FSDP's DTensor shards: torch's clip reduces their norm over the mesh.
            torch.nn.utils.clip_grad_norm_(self.params, self.clip_grad_norm, foreach=True)
            return
        grads = [p.grad for p in self.params if p.grad is not None]
        total = (total_sq_norm(grads) if total_sq_norm else squared_norm(grads, self.device)).sqrt()
        # Device-side, as clip_grad_norm_ does: no host read of the norm.
        coef = (self.clip_grad_norm / (total + 1e-6)).clamp(max=1.0).float()
        local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        if local:
            torch._foreach_mul_(local, coef)

    def update(self, found_inf: torch.Tensor | None, clipped: bool = False, apply=None) -> None:
        """Clips (unless the strategy did), sets the step's LR, steps the optimizer (skipped on the
        device when `found_inf` is 1), advances the counters and clears the gradients. `apply`: what
        applies the gradients instead of `optimizer.step()` (a parameter server's push and pull)."""
        c = self.counters
        if not clipped:
            self.clip_()
        if self.momenta is not None:
            set_momentum(self.optimizer, self.momenta[c.applied_index()])
        if self.lr_on_host is not None:
            fill_lr(self.optimizer, float(self.lr_on_host[c.applied_index()]))
        elif not self.constant_lr:
            with torch.no_grad():
                # index_select, not Python indexing: a 0-d index tensor must never become a host int.
                set_lr(self.optimizer, torch.index_select(self.lr_table, 0, c.applied_steps.view(1)).view(()))
        if found_inf is not None:
            # Fused optimizers read these attributes (the GradScaler protocol) and leave weights
            # and state untouched when found_inf is 1.
            self.optimizer.grad_scale = None
            self.optimizer.found_inf = found_inf
        (apply or self.optimizer.step)()
        if found_inf is not None:
            self.scaler.update()
        c.end_step(found_inf)
        # Every parameter's gradient, not only the optimizer's: under ZeRO-1 a rank's optimizer
        # holds a partition, but DDP accumulates into all gradients.
        if self.grads_to_none:
            for p in self.params:
                p.grad = None
        else:
            torch._foreach_zero_([p.grad for p in self.params if p.grad is not None])
