"""Optimizers (fused, device-tensor LR) and device-side LR schedules."""

from scaletrain.optim.optimizers import OPTIMIZERS, build_optimizer, current_lr, set_lr
from scaletrain.optim.schedules import SCHEDULES, LRSchedule, build_schedule

__all__ = ["OPTIMIZERS", "SCHEDULES", "LRSchedule", "build_optimizer", "build_schedule", "current_lr", "set_lr"]
