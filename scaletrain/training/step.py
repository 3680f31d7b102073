"""The training step: forward under the precision policy, float32 loss, backward, optional fp16
unscale/skip, clipping, device-side LR, optimizer step. No host synchronisation anywhere."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from scaletrain.distributed.strategies.base import Strategy
from scaletrain.optim import LRSchedule, set_lr
from scaletrain.precision import DynamicLossScaler, PrecisionPolicy
from scaletrain.training.counters import DeviceCounters


class TrainStep:
    def __init__(self, model: nn.Module, forward: nn.Module, optimizer: torch.optim.Optimizer,
                 schedule: LRSchedule, policy: PrecisionPolicy, counters: DeviceCounters,
                 device: torch.device, scaler: DynamicLossScaler | None = None,
                 clip_grad_norm: float | None = None, grad_accum_steps: int = 1,
                 grads_to_none: bool = True, first_step: int = 0, strategy: Strategy | None = None):
        self.model = model          # owns the parameters
        self.forward = forward      # the callable to run: the model, or its compiled form
        self.optimizer = optimizer
        self.schedule = schedule
        self.policy = policy
        self.counters = counters
        self.device = device
        self.scaler = scaler
        self.clip_grad_norm = clip_grad_norm
        self.grad_accum_steps = grad_accum_steps
        # A CUDA graph needs the gradient tensors to keep their addresses, so it zeroes in place.
        self.grads_to_none = grads_to_none
        self.params = [p for p in model.parameters() if p.requires_grad]
        # The strategy's hooks into the step: no_sync for accumulation micro-batches (only the
        # last one communicates), the overflow flag's reduction, ZeRO-1's post-step broadcast.
        self.strategy = strategy or Strategy(None, None)
        # The whole schedule, precomputed on the device: the step's LR is one lookup by the
        # applied-step counter (two kernels) instead of a dozen scalar ops every step.
        self.lr_table = schedule.table(device, offset=first_step)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        c = self.counters
        k = self.grad_accum_steps
        micro = zip(x.chunk(k), y.chunk(k)) if k > 1 else ((x, y),)
        for i, (xm, ym) in enumerate(micro):
            with self.strategy.no_sync() if i < k - 1 else contextlib.nullcontext():
                with self.policy.autocast(self.device):
                    logits = self.forward(xm)
                # The loss and its softmax are always computed in float32.
                loss = F.cross_entropy(logits.float(), ym)
                scaled = loss / k if k > 1 else loss
                if self.scaler is not None:
                    scaled = self.scaler.scale_loss(scaled)
                scaled.backward()
            with torch.no_grad():
                step_loss = loss.detach() / k if k > 1 else loss.detach()
                c.step_losses.index_add_(0, c.slot, step_loss.view(1))
                c.correct.add_((logits.detach().argmax(dim=-1) == ym).sum())
        self._apply_update()

    def _apply_update(self) -> None:
        c = self.counters
        found_inf = None
        if self.scaler is not None:
            found_inf = self.strategy.reduce_found_inf_(self.scaler.unscale_(self.params))
        if self.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip_grad_norm, foreach=True)
        with torch.no_grad():
            # index_select, not Python indexing: a 0-d index tensor must never become a host int.
            set_lr(self.optimizer, torch.index_select(self.lr_table, 0, c.applied_steps.view(1)).view(()))
        if found_inf is not None:
            # Fused optimizers read these attributes (the GradScaler protocol) and leave weights
            # and state untouched when found_inf is 1.
            self.optimizer.grad_scale = None
            self.optimizer.found_inf = found_inf
        self.optimizer.step()
        self.strategy.after_optimizer_step()
        with torch.no_grad():
            if found_inf is not None:
                self.scaler.update()
                skipped = found_inf.to(torch.int64)
                c.skipped.add_(skipped)
                c.applied_steps.add_(1 - skipped)
            else:
                c.applied_steps.add_(1)
            c.slot.add_(1)
        # Every parameter's gradient, not only the optimizer's: under ZeRO-1 a rank's optimizer
        # holds a partition, but DDP accumulates into all gradients.
        if self.grads_to_none:
            for p in self.params:
                p.grad = None
        else:
            torch._foreach_zero_([p.grad for p in self.params if p.grad is not None])
