"""Model-state bytes per device, as a strategy lays them out: what the memory planner sums.

Each strategy states its own layout (`Strategy.model_state`), next to the code that creates it,
so the planner has no strategy list or formulas of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ParamInfo:
    shape: tuple[int, ...]
    unit: int            # index of the FSDP unit (repeated block) holding it; -1: the root

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class StateBytes:
    """What one parameter element costs, for a layout to multiply."""
    storage: int          # bytes per stored parameter (and gradient) element
    compute: int          # bytes per element of a gathered copy in the compute dtype
    optimizer_slots: int  # parameter-sized optimizer state tensors (AdamW 2, SGD with momentum 1)
    step_bytes: int       # per updated parameter tensor (AdamW's float32 step count)


@dataclass(slots=True)
class ModelState:
    params: int                 # parameter count (all of the model, not per device)
    param_bytes: int            # resident parameter bytes per device
    grad_bytes: int
    optimizer_bytes: int
    gathered_param_bytes: int   # parameters all-gathered during the step (zero2, fsdp)
    host_bytes: int = 0         # state kept in host memory instead of on the device (cpu offload)

    def offloaded(self) -> ModelState:
        """The same state with the parameter, gradient and optimizer shards moved to the host."""
        return ModelState(self.params, 0, 0, 0, self.gathered_param_bytes,
                          self.host_bytes + self.param_bytes + self.grad_bytes + self.optimizer_bytes)


def shard_numel(shape: tuple[int, ...], devices: int) -> int:
    """Elements of FSDP2's largest (rank 0) shard of a tensor: ceil(d0 / N) rows."""
    if not shape:
        return 1
    return math.ceil(shape[0] / devices) * math.prod(shape[1:])


def replicated_state(params: list[ParamInfo], owned: list[int], b: StateBytes) -> ModelState:
    """Parameters and gradients on every device; optimizer state for the `owned` parameters."""
    total = sum(p.numel for p in params)
    owned_numel = sum(params[i].numel for i in owned)
    return ModelState(total, total * b.storage, total * b.storage,
                      owned_numel * b.storage * b.optimizer_slots + len(owned) * b.step_bytes, 0)
