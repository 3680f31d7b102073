"""Preparing a model for training: the one place the model transforms are applied, in order.

    precision (storage dtype, float32 islands) -> activation checkpointing -> compile + strategy

Compilation is handed to the strategy rather than applied before it, because where it sits is
the strategy's decision: DDP compiles its own wrapper, so Dynamo's DDPOptimizer can split the
graph at bucket boundaries and each bucket's all-reduce still overlaps the backward; FSDP
compiles the sharded module. The bare model stays a plain module (its state dict has no wrapper
prefixes); the forwards returned are what the step and evaluation call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from scaletrain.distributed.capabilities import CostBalancing
from scaletrain.distributed.strategies.base import Strategy
from scaletrain.files import keep_compiled_artifacts
from scaletrain.models.activation_checkpointing import apply_activation_checkpointing
from scaletrain.precision import PrecisionPolicy
from scaletrain.training.preflight import layer_costs_of


@dataclass(slots=True)
class Parallelized:
    model: nn.Module                 # the bare module: owns the parameters
    train_forward: Callable          # what the training step calls (wrapped and/or compiled)
    eval_forward: Callable           # what evaluation calls (never a wrapper that syncs gradients)
    checkpointed_blocks: list[nn.Module]


def parallelize(model: nn.Module, cfg, strategy: Strategy, policy: PrecisionPolicy,
                per_replica_batch: int | None = None, channels_last: bool = False) -> Parallelized:
    """Applies `cfg`'s transforms to `model` for `strategy` (already set up: its device is known).
    `per_replica_batch`: what a strategy that cuts the model by cost measures the layers at;
    `channels_last`: the memory format settled for this device and model (defaults.py)."""
    if isinstance(strategy, CostBalancing):
        micro = strategy.costed_micro_batch(per_replica_batch or cfg.batch_size)
        if micro:
            strategy.balance_by(layer_costs_of(cfg, micro))
    model = policy.convert_module(model, cfg.precision.fp32_modules, options=cfg.precision,
                                  gathered=strategy.zero_stage >= 2).to(strategy.device)
    if channels_last:   # 4-D weights only; a convolution given NHWC weights computes in NHWC
        model = model.to(memory_format=torch.channels_last)
    blocks = (apply_activation_checkpointing(model, cfg.memory.block_classes)
              if cfg.memory.activation_checkpointing else [])
    if cfg.compile:    # (the CLI and run_training said it first: torch may ask for the folder early)
        keep_compiled_artifacts()
    compile_fn = (lambda m: torch.compile(m, mode=cfg.compile_mode)) if cfg.compile else (lambda m: m)
    train_forward, eval_forward = strategy.wrap(model, compile_fn, cfg.memory.block_classes, policy)
    return Parallelized(model, train_forward, eval_forward, blocks)

