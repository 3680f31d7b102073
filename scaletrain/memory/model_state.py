"""Bytes per device of parameters, gradients and optimizer state, as scaletrain lays them out.

Under autocast (bf16-/fp16-mixed) weights and gradients stay float32: with AdamW that is
4 + 4 + 8 = 16 bytes per parameter on every DDP replica, the ZeRO paper's 16 Psi (its fp16 copy
of the weights is, here, autocast's per-op cast: counted with the activations). bf16-true stores
everything in bf16 (2 + 2 + 4); SGD keeps one momentum buffer (none without momentum). AdamW
(fused) adds one float32 `step` scalar per parameter tensor it updates.

How each strategy shards that state is the strategy's own statement (`Strategy.model_state`,
beside the code that does the sharding): ddp replicates; zero1 shards optimizer state by the
strategy's own partition; zero2 and fsdp shard everything on dim 0 and gather the compute-dtype
parameters during the step.
"""

from __future__ import annotations

from scaletrain.distributed import STRATEGIES, plannable_strategies
from scaletrain.distributed.state_bytes import ModelState, ParamInfo, StateBytes, shard_numel
from scaletrain.errors import ConfigError

__all__ = ["PLAN_STRATEGIES", "ModelState", "ParamInfo", "model_state", "optimizer_slots", "shard_numel"]

PLAN_STRATEGIES = plannable_strategies()


def optimizer_slots(optimizer: str, momentum: float) -> int:
    """Parameter-sized state tensors per parameter."""
    if optimizer == "adamw":
        return 2
    if optimizer == "sgd":
        return 1 if momentum > 0 else 0
    raise ConfigError(f"unknown optimizer '{optimizer}'; choose one of: sgd, adamw")


def model_state(params: list[ParamInfo], strategy: str, devices: int, storage_bytes: int, compute_bytes: int,
                optimizer: str = "adamw", momentum: float = 0.9, distributed=None) -> ModelState:
    """Per-device model-state bytes; the device that holds the most is the one reported.
    `distributed`: the DistributedConfig whose strategy options apply (None: their defaults)."""
    if strategy not in PLAN_STRATEGIES:
        raise ConfigError(f"unknown strategy '{strategy}'; choose one of: {', '.join(PLAN_STRATEGIES)}")
    if devices < 1:
        raise ConfigError(f"--devices must be at least 1 (got {devices})")
    sizes = StateBytes(storage=storage_bytes, compute=compute_bytes,
                       optimizer_slots=optimizer_slots(optimizer, momentum),
                       step_bytes=4 if optimizer == "adamw" else 0)
    return STRATEGIES[strategy].model_state(params, devices, sizes, distributed)
