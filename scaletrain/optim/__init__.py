"""Optimizers (fused, device-tensor LR) and device-side LR schedules."""

from typing import TYPE_CHECKING

from scaletrain.lazy import lazy_exports

_EXPORTS = {
    "OPTIMIZERS": "scaletrain.optim.optimizers",
    "SCHEDULES": "scaletrain.optim.schedules",
    "LRSchedule": "scaletrain.optim.schedules",
    "build_optimizer": "scaletrain.optim.optimizers",
    "build_schedule": "scaletrain.optim.schedules",
    "current_lr": "scaletrain.optim.optimizers",
    "set_lr": "scaletrain.optim.optimizers",
    "fill_lr": "scaletrain.optim.optimizers",
    "set_momentum": "scaletrain.optim.optimizers",
    "squared_norm": "scaletrain.optim.clipping",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scaletrain.optim.clipping import squared_norm
    from scaletrain.optim.optimizers import OPTIMIZERS, build_optimizer, current_lr, fill_lr, set_lr, set_momentum
    from scaletrain.optim.schedules import SCHEDULES, LRSchedule, build_schedule
