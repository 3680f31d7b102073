"""Bytes per device of parameters, gradients and optimizer state, as scaletrain lays them out.

Under autocast (bf16-/fp16-mixed) weights and gradients stay float32: with AdamW that is
4 + 4 + 8 = 16 bytes per parameter on every DDP replica, the ZeRO paper's 16 Psi (its fp16 copy
of the weights is, here, autocast's per-op cast: counted with the activations). bf16-true stores
everything in bf16 (2 + 2 + 4); SGD keeps one momentum buffer (none without momentum). AdamW
(fused) adds one float32 `step` scalar per parameter tensor it updates.

Sharding per strategy, exactly as the strategies do it:
  ddp    everything replicated;
  zero1  optimizer state for the parameters this rank owns (greedy partition by size, the same
         function the strategy uses), so about 1/N;
  zero2  gradients and optimizer state sharded like fsdp; parameters sharded at rest, and the
         whole model gathered in the compute dtype from each forward to its backward;
  fsdp   parameters, gradients and optimizer state sharded: FSDP2 splits every tensor on dim 0
         into N chunks of ceil(d0 / N) rows (padding the last), so rank 0 holds the largest.
         During the step one unit is gathered and the next one prefetched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaletrain.distributed.strategies.zero1 import partition_parameters
from scaletrain.errors import ConfigError

PLAN_STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")


@dataclass(frozen=True, slots=True)
class ParamInfo:
    shape: tuple[int, ...]
    unit: int            # index of the FSDP unit (block) holding it; -1: the root

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(slots=True)
class ModelState:
    params: int                 # parameter count (all of the model, not per device)
    param_bytes: int            # resident parameter bytes per device
    grad_bytes: int
    optimizer_bytes: int
    gathered_param_bytes: int   # parameters all-gathered during the step (zero2, fsdp)


def shard_numel(shape: tuple[int, ...], devices: int) -> int:
    """Elements of FSDP2's largest (rank 0) shard of a tensor: ceil(d0 / N) rows."""
    if not shape:
        return 1
    return math.ceil(shape[0] / devices) * math.prod(shape[1:])


def optimizer_slots(optimizer: str, momentum: float) -> int:
    """Parameter-sized state tensors per parameter."""
    if optimizer == "adamw":
        return 2
    if optimizer == "sgd":
        return 1 if momentum > 0 else 0
    raise ConfigError(f"unknown optimizer '{optimizer}'; choose one of: sgd, adamw")


def model_state(params: list[ParamInfo], strategy: str, devices: int, storage_bytes: int, compute_bytes: int,
                optimizer: str = "adamw", momentum: float = 0.9) -> ModelState:
    """Per-device model-state bytes; the device that holds the most is the one reported."""
    if strategy not in PLAN_STRATEGIES:
        raise ConfigError(f"unknown strategy '{strategy}'; choose one of: {', '.join(PLAN_STRATEGIES)}")
    if devices < 1:
        raise ConfigError(f"--devices must be at least 1 (got {devices})")
    slots = optimizer_slots(optimizer, momentum)
    step_bytes = 4 if optimizer == "adamw" else 0
    total = sum(p.numel for p in params)
    if strategy in ("ddp", "zero1"):
        param_bytes = grad_bytes = total * storage_bytes
        if strategy == "ddp":
            owned = list(range(len(params)))
        else:
            owners = partition_parameters([p.numel for p in params], devices)
            loads = [sum(params[i].numel for i in range(len(params)) if owners[i] == r) for r in range(devices)]
            busiest = max(range(devices), key=lambda r: (loads[r], -r))
            owned = [i for i in range(len(params)) if owners[i] == busiest]
        owned_numel = sum(params[i].numel for i in owned)
        return ModelState(total, param_bytes, grad_bytes,
                          owned_numel * storage_bytes * slots + len(owned) * step_bytes, 0)
    shard = sum(shard_numel(p.shape, devices) for p in params)
    if strategy == "zero2":
        gathered = total * compute_bytes
    else:
        units: dict[int, int] = {}
        for p in params:
            units[p.unit] = units.get(p.unit, 0) + p.numel
        # The root's parameters stay gathered for the whole step; of the blocks, the one running
        # and the one prefetched (the two largest bound it).
        blocks = sorted((n for u, n in units.items() if u >= 0), reverse=True)
        gathered = (units.get(-1, 0) + sum(blocks[:2])) * compute_bytes
    return ModelState(total, shard * storage_bytes, shard * storage_bytes,
                      shard * storage_bytes * slots + len(params) * step_bytes, gathered)
